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

A task may reach the wheel twice (read from the store, and handed off); both copies
share a run_at, hence a slot, and the second is dropped when the slot fires. Rows are
told apart by `(id, run_at)`, since a retry is the same id at a later run_at. To count a
slice exactly, the shard counts the distinct rows its wheel holds for it when the count
is asked for, plus the rows that were read but must not fire (finished, already
reported) and those fired before the slice was verified; a store count above that is
exactly "a row is missing here". The re-read merges rows by the same key.

A slice is not fired before it is verified, unless its verification is later than
`verify_grace_ms` past the slice's end: then it fires anyway (on time matters more than
the rare merge), and the cursor still waits for the verification.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field

from scheduler.fairness.gate import Waiting
from scheduler.model import BUCKET_MS, MESSAGE_ID_SLICE, Partition, Priority, Task, encode_message, minute_bucket
from scheduler.ports import Lease, StoredTask, TaskStatus
from scheduler.wheel import Entry, TimingWheel

log = logging.getLogger(__name__)

SLICE_MS = 1000
"""Width of the slices re-counted just ahead of the cursor; divides `BUCKET_MS`."""

LONG_TAG = 3
"""Wheel tag of the `long` ready topic; priorities use their codes 0, 1, 2."""

CANCEL_MEMORY_MS = 3 * BUCKET_MS
"""How long after its run_at a handed-off cancel is remembered (cancels of retry copies,
due later, are the worker's to honour: it checks the task's home row)."""


Key = tuple[int, bytes]
"""A row: `(run_at_ms, id bytes)`; a retry copy is the same id at a later run_at."""


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
    duplicates: int = 0
    gated: list[Entry] | None = None
    """With a release gate: the due entries, for the gate to admit (`by_tag` is empty)."""
    released: list[Waiting] | None = None
    """For a batch the gate let out: what to settle with it once the queue acknowledged."""
    released_at_ms: int | None = None
    """...and the moment it was let out, which its messages are stamped with."""


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
    max_loading_buckets: int = 2
    """Bucket reads in flight at once, so a shard far behind catches up in order."""
    wheel: TimingWheel = field(init=False)
    flushed_through_ms: int = field(init=False)
    loaded_through_ms: int = field(init=False)
    verified_through_ms: int = field(init=False)
    persisted_ms: int = field(init=False)
    requested_buckets: set[int] = field(default_factory=set)
    """Buckets at or after the loaded frontier whose read has been asked for."""
    completed_buckets: set[int] = field(default_factory=set)
    skipped: dict[int, set[Key]] = field(default_factory=dict)
    """slice -> rows read that must not fire; they count as seen until it is verified."""
    fired_early: dict[int, set[Key]] = field(default_factory=dict)
    """slice -> rows fired before the slice was verified (past its grace)."""
    counting: dict[int, int] = field(default_factory=dict)
    """slice -> rows seen when its count was asked for (the count or re-read in flight)."""
    verified_slices: set[int] = field(default_factory=set)
    """Verified slices beyond the verified frontier."""
    cancelled: dict[bytes, int] = field(default_factory=dict)
    """id -> run_at of handed-off cancels."""
    verify_retry_at_ms: int = 0
    load_retry_at_ms: int = 0
    posted_through: dict[int, int] = field(default_factory=dict)
    """bucket -> the run_at through which its rows have reached the wheel, so a read that
    failed part-way resumes after them instead of sending them again."""
    cancels_pruned_at_ms: int = 0

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
        """Buckets to read next: the current and the next one at once (whatever else is
        in flight), then, oldest first, the ones from the loaded frontier on, at most
        `max_loading_buckets` of those in flight, so a shard far behind catches up in order
        while what is due now still fires."""
        if now_ms < self.load_retry_at_ms:
            return []
        wanted: list[int] = []
        now_bucket = minute_bucket(max(now_ms, self.start_ms + 1))
        last = minute_bucket(max(now_ms, self.start_ms + 1) + lookahead_ms)
        for bucket in range(now_bucket, last + 1, BUCKET_MS):
            if bucket not in self.requested_buckets and bucket + BUCKET_MS - 1 > self.loaded_through_ms:
                wanted.append(bucket)
        in_flight = len(self.requested_buckets - self.completed_buckets) + len(wanted)
        bucket = minute_bucket(self.loaded_through_ms + 1)
        while bucket < now_bucket and in_flight < self.max_loading_buckets:
            if bucket not in self.requested_buckets:
                wanted.append(bucket)
                in_flight += 1
            bucket += BUCKET_MS
        return wanted

    def slices_to_verify(self, now_ms: int, lead_ms: int) -> list[int]:
        """Slices to re-count: not verified nor in flight, in a bucket already read, and
        starting within `lead_ms` of now. Walks only the read stretch after the verified
        frontier and the buckets read ahead of it, never the whole lag."""
        slices: list[int] = []
        if now_ms < self.verify_retry_at_ms:
            return slices
        horizon = slice_of(now_ms + lead_ms)

        def scan(first: int, last: int) -> None:
            k = first
            while k <= min(last, horizon) and len(slices) < 200:
                if k not in self.verified_slices and k not in self.counting:
                    slices.append(k)
                k += 1

        scan(slice_of(self.verified_through_ms + 1), slice_of(self.loaded_through_ms + 1) - 1)
        for bucket in sorted(self.completed_buckets):
            if bucket > self.loaded_through_ms:
                scan(max(slice_of(bucket), slice_of(self.start_ms + 1)), slice_of(bucket + BUCKET_MS) - 1)
        return slices

    def count_range(self, k: int) -> tuple[int, int]:
        """The store range `(after, through]` that slice `k` covers for this shard."""
        return max(k * SLICE_MS - 1, self.start_ms), k * SLICE_MS + SLICE_MS - 1

    def slice_keys(self, k: int) -> set[Key]:
        """Every row of slice `k` the shard knows of: waiting in the wheel, read but not to
        fire, or fired before the slice was verified. O(rows of the slice)."""
        after, through = self.count_range(k)
        keys: set[Key] = set(self.skipped.get(k, ()))
        keys.update(self.fired_early.get(k, ()))
        wheel = self.wheel
        slot_start = (after + 1) - (after + 1) % self.tick_ms
        starts = [wheel.fired_through_ms] if slot_start <= wheel.fired_through_ms else []
        starts += range(max(slot_start, wheel.fired_through_ms + 1), through + 1, self.tick_ms)
        for at in starts:
            for run_at, _, item in wheel.items_in_slot(at):
                if after < run_at <= through:
                    keys.add((run_at, item[MESSAGE_ID_SLICE]))
        return keys

    def ask_count(self, k: int) -> None:
        self.counting[k] = len(self.slice_keys(k))

    # Results coming in.

    def add_rows(self, rows: Iterable[Row]) -> int:
        """Add rows read from the store; returns how many entered the wheel."""
        added = 0
        wheel = self.wheel
        start = self.start_ms
        for row in rows:
            if row.run_at_ms <= start:
                continue
            if row.message is not None:
                wheel.add(row.run_at_ms, row.tag, row.message)
                added += 1
            else:
                self.skipped.setdefault(slice_of(row.run_at_ms), set()).add((row.run_at_ms, row.id))
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
        done = {b for b in self.completed_buckets if b + BUCKET_MS - 1 <= through}
        self.completed_buckets -= done
        self.requested_buckets -= done
        self.posted_through.pop(bucket, None)

    def rows_posted(self, bucket: int, through_ms: int) -> None:
        self.posted_through[bucket] = max(self.posted_through.get(bucket, through_ms), through_ms)

    def resume_after(self, bucket: int) -> int:
        """Where a read of `bucket` starts (exclusive)."""
        return max(self.start_ms, bucket - 1, self.posted_through.get(bucket, bucket - 1))

    def bucket_failed(self, bucket: int, retry_at_ms: int) -> None:
        """The read gave up: ask for it again, from where it stopped, after `retry_at_ms`."""
        self.requested_buckets.discard(bucket)
        self.load_retry_at_ms = retry_at_ms

    def slice_counted(self, k: int, stored: int) -> bool:
        """Take the store's count of slice `k`; True if the slice must be read again."""
        seen = self.counting.get(k)
        if seen is None:
            return False
        if stored > seen:
            return True  # stays in `counting` until the re-read is merged
        del self.counting[k]
        self._slice_verified(k)
        return False

    def slice_failed(self, k: int, retry_at_ms: int) -> None:
        self.counting.pop(k, None)
        self.verify_retry_at_ms = retry_at_ms

    def slice_reread(self, k: int, rows: Iterable[Row]) -> int:
        """Merge the rows of a re-read slice that the shard has not seen; returns how many
        entered the wheel."""
        keys = self.slice_keys(k)
        fresh = [row for row in rows if (row.run_at_ms, row.id) not in keys]
        added = self.add_rows(fresh)
        self.counting.pop(k, None)
        self._slice_verified(k)
        return added

    def _slice_verified(self, k: int) -> None:
        self.skipped.pop(k, None)
        self.fired_early.pop(k, None)
        if k < slice_of(self.verified_through_ms + 1):
            return
        self.verified_slices.add(k)
        while slice_of(self.verified_through_ms + 1) in self.verified_slices:
            done = slice_of(self.verified_through_ms + 1)
            self.verified_slices.discard(done)
            self.verified_through_ms = (done + 1) * SLICE_MS - 1

    def handed_task(self, task: Task) -> bool:
        """Take a handed-off task; True if it entered the wheel. Ignored when its bucket
        has not been asked for yet (that read will find it); fired at once if overdue.
        A copy of a row already read is dropped when its slot fires."""
        if task.run_at_ms > self.start_ms and minute_bucket(task.run_at_ms) not in self.requested_buckets \
                and task.run_at_ms > self.loaded_through_ms:
            return False
        self.wheel.add(task.run_at_ms, tag_for(task, self.long_types), encode_message(task, self.token))
        return True

    def handed_cancel(self, task_id: bytes, run_at_ms: int) -> None:
        self.cancelled[task_id] = run_at_ms

    # Firing.

    def fire(self, now_ms: int, *, gated: bool = False) -> FireBatch:
        """Take what is due from the wheel, never past a slice still being verified
        (within its grace); drop second copies and what was cancelled. With `gated`, the
        entries are returned whole in `gated`, for the release gate, not by tag."""
        entries = self.wheel.poll(self.fire_limit(now_ms))
        by_tag: dict[int, list[bytes]] = {}
        skipped = duplicates = 0
        cancelled = self.cancelled
        verified_through = self.verified_through_ms
        seen: set[Key] = set()
        kept: list[Entry] | None = [] if gated else None
        for run_at, tag, item in entries:
            key = (run_at, item[MESSAGE_ID_SLICE])
            if key in seen:
                duplicates += 1
                continue
            seen.add(key)
            if run_at > verified_through and run_at > self.start_ms and slice_of(run_at) not in self.verified_slices:
                self.fired_early.setdefault(slice_of(run_at), set()).add(key)
            if cancelled and key[1] in cancelled:
                skipped += 1
                continue
            if kept is not None:
                kept.append((run_at, tag, item))
                continue
            values = by_tag.get(tag)
            if values is None:
                values = by_tag[tag] = []
            values.append(item)
        count = len(entries) - skipped - duplicates
        return FireBatch(by_tag, self.wheel.fired_through_ms, count, skipped, duplicates, kept)

    def fire_limit(self, now_ms: int) -> int:
        """How far the wheel may fire at `now_ms`: up to the first slice that is neither
        verified nor more than `verify_grace_ms` past its end."""
        # Slices that ended more than the grace ago may fire whatever their state: start after them.
        k = max(slice_of(self.verified_through_ms + 1), slice_of(now_ms - self.verify_grace_ms) - 1)
        while k * SLICE_MS <= now_ms:
            if k not in self.verified_slices and now_ms <= (k + 1) * SLICE_MS - 1 + self.verify_grace_ms:
                return max(k * SLICE_MS - 1, self.wheel.fired_through_ms)
            k += 1
        return now_ms

    def flushed(self, batch: FireBatch) -> None:
        """The queue acknowledged `batch`: move the flushed frontier and forget what is old."""
        self.flushed_through_ms = max(self.flushed_through_ms, batch.fired_through_ms)
        if len(self.cancelled) > 1000 and self.flushed_through_ms - self.cancels_pruned_at_ms > BUCKET_MS:
            self.cancels_pruned_at_ms = self.flushed_through_ms
            horizon = self.flushed_through_ms - CANCEL_MEMORY_MS
            self.cancelled = {key: at for key, at in self.cancelled.items() if at > horizon}

    def cursor_candidate(self) -> int:
        """How far the store's cursor may move now."""
        return min(self.flushed_through_ms, self.loaded_through_ms, self.verified_through_ms)


def topic_tags(topics: dict[str, str]) -> dict[int, str]:
    """Wheel tag -> ready topic name, from `{short name: topic}` for high, normal, low, long."""
    return {Priority.HIGH.code: topics["high"], Priority.NORMAL.code: topics["normal"],
            Priority.LOW.code: topics["low"], LONG_TAG: topics["long"]}
