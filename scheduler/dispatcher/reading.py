"""Reading: what a dispatcher learns from the store about the shards it fires.

Each tick asks every shard what it needs (`OwnedShard.buckets_to_load`,
`slices_to_verify`, `slices_to_look`, `sweep_due`) and sends the reads and counts to the
pools: bucket loads and the counts before a slice fires to the readers, second looks
and sweeps (and their re-reads) to the lookers. Their results come back through the
fire loop's inbox, where the handlers here feed them into the shard.

Reads of a bucket not yet due (the preload a minute ahead) go `PRELOADS_AT_ONCE` at a
time, in pages of `DispatcherConfig.page_size` rows: what a read holds at once (the
driver's decoded page, the rows on their way to the fire loop) is garbage as soon as it
is in a wheel, but the allocator keeps the pages it used while any long-lived object
shares them, so the fewer transient rows at once, the less memory stays with the process
after the load. A bucket already due (taking a shard, a read that failed) is read at
once, whatever else is in flight: it is late.
"""

from __future__ import annotations

import logging
import random
import time
from functools import partial

from scheduler.dispatcher import memory
from scheduler.dispatcher.config import LOAD_ATTEMPTS, LOAD_CHUNK, PRELOADS_AT_ONCE
from scheduler.dispatcher.context import DispatcherContext
from scheduler.dispatcher.rows import Row, Sweep, rows_from
from scheduler.dispatcher.shard import OwnedShard
from scheduler.errors import SchedulerError
from scheduler.model import BUCKET_MS, minute_bucket
from scheduler.ports import BadRow, StoredTask
from scheduler.worker import dead_letters

log = logging.getLogger(__name__)


class Reading:
    """Loads buckets a minute ahead, counts slices before and after they fire, sweeps
    behind the cursor, and re-reads where a count differs."""

    def __init__(self, ctx: DispatcherContext) -> None:
        self.ctx = ctx
        self._loads_since_trim = 0
        self._last_trim = 0.0
        self._preloading: set[tuple[int, int, int]] = set()
        """(shard, token, bucket) of the reads of buckets not yet due under way."""

    # On the fire loop: ask for what is needed.

    def schedule(self, now: int) -> None:
        """Send every read, count and sweep the shards need now to the pools."""
        ctx = self.ctx
        self.start_loads(now)
        for shard, owned in ctx.shards.items():
            token = owned.token
            for k in owned.slices_to_verify(now, ctx.config.verify_lead_ms):
                owned.ask_count(k)
                ctx.submit(ctx.readers, self._count_slice, owned, k,
                           on_error=partial(ctx.post, partial(self._slice_failed, shard, token, k)))
            for k in owned.slices_to_look(now):
                owned.ask_look(k)
                ctx.submit(ctx.lookers, self._count_slice, owned, k, True,
                           on_error=partial(ctx.post, partial(self._slice_failed, shard, token, k, True)))
            sweep = owned.sweep_due(now)
            if sweep is not None:
                owned.forget(now)
                ctx.submit(ctx.lookers, self._sweep, owned, sweep,
                           on_error=partial(ctx.post, partial(self._sweep_failed, shard, token)))

    def start_loads(self, now: int) -> None:
        """Send the bucket reads the shards need now: every one already due, and those of
        buckets ahead while fewer than `PRELOADS_AT_ONCE` are under way."""
        ctx = self.ctx
        preloading = self._preloading
        for shard, owned in ctx.shards.items():
            token = owned.token
            # Reads ahead left out now are asked for when one ends, or at the next tick.
            for bucket in owned.buckets_to_load(now, ctx.config.lookahead_ms,
                                                ahead=len(preloading) < PRELOADS_AT_ONCE):
                ahead = bucket > now
                if ahead:
                    preloading.add((shard, token, bucket))
                owned.read_asked(bucket)
                ctx.submit(ctx.readers, self._load_bucket, owned, bucket, owned.resume_after(bucket), ahead,
                           on_error=partial(ctx.post, partial(self._bucket_failed, shard, token, bucket)))

    def _preload_ended(self, shard: int, token: int, bucket: int) -> None:
        """On the fire loop: a read of a bucket ahead is over (read, failed or dropped);
        the next one goes out now rather than at the next tick."""
        self._preloading.discard((shard, token, bucket))
        self.start_loads(self.ctx.clock())

    def trim_memory(self) -> None:
        """After bucket reads, hand the memory they used back (see `memory`); at most once
        a second, and only when the readers are idle, so it never slows a load."""
        now = time.monotonic()
        if self._loads_since_trim and now - self._last_trim > 1.0 and self._readers_idle():
            self._loads_since_trim = 0
            self._last_trim = now
            self.ctx.submit(self.ctx.readers, _trim)  # off the fire loop: it can take a while

    def _readers_idle(self) -> bool:
        return not any(owned.requested_buckets - owned.completed_buckets for owned in self.ctx.shards.values())

    # On the pools: the reads and counts, each sending its result to the fire loop.

    def _load_bucket(self, owned: OwnedShard, bucket: int, after: int, ahead: bool = False) -> None:
        """Read one bucket of the shard, rows after `after`, and send it to the fire loop in
        chunks. Chunks end between two run_at values, so a read retried after a failure
        (here, or asked for again later) resumes after the last run_at sent and sends no
        row twice. A read of a bucket `ahead` tells the fire loop when it is over, however
        it ends (see `start_loads`)."""
        try:
            self._read_bucket(owned, bucket, after)
        finally:
            if ahead:
                self.ctx.post(partial(self._preload_ended, owned.shard, owned.token, bucket))

    def _read_bucket(self, owned: OwnedShard, bucket: int, after: int) -> None:
        ctx = self.ctx
        token, shard = owned.token, owned.shard
        read_started = ctx.clock()
        delay = 0.2
        for _ in range(LOAD_ATTEMPTS):
            if ctx.stopping.is_set() or not ctx.holds(shard, token):
                return
            try:
                chunk: list[StoredTask] = []
                bad: list[Row] = []
                for stored in ctx.store.read_partition(owned.partition(bucket), after_ms=after,
                                                       page_size=ctx.config.page_size,
                                                       on_bad_row=partial(self._bad_row, bad)):
                    if len(chunk) >= LOAD_CHUNK and stored.task.run_at_ms != chunk[-1].task.run_at_ms:
                        rows = rows_from(chunk, token, owned.long_types, owned.type_labels) + bad
                        after = chunk[-1].task.run_at_ms
                        ctx.post(partial(self._rows_loaded, shard, token, rows, bucket, after))
                        chunk = []
                        bad.clear()  # the same list: the read's `on_bad_row` appends to it
                    chunk.append(stored)
                rows = rows_from(chunk, token, owned.long_types, owned.type_labels) + bad
                ctx.post(partial(self._rows_loaded, shard, token, rows, bucket, bucket + BUCKET_MS - 1, read_started))
                return
            except SchedulerError as exc:
                ctx.stats.store_failures += 1
                log.warning("reading bucket %d of shard %d failed: %s; retrying", bucket, shard, exc,
                            extra={"action": "load_failed", "shard": shard})
                ctx.stopping.wait(delay)
                delay = min(delay * 2, 5.0)
        ctx.post(partial(self._bucket_failed, shard, token, bucket))

    def _bad_row(self, into: list[Row], bad: BadRow) -> None:
        """A row the store could not read: it goes to the dead-letter topic with its raw
        columns, and counts as handled (so the shard goes on and its counts still match)."""
        self.ctx.stats.bad_rows += 1
        log.error("row %d/%s of partition %s cannot be read (%s); dead-lettering it", bad.run_at_ms,
                  bad.task_id.hex(), bad.partition, bad.reason, extra={"action": "bad_row"})
        into.append(Row(bad.run_at_ms, bad.task_id, 0, None, dead_letters.for_bad_row(bad, self.ctx.clock())))

    def _read_rows(self, owned: OwnedShard, after_ms: int, through_ms: int) -> list[Row]:
        """The rows of the shard in `(after_ms, through_ms]` (one bucket), fit for the wheel."""
        bad: list[Row] = []
        stored = list(self.ctx.store.read_partition(owned.partition(minute_bucket(through_ms)), after_ms=after_ms,
                                                    through_ms=through_ms, on_bad_row=partial(self._bad_row, bad)))
        return rows_from(stored, owned.token, owned.long_types, owned.type_labels) + bad

    def _count_slice(self, owned: OwnedShard, k: int, look: bool = False) -> None:
        """Count slice `k` in the store: before it fires (its verify), or after (`look`)."""
        ctx = self.ctx
        token, shard = owned.token, owned.shard
        after, through = owned.count_range(k)
        try:
            stored = ctx.store.count_partition(owned.partition(minute_bucket(k * 1000)), after_ms=after,
                                               through_ms=through)
        except SchedulerError as exc:
            ctx.stats.store_failures += 1
            log.warning("counting a slice of shard %d failed: %s", shard, exc, extra={"action": "count_failed"})
            ctx.post(partial(self._slice_failed, shard, token, k, look))
            return
        ctx.post(partial(self._slice_counted, shard, token, k, stored, look))

    def _reread_slice(self, owned: OwnedShard, k: int, look: bool = False) -> None:
        ctx = self.ctx
        token, shard = owned.token, owned.shard
        after, through = owned.count_range(k)
        try:
            rows = self._read_rows(owned, after, through)
        except SchedulerError as exc:
            ctx.stats.store_failures += 1
            log.warning("re-reading a slice of shard %d failed: %s", shard, exc, extra={"action": "reread_failed"})
            ctx.post(partial(self._slice_failed, shard, token, k, look))
            return
        ctx.post(partial(self._slice_reread, shard, token, k, rows, look))

    def _sweep(self, owned: OwnedShard, sweep: Sweep) -> None:
        """Count what the sweep covers behind the cursor, in one request."""
        ctx = self.ctx
        token, shard = owned.token, owned.shard
        try:
            counts = ctx.store.count_buckets(shard, sweep.buckets, sweep.through_ms, sweep.after_ms)
        except SchedulerError as exc:
            ctx.stats.store_failures += 1
            log.warning("the sweep of shard %d failed: %s", shard, exc, extra={"action": "sweep_failed"})
            ctx.post(partial(self._sweep_failed, shard, token))
            return
        ctx.post(partial(self._swept, shard, token, sweep, counts))

    def _reread_bucket(self, owned: OwnedShard, bucket: int, sweep: Sweep) -> None:
        ctx = self.ctx
        token, shard = owned.token, owned.shard
        after = bucket - 1 if sweep.after_ms is None else max(bucket - 1, sweep.after_ms)
        try:
            rows = self._read_rows(owned, after, min(sweep.through_ms, bucket + BUCKET_MS - 1))
        except SchedulerError as exc:
            ctx.stats.store_failures += 1
            log.warning("re-reading bucket %d of shard %d failed: %s; the next sweep tries again", bucket, shard, exc,
                        extra={"action": "reread_failed"})
            return
        ctx.post(partial(self._bucket_reread, shard, token, bucket, rows, sweep.after_ms is None))

    # Inbox handlers: these run on the fire loop.

    def _rows_loaded(self, shard: int, token: int, rows: list[Row], bucket: int, posted_through_ms: int,
                     read_started_ms: int | None = None) -> None:
        """Rows of a bucket read; with `read_started_ms`, the last of them."""
        owned = self.ctx.current(shard, token)
        if owned is None:
            return
        self.ctx.stats.loaded += owned.add_rows(rows)
        owned.rows_posted(bucket, posted_through_ms)
        if read_started_ms is not None:
            owned.bucket_loaded(bucket, read_started_ms)
            self._loads_since_trim += 1

    def _slice_counted(self, shard: int, token: int, k: int, stored: int, look: bool = False) -> None:
        ctx = self.ctx
        owned = ctx.current(shard, token)
        if owned is None:
            return
        if look:
            ctx.stats.slices_looked += 1
            again = owned.slice_looked(k, stored)
            ctx.stats.looks_reread += again
        else:
            ctx.stats.slices_counted += 1
            again = owned.slice_counted(k, stored)
            ctx.stats.slices_reread += again
        if again:
            ctx.submit(ctx.lookers if look else ctx.readers, self._reread_slice, owned, k, look,
                       on_error=partial(ctx.post, partial(self._slice_failed, shard, token, k, look)))

    def _slice_reread(self, shard: int, token: int, k: int, rows: list[Row], look: bool = False) -> None:
        owned = self.ctx.current(shard, token)
        if owned is not None:
            added = owned.slice_reread(k, rows, look=look)
            if look:
                self.ctx.stats.rows_found_late += added
            else:
                self.ctx.stats.rows_merged += added
            if added:
                log.warning("slice %d of shard %d held %d tasks the dispatcher had not seen (%s); merged", k, shard,
                            added, "written after it fired: they fire now" if look else "before it fired",
                            extra={"action": "slice_merged", "shard": shard})

    def _slice_failed(self, shard: int, token: int, k: int, look: bool = False) -> None:
        owned = self.ctx.current(shard, token)
        if owned is not None:  # asked again a little later
            owned.slice_failed(k, self.ctx.clock() + int(500 + 1000 * random.random()), look=look)

    def _swept(self, shard: int, token: int, sweep: Sweep, counts: dict[int, int]) -> None:
        ctx = self.ctx
        owned = ctx.current(shard, token)
        if owned is None:
            return
        ctx.stats.sweeps += 1
        for bucket in owned.swept(sweep, counts):
            ctx.stats.buckets_reread += 1
            ctx.submit(ctx.lookers, self._reread_bucket, owned, bucket, sweep)

    def _sweep_failed(self, shard: int, token: int) -> None:
        owned = self.ctx.current(shard, token)
        if owned is not None:
            owned.sweep_failed(self.ctx.clock() + int(1000 + 1000 * random.random()))

    def _bucket_reread(self, shard: int, token: int, bucket: int, rows: list[Row], whole: bool = True) -> None:
        owned = self.ctx.current(shard, token)
        if owned is not None:
            added = owned.bucket_reread(bucket, rows, whole=whole)
            self.ctx.stats.rows_swept += added
            if added:
                log.warning("bucket %d of shard %d held %d tasks behind the cursor that were never fired; firing "
                            "them now", bucket, shard, added, extra={"action": "bucket_merged", "shard": shard})

    def _bucket_failed(self, shard: int, token: int, bucket: int) -> None:
        owned = self.ctx.current(shard, token)
        if owned is not None:
            owned.bucket_failed(bucket, self.ctx.clock() + int(1000 + 1000 * random.random()))


def _trim() -> None:
    memory.trim()
