"""One owned shard's firing state: its wheel, and the three frontiers that bound its cursor.

Everything here runs on the dispatcher's fire loop, one thread, with no I/O; the loop
does the reads and writes and feeds the results in. A shard's cursor `fired_through`
promises that every acknowledged task with `run_at <= fired_through` was published, so
the cursor written to the store is the least of three frontiers:

- `flushed_through_ms`: the wheel fired through here and the queue acknowledged it;
- `loaded_through_ms`: every bucket up to here was read from the store (a bucket read
  late only delays its tasks: they enter the wheel overdue and fire at once);
- `verified_through_ms`: every one-second slice up to here was re-counted in the store
  just before it fell due, and read again if the store held rows the shard had not
  seen (a write that landed after its bucket was read and never reached the hand-off).

Rows seen per slice are counted whether they fire or not (cancelled, finished), and a
task is counted once however often it arrives (read, handed off, read again), so a
store count above the seen count means exactly "a row is missing here".

A slice is not fired before it is verified, unless its verification is later than
`verify_grace_ms` past the slice's end: then it fires anyway (on time matters more than
the rare merge), and the cursor still waits for the verification.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from scheduler.model import BUCKET_MS, MESSAGE_ID_SLICE, Partition, Priority, Task, encode_message, minute_bucket
from scheduler.ports import Lease, StoredTask, TaskStatus
from scheduler.wheel import TimingWheel

log = logging.getLogger(__name__)

SLICE_MS = 1000
"""Width of the slices re-counted just ahead of the cursor; divides `BUCKET_MS`."""

LONG_TAG = 3
"""Wheel tag of the `long` ready topic; priorities use their codes 0, 1, 2."""

CANCEL_MEMORY_MS = 3 * BUCKET_MS
"""How long after its run_at a handed-off cancel is remembered (cancels of retry copies,
due later, are the worker's to honour: it checks the task's home row)."""


def slice_of(run_at_ms: int) -> int:
    return run_at_ms // SLICE_MS


def tag_for(task: Task, long_types: frozenset[str]) -> int:
    return LONG_TAG if task.type in long_types else task.priority.code


def should_fire(stored: StoredTask) -> bool:
    """A row fires unless it is finished, or some report already covers its attempt (it
    was fired before, by a previous owner whose cursor lagged)."""
    if stored.status is TaskStatus.SCHEDULED:
        return True
    if stored.status.finished:
        return False
    return stored.status_attempt < stored.task.attempt


@dataclass
class Row:
    """A row read from the store, reduced to what the wheel needs; `message` is None for
    a row that must not fire (it still counts as seen)."""

    run_at_ms: int
    id: bytes
    tag: int
    message: bytes | None


def rows_from(stored: Iterable[StoredTask], token: int, long_types: frozenset[str]) -> list[Row]:
    rows = []
    for item in stored:
        task = item.task
        message = encode_message(task, token) if should_fire(item) else None
        rows.append(Row(task.run_at_ms, task.id.bytes, tag_for(task, long_types), message))
    return rows


@dataclass
class FireBatch:
    """What one shard fired in one pass: values per tag, and the wheel's frontier after."""

    by_tag: dict[int, list[bytes]]
    fired_through_ms: int
    count: int
    skipped_cancelled: int


@dataclass
class OwnedShard:
    shard: int
    lease: Lease
    start_ms: int
    """The cursor when the shard was taken: everything at or before it was fired before."""
    shard_count: int
    long_types: frozenset[str] = frozenset()
    tick_ms: int = 100
    verify_grace_ms: int = 1000
    wheel: TimingWheel = field(init=False)
    flushed_through_ms: int = field(init=False)
    loaded_through_ms: int = field(init=False)
    verified_through_ms: int = field(init=False)
    persisted_ms: int = field(init=False)
    requested_buckets: set[int] = field(default_factory=set)
    """Buckets whose read has been asked for (in progress or done)."""
    completed_buckets: set[int] = field(default_factory=set)
    seen: dict[int, int] = field(default_factory=lambda: defaultdict(int))
    """slice -> rows known in it."""
    known: dict[int, set[bytes]] = field(default_factory=lambda: defaultdict(set))
    """bucket -> ids that arrived by hand-off or slice re-read, so the bucket's own read
    (or a replayed hand-off) does not count or fire them twice. Ids of the bulk read are
    not kept here (that would cost memory per task); a hand-off after them looks in the
    wheel's slot instead."""
    cancelled: dict[bytes, int] = field(default_factory=dict)
    """id -> run_at of handed-off cancels."""
    counting: set[int] = field(default_factory=set)
    """Slices whose count (or re-read) is in flight."""
    verified_slices: set[int] = field(default_factory=set)

    def __post_init__(self) -> None:
        if SLICE_MS % self.tick_ms:
            raise ValueError(f"tick_ms must divide {SLICE_MS}, got {self.tick_ms}")
        self.wheel = TimingWheel(start_ms=self.start_ms + 1, tick_ms=self.tick_ms)
        self.flushed_through_ms = self.start_ms
        self.persisted_ms = self.start_ms
        self.loaded_through_ms = self.start_ms
        self.verified_through_ms = self.start_ms

    @property
    def token(self) -> int:
        return self.lease.token

    def partition(self, bucket: int) -> Partition:
        return Partition(bucket, self.shard)

    # Reads to ask for.

    def buckets_to_load(self, now_ms: int, lookahead_ms: int) -> list[int]:
        """Buckets not yet asked for from the cursor's bucket through the one holding
        `now + lookahead`, oldest first (a shard taken late catches up bucket by bucket)."""
        first = minute_bucket(self.start_ms + 1)
        last = minute_bucket(max(now_ms, self.start_ms + 1) + lookahead_ms)
        return [b for b in range(first, last + 1, BUCKET_MS) if b not in self.requested_buckets]

    def slices_to_verify(self, now_ms: int, lead_ms: int) -> list[int]:
        """Slices from the verified frontier whose start is within `lead_ms` of now and whose
        bucket has been read, not yet counted or in flight."""
        slices: list[int] = []
        k = slice_of(self.verified_through_ms + 1)
        while k * SLICE_MS <= now_ms + lead_ms and len(slices) < 200:
            if minute_bucket(k * SLICE_MS) not in self.completed_buckets:
                break
            if k not in self.verified_slices and k not in self.counting:
                slices.append(k)
            k += 1
        return slices

    def count_range(self, k: int) -> tuple[int, int]:
        """The store range `(after, through]` that slice `k` covers for this shard."""
        return max(k * SLICE_MS - 1, self.start_ms), k * SLICE_MS + SLICE_MS - 1

    # Results coming in.

    def add_rows(self, rows: Iterable[Row], *, from_bulk: bool) -> int:
        """Merge rows read from the store; returns how many entered the wheel. Bulk rows
        skip ids that arrived by other paths; re-read rows also skip ids the wheel holds."""
        added = 0
        wheel = self.wheel
        known = self.known
        for row in rows:
            if row.run_at_ms <= self.start_ms:
                continue
            ids = known.get(minute_bucket(row.run_at_ms))
            if ids is not None and row.id in ids:
                continue
            if not from_bulk:
                if self._in_wheel(row):
                    continue
                known[minute_bucket(row.run_at_ms)].add(row.id)
            elif row.run_at_ms <= wheel.fired_through_ms:
                known[minute_bucket(row.run_at_ms)].add(row.id)  # overdue: a late hand-off must not repeat it
            self.seen[slice_of(row.run_at_ms)] += 1
            if row.message is not None:
                wheel.add(row.run_at_ms, row.tag, row.message)
                added += 1
        return added

    def bucket_loaded(self, bucket: int, read_started_ms: int) -> None:
        """The bucket's read is complete. Its slices that were already past when the read
        began need no re-count: a task written into the past after that goes through the
        hand-off (it is due), and the read itself is fresher than a count would be."""
        self.completed_buckets.add(bucket)
        k = slice_of(bucket)
        while k < slice_of(bucket + BUCKET_MS) and (k + 1) * SLICE_MS - 1 < read_started_ms:
            self._slice_verified(k)
            k += 1
        through = self.loaded_through_ms
        while minute_bucket(through + 1) in self.completed_buckets:
            through = minute_bucket(through + 1) + BUCKET_MS - 1
        self.loaded_through_ms = through

    def slice_counted(self, k: int, stored: int) -> bool:
        """Take the store's count of slice `k`; True if the slice must be read again."""
        self.counting.discard(k)
        if stored > self.seen.get(k, 0):
            self.counting.add(k)  # stays in flight until the re-read is merged
            return True
        self._slice_verified(k)
        return False

    def slice_reread(self, k: int, rows: Iterable[Row]) -> int:
        added = self.add_rows(rows, from_bulk=False)
        self.counting.discard(k)
        self._slice_verified(k)
        return added

    def _slice_verified(self, k: int) -> None:
        self.verified_slices.add(k)
        while slice_of(self.verified_through_ms + 1) in self.verified_slices:
            self.verified_through_ms = (slice_of(self.verified_through_ms + 1) + 1) * SLICE_MS - 1

    def handed_task(self, task: Task) -> bool:
        """Merge a handed-off task; True if it entered the wheel. Ignored when its bucket
        has not been asked for yet (that read will find it); fired at once if overdue."""
        bucket = minute_bucket(task.run_at_ms)
        if task.run_at_ms > self.start_ms and bucket not in self.requested_buckets:
            return False
        ids = self.known[bucket]
        row = Row(task.run_at_ms, task.id.bytes, tag_for(task, self.long_types), None)
        if row.id in ids or (task.run_at_ms > self.wheel.fired_through_ms and self._in_wheel(row)):
            return False
        ids.add(row.id)
        self.seen[slice_of(task.run_at_ms)] += 1
        self.wheel.add(task.run_at_ms, row.tag, encode_message(task, self.token))
        return True

    def handed_cancel(self, task_id: bytes, run_at_ms: int) -> None:
        self.cancelled[task_id] = run_at_ms

    def _in_wheel(self, row: Row) -> bool:
        return any(item[MESSAGE_ID_SLICE] == row.id for _, _, item in self.wheel.items_in_slot(row.run_at_ms))

    # Firing.

    def fire(self, now_ms: int) -> FireBatch:
        """Take what is due from the wheel, never past a slice still being verified
        (within its grace), and drop what was cancelled."""
        entries = self.wheel.poll(self.fire_limit(now_ms))
        by_tag: dict[int, list[bytes]] = {}
        skipped = 0
        cancelled = self.cancelled
        for _, tag, item in entries:
            if cancelled and item[MESSAGE_ID_SLICE] in cancelled:
                skipped += 1
                continue
            values = by_tag.get(tag)
            if values is None:
                values = by_tag[tag] = []
            values.append(item)
        return FireBatch(by_tag, self.wheel.fired_through_ms, len(entries) - skipped, skipped)

    def fire_limit(self, now_ms: int) -> int:
        """How far the wheel may fire at `now_ms`: up to the first slice that is neither
        verified nor more than `verify_grace_ms` past its end."""
        k = slice_of(self.verified_through_ms + 1)
        while k * SLICE_MS <= now_ms:
            if k not in self.verified_slices and now_ms <= (k + 1) * SLICE_MS - 1 + self.verify_grace_ms:
                return max(k * SLICE_MS - 1, self.wheel.fired_through_ms)
            k += 1
        return now_ms

    def flushed(self, batch: FireBatch) -> None:
        """The queue acknowledged `batch`: move the flushed frontier and forget what is old."""
        self.flushed_through_ms = max(self.flushed_through_ms, batch.fired_through_ms)
        horizon = self.flushed_through_ms - CANCEL_MEMORY_MS
        if self.cancelled and len(self.cancelled) > 1000:
            self.cancelled = {key: at for key, at in self.cancelled.items() if at > horizon}
        for bucket in [b for b in self.known if b + 2 * BUCKET_MS <= self.flushed_through_ms]:
            del self.known[bucket]
        old_slices = [k for k in self.seen if (k + 1) * SLICE_MS + BUCKET_MS <= self.verified_through_ms]
        for k in old_slices:
            del self.seen[k]
            self.verified_slices.discard(k)

    def cursor_candidate(self) -> int:
        """How far the store's cursor may move now."""
        return min(self.flushed_through_ms, self.loaded_through_ms, self.verified_through_ms)

    def summary(self) -> dict[str, int]:
        return {
            "token": self.token,
            "waiting": len(self.wheel),
            "wheel_bytes": self.wheel.nbytes,
            "flushed_through_ms": self.flushed_through_ms,
            "loaded_through_ms": self.loaded_through_ms,
            "verified_through_ms": self.verified_through_ms,
            "persisted_ms": self.persisted_ms,
        }


def topic_tags(topics: dict[str, str]) -> dict[int, str]:
    """Wheel tag -> ready topic name, from `{short name: topic}` for high, normal, low, long."""
    return {Priority.HIGH.code: topics["high"], Priority.NORMAL.code: topics["normal"],
            Priority.LOW.code: topics["low"], LONG_TAG: topics["long"]}
