"""One owned shard's firing state: its wheel, what it has handled, and the frontiers that
bound its cursor.

Everything here runs on the dispatcher's fire loop, one thread, with no I/O; the loop
does the reads and writes and feeds the results in (`scheduler.dispatcher.runtime`).

The promise, and who keeps it
-----------------------------
A row in the store is a promise, whoever wrote it (this SDK with or without a hand-off,
another language, a bulk load, a CQL INSERT): it fires, never before its time, late
rather than never. A row can land anywhere relative to the shard's progress, so three
looks cover the three places it can land:

- **ahead** of what was read: the bucket read a minute ahead finds it;
- **read already, not yet due**: each one-second slice is counted again in the store
  `verify_lead_ms` before it falls due (the *verify*), and read again if the store holds
  more rows than the shard knows of;
- **already due or fired** (written late, or into the past): each slice is counted once
  more `second_look_ms` after it ended, or after its bucket was read if that was later
  (the *second look*), and read again when the count differs; behind that, the *sweep*:
  every `sweep_interval_ms` the last `RECENT_SWEEP_MS` (90 s) behind the cursor is
  counted, and every `FULL_SWEEP_EVERY`-th time the whole look-back horizon
  (`horizon_ms`), bucket by bucket, each against what the shard has handled there; a
  bucket whose count differs is read again (over what the sweep counted). What a second
  look or a sweep finds fires at once.

So a row acknowledged at W with `run_at` R fires by

- max(R, W) + about `second_look_ms` + one second, when W is before R's second look;
- W + `sweep_interval_ms` (and a read), when R is within the last 90 s behind the
  cursor at the next sweep, i.e. R later than about W - 70 s with the defaults;
- W + `FULL_SWEEP_EVERY` x `sweep_interval_ms` (two minutes), when R is within the
  horizon (ten minutes).

The cost is counts, rows counted in the store (about 2 µs of Cassandra CPU a row):
every row is counted once before it fires, once by its second look, about
90 s / `sweep_interval_ms` times by recent sweeps and about horizon / (six intervals)
times by full ones: 11 or so with the defaults, against ~47 µs to write it. Requests:
two per shard per second (a slice's verify and its second look) and one per shard per
sweep. Rows are read again only where a count differs.

The record of what was handled
------------------------------
`seen` (`SeenRecord`) keeps the key `(run_at, id)` of every row the shard has handled in
the horizon: fired (to the queue or into the release gate), read as not to fire, or
dead-lettered as unreadable. It is the expected side of every count, the filter of every
re-read (only rows not in it are new), and the memory that keeps a late copy of a row
already fired (a hand-off replayed after a take-over, a re-read) from being published
again: an entry that entered the wheel behind its frontier is looked up before it fires.

The cursor
----------
`fired_through`, the cursor written to the store, promises that every row at or before
it was handled, as the store held it at the shard's last look; it is the least of

- `loaded_through_ms`, `verified_through_ms`: read, and counted before firing;
- `flushed_through_ms`: the wheel fired through here and the queue acknowledged it;
- the earliest `run_at` of any batch fired and not yet acknowledged, and of anything
  that entered the wheel behind its frontier and has not fired yet (a late load, a
  hand-off into the past, what a look found): the cursor never passes a task the queue
  has not acknowledged, whatever path brought it.

With the cursor the owner writes `baselines`: for each bucket of the horizon, how many
of its rows at or before the cursor it has handled. A new owner starts at the cursor and
sweeps the buckets behind it against those counts; a bucket that holds more is read
again and its rows that still need firing are fired (a late row, and possibly repeats of
rows the old owner fired that no worker has reported on yet: duplicates, never loss).
That is why the cursor need not wait for the second look: what a look of the old owner
would have found, the next owner's sweep finds, and a shard handed over in a rebalance
is not fired twice for the second or so the looks lag. A task handed in behind the
persisted cursor (into the past) holds the cursor's advance until the queue acknowledged
it, since the cursor cannot move back below it.

Firing at each task's time
--------------------------
The wheel's slots are `tick_ms` wide, and a slot would fire only once it has passed, up
to a tick late. Instead `fire` takes a slot as soon as it begins (`TimingWheel.poll_started`)
and holds its entries in `soon`, in `run_at` order; each pass fires those whose `run_at`
has come, never one before. `fired_through_ms` is then the moment of the last pass (or
the fire limit), not the end of a slot, and an entry added into the slot under way (a
hand-off, a re-read) waits in `soon` with the others; one added at or before
`fired_through_ms` goes into the wheel's overdue list and fires at the next pass. What
waits in `soon` is treated as in the wheel: a verify or look counts it, a cancel or a
copy already handled drops it when it fires, the cursor stays at or before the last pass.

A slice is not fired before it is verified, unless its verification is later than
`verify_grace_ms` past the slice's end: then it fires anyway (on time matters more than
the rare merge), and the cursor still waits for the verification.
"""

from __future__ import annotations

import logging
from bisect import bisect_right, insort_right
from collections.abc import Iterable
from dataclasses import dataclass, field
from operator import itemgetter

from scheduler.dispatcher.rows import SLICE_MS, FireBatch, Row, Sweep, slice_end, slice_of, tag_for
from scheduler.dispatcher.seen import Key, SeenRecord, pack
from scheduler.model import BUCKET_MS, MESSAGE_ID_SLICE, Partition, Task, encode_message, minute_bucket
from scheduler.ports import Lease
from scheduler.visibility.labels import TypeLabels
from scheduler.wheel import Entry, TimingWheel

log = logging.getLogger(__name__)

CANCEL_MEMORY_MS = 3 * BUCKET_MS
"""How long after its run_at a handed-off cancel is remembered (cancels of retry copies,
due later, are the worker's to honour: it checks the task's home row)."""

DEFAULT_HORIZON_MS = 10 * BUCKET_MS
"""How far back the full sweep looks for rows written late (see the module docstring)."""

RECENT_SWEEP_MS = 90_000
"""How far behind the cursor a recent sweep counts."""

FULL_SWEEP_EVERY = 6
"""Every this many sweeps, one counts the whole horizon (the others, `RECENT_SWEEP_MS`)."""

_run_at = itemgetter(0)

__all__ = ["CANCEL_MEMORY_MS", "DEFAULT_HORIZON_MS", "FULL_SWEEP_EVERY", "OwnedShard", "RECENT_SWEEP_MS"]


@dataclass
class OwnedShard:
    shard: int
    lease: Lease
    start_ms: int
    """The cursor when the shard was taken: everything at or before it was handled before,
    as `inherited` counts it."""
    shard_count: int
    long_types: frozenset[str] = frozenset()
    type_labels: TypeLabels | None = None
    """The dispatcher's labelled task types, whose slots go into the wheel tags."""
    tick_ms: int = 100
    verify_grace_ms: int = 1000
    max_loading_buckets: int = 2
    """Bucket reads in flight at once, so a shard far behind catches up in order."""
    second_look_ms: int = 1000
    sweep_interval_ms: int = 20_000
    horizon_ms: int = DEFAULT_HORIZON_MS
    inherited: dict[int, int] | None = None
    """The baselines read with the cursor: bucket -> rows at or before it handled by the
    previous owners. None when the store records none (a shard advanced by a version
    without them): every bucket behind the cursor is then unknown."""
    never_fired: bool = False
    """Nobody ever held the shard (the store records no cursor): nothing at or before the
    start was handled, so every bucket behind it counts from zero (a row found there fires)."""
    wheel: TimingWheel = field(init=False)
    fired_through_ms: int = field(init=False)
    """Every entry at or before this has been taken and handled (fired, or dropped as a
    copy or cancelled). The wheel hands out a slot as soon as it begins, so its own
    frontier is up to a slot ahead of this one: what lies in between waits in `soon`."""
    soon: list[Entry] = field(default_factory=list)
    """Entries taken from the wheel and not due yet, in `run_at` order (equal times in
    the order they came), all after `fired_through_ms` and at or before the wheel's
    frontier: at most one slot's worth. Each fires at the first pass at or after its
    `run_at`, so a task fires at its own millisecond, not at the end of its slot."""
    flushed_through_ms: int = field(init=False)
    loaded_through_ms: int = field(init=False)
    verified_through_ms: int = field(init=False)
    looked_through_ms: int = field(init=False)
    persisted_ms: int = field(init=False)
    requested_buckets: set[int] = field(default_factory=set)
    """Buckets at or after the loaded frontier whose read has been asked for (a failed read
    stays here, so a hand-off for it is still taken, and is asked for again)."""
    failed_buckets: set[int] = field(default_factory=set)
    completed_buckets: set[int] = field(default_factory=set)
    read_at_ms: dict[int, int] = field(default_factory=dict)
    """bucket -> when its read began: its slices' second looks come after that."""
    seen: SeenRecord = field(default_factory=SeenRecord)
    unfired_slices: set[int] = field(default_factory=set)
    """Slices with rows read as not to fire: every entry of theirs is looked up when it
    fires, so that the record never holds a row twice (its counts are exact)."""
    baseline: dict[int, int | None] = field(default_factory=dict)
    """bucket -> rows at or before `start_ms` handled (None: unknown); see `expected`."""
    counting: dict[int, int] = field(default_factory=dict)
    """slice -> rows known when its verify count was asked for (the count or re-read in flight)."""
    verified_slices: set[int] = field(default_factory=set)
    """Verified slices beyond the verified frontier."""
    looking: dict[int, int] = field(default_factory=dict)
    """slice -> rows known when its second look was asked for."""
    looked_slices: set[int] = field(default_factory=set)
    cancelled: dict[bytes, int] = field(default_factory=dict)
    """id -> run_at of handed-off cancels."""
    verify_retry_at_ms: int = 0
    look_retry_at_ms: int = 0
    load_retry_at_ms: int = 0
    posted_through: dict[int, int] = field(default_factory=dict)
    """bucket -> the run_at through which its rows have reached the wheel, so a read that
    failed part-way resumes after them instead of sending them again."""
    cancels_pruned_at_ms: int = 0
    unacked: dict[int, int] = field(default_factory=dict)
    """floor run_at -> batches fired with that earliest run_at, not yet acknowledged."""
    overdue_floor_ms: int | None = None
    """The earliest run_at of what entered the wheel behind its frontier and has not fired."""
    dead: list[tuple[int, bytes, bytes]] = field(default_factory=list)
    """Unreadable rows to dead-letter: (run_at, packed key, dead letter)."""
    next_sweep_ms: int = 0
    sweeping: bool = False
    sweeps_to_full: int = 0
    """Recent sweeps before the next full one (the first sweep is full)."""

    def __post_init__(self) -> None:
        if SLICE_MS % self.tick_ms:
            raise ValueError(f"tick_ms must divide {SLICE_MS}, got {self.tick_ms}")
        self.persisted_ms = self.start_ms
        self.wheel = TimingWheel(start_ms=self.start_ms + 1, tick_ms=self.tick_ms)
        self.fired_through_ms = self.start_ms
        self.flushed_through_ms = self.start_ms
        self.loaded_through_ms = self.start_ms
        self.verified_through_ms = self.start_ms
        self.looked_through_ms = self.start_ms
        for bucket in range(minute_bucket(self.start_ms - self.horizon_ms), self.start_ms + 1, BUCKET_MS):
            if self.never_fired:
                self.baseline[bucket] = 0
            else:
                self.baseline[bucket] = None if self.inherited is None else self.inherited.get(bucket)
        # Shards spread their sweeps over the interval rather than all at once.
        self.next_sweep_ms = self.start_ms + (self.shard * 613) % max(self.sweep_interval_ms, 1)

    @property
    def token(self) -> int:
        return self.lease.token

    def partition(self, bucket: int) -> Partition:
        return Partition(bucket, self.shard)

    # Reads to ask for.

    def buckets_to_load(self, now_ms: int, lookahead_ms: int, *, ahead: bool = True) -> list[int]:
        """Buckets to read next: the current and the next one at once (whatever else is
        in flight), then, oldest first, the ones from the loaded frontier on, at most
        `max_loading_buckets` of those in flight, so a shard far behind catches up in order
        while what is due now still fires. Without `ahead`, the buckets not yet due are
        left for a later call (the reader bounds the reads ahead in flight), unless the
        shard is catching up, when it reads as it would with them. A read that failed is
        asked for again after `load_retry_at_ms`."""
        if now_ms < self.load_retry_at_ms:
            return []
        wanted: list[int] = []
        asked = self.requested_buckets
        failed = self.failed_buckets

        def wants(bucket: int) -> bool:
            return (bucket not in asked or bucket in failed) and bucket not in self.completed_buckets

        now_bucket = minute_bucket(max(now_ms, self.start_ms + 1))
        ahead = ahead or minute_bucket(self.loaded_through_ms + 1) < now_bucket
        last = minute_bucket(max(now_ms, self.start_ms + 1) + (lookahead_ms if ahead else 0))
        for bucket in range(now_bucket, last + 1, BUCKET_MS):
            if wants(bucket) and bucket + BUCKET_MS - 1 > self.loaded_through_ms:
                wanted.append(bucket)
        in_flight = len(asked - self.completed_buckets - failed) + len(wanted)
        bucket = minute_bucket(self.loaded_through_ms + 1)
        while bucket < now_bucket and in_flight < self.max_loading_buckets:
            if wants(bucket):
                wanted.append(bucket)
                in_flight += 1
            bucket += BUCKET_MS
        return wanted

    def read_asked(self, bucket: int) -> None:
        self.requested_buckets.add(bucket)
        self.failed_buckets.discard(bucket)

    def slices_to_verify(self, now_ms: int, lead_ms: int) -> list[int]:
        """Slices to count before they fire: not verified nor in flight, in a bucket
        already read, and starting within `lead_ms` of now. Walks only the read stretch
        after the verified frontier and the buckets read ahead of it, never the whole lag."""
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

    def slices_to_look(self, now_ms: int) -> list[int]:
        """Slices due for their second look: fired, read, and ended (or read, if that
        was later) at least `second_look_ms` ago; in order from the looked frontier."""
        slices: list[int] = []
        if now_ms < self.look_retry_at_ms:
            return slices
        k = slice_of(self.looked_through_ms + 1)
        fired_through = self.fired_through_ms
        while slice_end(k) <= fired_through and len(slices) < 200:
            bucket = minute_bucket(k * SLICE_MS)
            if slice_end(k) > self.loaded_through_ms and bucket not in self.completed_buckets:
                break  # not read yet
            if now_ms < max(slice_end(k), self.read_at_ms.get(bucket, 0)) + self.second_look_ms:
                break
            if k not in self.looked_slices and k not in self.looking:
                slices.append(k)
            k += 1
        return slices

    def count_range(self, k: int) -> tuple[int, int]:
        """The store range `(after, through]` that slice `k` covers for this shard."""
        return max(k * SLICE_MS - 1, self.start_ms), slice_end(k)

    def slice_keys(self, k: int) -> set[Key]:
        """Every row of slice `k` the shard knows of: handled, or waiting in the wheel.
        O(rows of the slice)."""
        after, through = self.count_range(k)
        keys = self.seen.keys(k)
        wheel = self.wheel
        slot_start = (after + 1) - (after + 1) % self.tick_ms
        starts = [wheel.fired_through_ms] if slot_start <= wheel.fired_through_ms else []
        starts += range(max(slot_start, wheel.fired_through_ms + 1), through + 1, self.tick_ms)
        for at in starts:
            for run_at, _, item in wheel.items_in_slot(at):
                if after < run_at <= through:
                    keys.add((run_at, item[MESSAGE_ID_SLICE]))
        for run_at, _, item in self.soon:
            if after < run_at <= through:
                keys.add((run_at, item[MESSAGE_ID_SLICE]))
        return keys

    def ask_count(self, k: int) -> None:
        """A verify count of slice `k` goes out now."""
        self.counting[k] = len(self.slice_keys(k))

    def ask_look(self, k: int) -> None:
        """A second look at slice `k` goes out now. A slice fired whole, with nothing
        waiting behind the wheel's frontier, is all in the record: its count is kept there
        (no unpacking of its keys)."""
        if slice_end(k) <= self.fired_through_ms and self.overdue_floor_ms is None and k * SLICE_MS > self.start_ms:
            self.looking[k] = self.seen.count(k)
        else:
            self.looking[k] = len(self.slice_keys(k))

    # Results coming in.

    def add_rows(self, rows: Iterable[Row]) -> int:
        """Add rows read from the store; returns how many entered the wheel."""
        added = 0
        start = self.start_ms
        for row in rows:
            if row.run_at_ms <= start:
                continue
            if row.message is not None:
                self._add(row.run_at_ms, row.tag, row.message)
                added += 1
            elif row.letter is not None:
                self.dead.append((row.run_at_ms, pack(row.run_at_ms, row.id), row.letter))
            else:
                self._handled_unfired(slice_of(row.run_at_ms), pack(row.run_at_ms, row.id))
        return added

    def _handled_unfired(self, k: int, packed: bytes) -> None:
        """A row read that must not fire: handled. A copy of it that reaches the wheel
        later (a hand-off of a finished task) is dropped when its slot fires."""
        self.seen.add_packed(k, packed)
        self.unfired_slices.add(k)

    def _add(self, run_at_ms: int, tag: int, message: bytes) -> None:
        if run_at_ms <= self.fired_through_ms:  # fires at the next pass: hold the cursor below it
            floor = self.overdue_floor_ms
            self.overdue_floor_ms = run_at_ms if floor is None else min(floor, run_at_ms)
        elif run_at_ms <= self.wheel.fired_through_ms:  # its slot was taken already: not due yet, wait with it
            insort_right(self.soon, (run_at_ms, tag, message), key=_run_at)
            return
        self.wheel.add(run_at_ms, tag, message)

    def bucket_loaded(self, bucket: int, read_started_ms: int) -> None:
        """The bucket's read is complete. Its slices that were already past when the read
        began need no count before firing (they fire at once); their second look comes
        `second_look_ms` after the read began."""
        self.completed_buckets.add(bucket)
        self.failed_buckets.discard(bucket)
        self.read_at_ms[bucket] = read_started_ms
        k = slice_of(bucket)
        while k < slice_of(bucket + BUCKET_MS) and slice_end(k) < read_started_ms:
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
        """The read gave up: ask for it again, from where it stopped, after `retry_at_ms`.
        Until then hand-offs for it are still taken (it stays asked for)."""
        self.failed_buckets.add(bucket)
        self.load_retry_at_ms = retry_at_ms

    def slice_counted(self, k: int, stored: int) -> bool:
        """Take the store's verify count of slice `k`; True if the slice must be read again."""
        seen = self.counting.get(k)
        if seen is None:
            return False
        if stored > seen:
            return True  # stays in `counting` until the re-read is merged
        del self.counting[k]
        self._slice_verified(k)
        return False

    def slice_looked(self, k: int, stored: int) -> bool:
        """Take the store's second-look count of slice `k`; True if it must be read again."""
        known = self.looking.get(k)
        if known is None:
            return False
        if stored > known:
            return True
        del self.looking[k]
        self._slice_looked(k)
        return False

    def slice_failed(self, k: int, retry_at_ms: int, *, look: bool = False) -> None:
        if look:
            self.looking.pop(k, None)
            self.look_retry_at_ms = retry_at_ms
        else:
            self.counting.pop(k, None)
            self.verify_retry_at_ms = retry_at_ms

    def slice_reread(self, k: int, rows: Iterable[Row], *, look: bool = False) -> int:
        """Merge the rows of a re-read slice that the shard has not seen; returns how many
        entered the wheel (fired at the next pass if already due)."""
        keys = self.slice_keys(k)
        fresh = [row for row in rows if (row.run_at_ms, row.id) not in keys]
        added = self.add_rows(fresh)
        if look:
            self.looking.pop(k, None)
            self._slice_looked(k)
        else:
            self.counting.pop(k, None)
            self._slice_verified(k)
        return added

    def _slice_verified(self, k: int) -> None:
        if k < slice_of(self.verified_through_ms + 1):
            return
        self.verified_slices.add(k)
        while slice_of(self.verified_through_ms + 1) in self.verified_slices:
            done = slice_of(self.verified_through_ms + 1)
            self.verified_slices.discard(done)
            self.verified_through_ms = slice_end(done)

    def _slice_looked(self, k: int) -> None:
        if k < slice_of(self.looked_through_ms + 1):
            return
        self.looked_slices.add(k)
        while slice_of(self.looked_through_ms + 1) in self.looked_slices:
            done = slice_of(self.looked_through_ms + 1)
            self.looked_slices.discard(done)
            self.looked_through_ms = slice_end(done)
        for bucket in [b for b in self.read_at_ms if b + BUCKET_MS - 1 <= self.looked_through_ms]:
            del self.read_at_ms[bucket]

    def handed_task(self, task: Task) -> bool:
        """Take a handed-off task; True if it entered the wheel. Ignored when its bucket
        has not been asked for yet (that read will find it); fired at once if overdue.
        A copy of a row already read is dropped when its slot fires, or, if it comes after
        the row fired, when it would fire (see `fire`)."""
        if task.run_at_ms > self.start_ms and minute_bucket(task.run_at_ms) not in self.requested_buckets \
                and task.run_at_ms > self.loaded_through_ms:
            return False
        self._add(task.run_at_ms, tag_for(task, self.long_types, self.type_labels), encode_message(task, self.token))
        return True

    def handed_cancel(self, task_id: bytes, run_at_ms: int) -> None:
        self.cancelled[task_id] = run_at_ms

    # The sweep behind the cursor.

    def expected(self, bucket: int, through_ms: int, after_ms: int | None = None) -> int | None:
        """How many rows of `bucket` at or before `through_ms` (and after `after_ms`, if
        given: at or after `start_ms`) the shard has handled, or its previous owners did
        at or before `start_ms`; None if unknown."""
        base = 0
        if after_ms is None and bucket <= self.start_ms:
            known = self.baseline.get(bucket)
            if known is None:
                return None
            base = known
        after = max(bucket - 1, self.start_ms if after_ms is None else after_ms)
        through = min(through_ms, bucket + BUCKET_MS - 1)
        seen = self.seen
        return base + sum(seen.count_between(k, after, through) for k in range(slice_of(after + 1), slice_of(through) + 1))

    def sweep_due(self, now_ms: int) -> Sweep | None:
        """If a sweep is due, what it counts: the buckets, through the persisted cursor,
        and after `after_ms` for a recent sweep (None: whole buckets, a full sweep). The
        caller counts them and hands the counts to `swept`."""
        if self.sweeping or now_ms < self.next_sweep_ms:
            return None
        self.next_sweep_ms = now_ms + self.sweep_interval_ms
        full = self.sweeps_to_full <= 0
        through = self.persisted_ms
        if full:
            self.sweeps_to_full = FULL_SWEEP_EVERY
            first, after = minute_bucket(now_ms - self.horizon_ms), None
        else:
            self.sweeps_to_full -= 1
            after = through - RECENT_SWEEP_MS
            first = minute_bucket(after + 1)
            if after < self.start_ms:  # reaching behind the start: whole buckets, which the inherited counts cover
                after = None
        last = minute_bucket(through)
        if last < first or (after is not None and after >= through):
            return None
        self.sweeping = True
        return Sweep(through, list(range(first, last + 1, BUCKET_MS)), after)

    def swept(self, sweep: Sweep, counts: dict[int, int]) -> list[int]:
        """Take a sweep's counts; returns the buckets to read again (over the sweep's range)."""
        self.sweeping = False
        again = []
        for bucket in sweep.buckets:
            stored = counts.get(bucket, 0)
            expected = self.expected(bucket, sweep.through_ms, sweep.after_ms)
            if expected is None and stored == 0:
                self.baseline[bucket] = 0
            elif expected != stored:
                again.append(bucket)
        return again

    def sweep_failed(self, retry_at_ms: int) -> None:
        self.sweeping = False
        self.next_sweep_ms = min(self.next_sweep_ms, retry_at_ms)

    def bucket_reread(self, bucket: int, rows: Iterable[Row], *, whole: bool = True) -> int:
        """Merge a bucket read again after its sweep count differed (`whole`: the whole
        bucket through the sweep's cursor; else only the recent range): what was not
        handled yet and should fire enters the wheel (behind its frontier: it fires at
        once); returns how many. Rows at or before `start_ms` that this owner did not
        handle itself may have been fired by a previous owner: they are fired again unless
        a worker has reported on them (the record of what that owner fired is not here)."""
        added = inherited = 0
        seen = self.seen
        for row in rows:
            if row.run_at_ms <= self.start_ms:
                inherited += 1
            k = slice_of(row.run_at_ms)
            packed = pack(row.run_at_ms, row.id)
            if (k, packed) in seen:
                continue
            if row.letter is not None:
                self.dead.append((row.run_at_ms, packed, row.letter))
                continue
            if row.message is None:
                if row.run_at_ms > self.start_ms:
                    self._handled_unfired(k, packed)
                continue
            self._add(row.run_at_ms, row.tag, row.message)
            added += 1
        if whole and bucket <= self.start_ms:
            self.baseline[bucket] = inherited
        return added

    def baselines(self, now_ms: int, through_ms: int) -> dict[int, int]:
        """For the cursor `through_ms` about to be written: each bucket of the horizon
        behind it -> how many of its rows at or before it were handled (what a next owner
        compares its sweep with). Unknown buckets are left out."""
        counts = {}
        for bucket in range(minute_bucket(now_ms - self.horizon_ms), minute_bucket(through_ms) + 1, BUCKET_MS):
            expected = self.expected(bucket, through_ms)
            if expected is not None:
                counts[bucket] = expected
        return counts

    def forget(self, now_ms: int) -> None:
        """Drop what is older than the horizon: the sweep no longer looks there."""
        oldest = minute_bucket(now_ms - self.horizon_ms)
        self.seen.forget_before(slice_of(oldest))
        self.unfired_slices = {k for k in self.unfired_slices if k >= slice_of(oldest)}
        for bucket in [b for b in self.baseline if b < oldest]:
            del self.baseline[bucket]

    # Firing.

    def fire(self, now_ms: int, *, gated: bool = False) -> FireBatch:
        """Take what is due from the wheel, never past a slice still being verified
        (within its grace); drop second copies and what was cancelled. With `gated`, the
        entries are returned whole in `gated`, for the release gate, not by tag. Every
        entry taken is recorded as handled; one that entered the wheel behind its
        frontier is first looked up in that record, and dropped if its row was handled.

        Never early: the wheel hands out the slot `now_ms` falls in as soon as it begins
        (`poll_started`), and only its entries due by the fire limit (at most `now_ms`)
        are taken here; the rest wait in `soon` for a later pass."""
        frontier = self.fired_through_ms
        limit = self.fire_limit(now_ms)
        entries = self.wheel.poll_started(limit)
        self.overdue_floor_ms = None
        soon = self.soon
        if soon:
            # The wheel's overdue entries (at or before the frontier) come first, then its
            # slots after `soon`'s: one stable sort of the runs puts `soon` between them.
            if entries:
                soon += entries
                soon.sort(key=_run_at)
            entries, self.soon = soon, []
        if entries and entries[-1][0] > limit:
            cut = bisect_right(entries, limit, key=_run_at)
            self.soon = entries[cut:]
            del entries[cut:]
        self.fired_through_ms = max(frontier, limit)
        by_tag: dict[int, list[bytes]] = {}
        skipped = duplicates = 0
        cancelled = self.cancelled
        record = self.seen
        unfired = self.unfired_slices
        polled: set[bytes] = set()
        kept: list[Entry] | None = [] if gated else None
        floor: int | None = None
        run_ats: list[int] = []
        fired_at = run_ats.append
        for run_at, tag, item in entries:
            task_id = item[MESSAGE_ID_SLICE]
            packed = run_at.to_bytes(8, "big") + task_id
            if packed in polled:
                duplicates += 1
                continue
            polled.add(packed)
            k = run_at // SLICE_MS
            if (run_at <= frontier or k in unfired) and (k, packed) in record:
                duplicates += 1
                continue
            record.add_packed(k, packed)
            if cancelled and task_id in cancelled:
                skipped += 1
                continue
            if floor is None or run_at < floor:
                floor = run_at
            if kept is not None:
                kept.append((run_at, tag, item))
                continue
            fired_at(run_at)
            values = by_tag.get(tag)
            if values is None:
                values = by_tag[tag] = []
            values.append(item)
        letters: list[bytes] = []
        for run_at, packed, letter in self.dead:
            k = run_at // SLICE_MS
            if packed in polled or (k, packed) in record:
                continue
            polled.add(packed)
            record.add_packed(k, packed)
            letters.append(letter)
            floor = run_at if floor is None else min(floor, run_at)
        self.dead = []
        if floor is not None:
            self.unacked[floor] = self.unacked.get(floor, 0) + 1
        count = len(entries) - skipped - duplicates
        return FireBatch(by_tag, self.fired_through_ms, count, skipped, duplicates, kept, floor_ms=floor,
                         dead_letters=letters, run_ats=run_ats)

    def fire_limit(self, now_ms: int) -> int:
        """How far the wheel may fire at `now_ms`: up to the first slice that is neither
        verified nor more than `verify_grace_ms` past its end."""
        # Slices that ended more than the grace ago may fire whatever their state: start after them.
        k = max(slice_of(self.verified_through_ms + 1), slice_of(now_ms - self.verify_grace_ms) - 1)
        while k * SLICE_MS <= now_ms:
            if k not in self.verified_slices and now_ms <= slice_end(k) + self.verify_grace_ms:
                return max(k * SLICE_MS - 1, self.fired_through_ms)
            k += 1
        return now_ms

    def next_due_ms(self) -> int | None:
        """When the first entry held in `soon` falls due (None: none is held). Entries still
        in the wheel fall due no earlier than the next tick, which fires them."""
        return self.soon[0][0] if self.soon else None

    @property
    def waiting(self) -> int:
        """Entries not fired yet: in the wheel, and held in `soon`."""
        return len(self.wheel) + len(self.soon)

    def flushed(self, batch: FireBatch) -> None:
        """The queue acknowledged `batch`: move the flushed frontier and forget what is old."""
        self.flushed_through_ms = max(self.flushed_through_ms, batch.fired_through_ms)
        floor = batch.floor_ms
        if floor is not None:
            left = self.unacked.get(floor, 0) - 1
            if left > 0:
                self.unacked[floor] = left
            else:
                self.unacked.pop(floor, None)
            batch.floor_ms = None  # settled once, whoever calls again
        if len(self.cancelled) > 1000 and self.flushed_through_ms - self.cancels_pruned_at_ms > BUCKET_MS:
            self.cancels_pruned_at_ms = self.flushed_through_ms
            horizon = self.flushed_through_ms - CANCEL_MEMORY_MS
            self.cancelled = {key: at for key, at in self.cancelled.items() if at > horizon}

    def unsettled_floor(self) -> int | None:
        """The earliest run_at of what was fired and not acknowledged, or waits to fire
        behind the wheel's frontier or in `soon`, or waits to be dead-lettered; None if
        nothing does. (`soon` is after the frontier, unless the wall clock stepped back
        while overdue entries were taken: then it holds the cursor back too.)"""
        floors = [floor for floor in (min(self.unacked, default=None), self.overdue_floor_ms,
                                      self.soon[0][0] if self.soon else None) if floor is not None]
        floors += [run_at for run_at, _, _ in self.dead]
        return min(floors, default=None)

    def cursor_candidate(self) -> int:
        """How far the store's cursor may move now (see the module docstring)."""
        through = min(self.flushed_through_ms, self.loaded_through_ms, self.verified_through_ms)
        floor = self.unsettled_floor()
        return through if floor is None else min(through, floor - 1)

