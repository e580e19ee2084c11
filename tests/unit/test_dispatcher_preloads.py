"""How many bucket reads a dispatcher has under way: reads of buckets not yet due go
`PRELOADS_AT_ONCE` at a time, the next as soon as one ends; buckets already due are read
at once. Driven by hand: the reads are recorded, not run."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from scheduler.dispatcher.config import PRELOADS_AT_ONCE, DispatcherConfig
from scheduler.dispatcher.context import DispatcherContext
from scheduler.dispatcher.reading import Reading
from scheduler.dispatcher.shard import OwnedShard
from scheduler.model import BUCKET_MS
from scheduler.ports import Lease
from tests.tasks import NINE_OCLOCK_MS

T0 = NINE_OCLOCK_MS
SHARDS = 8


class _Store:
    shard_count = SHARDS


class Recorded:
    """A context whose pools record the jobs sent to them and whose inbox is a list."""

    def __init__(self, now_ms: int, start_ms: int) -> None:
        self.now_ms = now_ms
        self.ctx = DispatcherContext(DispatcherConfig(member="m"), _Store(), None, lambda: self.now_ms)  # type: ignore[arg-type]
        self.jobs: list[tuple[Callable[..., None], tuple[Any, ...]]] = []
        self.inbox: list[Callable[[], None]] = []
        self.ctx.submit = lambda pool, job, *args, on_error=None: self.jobs.append((job, args))  # type: ignore[method-assign]
        self.ctx.post = self.inbox.append  # type: ignore[method-assign, assignment]
        for shard in range(SHARDS):
            self.ctx.shards[shard] = OwnedShard(shard, Lease(shard, 100 + shard, 1), start_ms, SHARDS)
        self.reading = Reading(self.ctx)

    def loads(self, bucket: int | None = None) -> list[tuple[int, int]]:
        """(shard, bucket) of every bucket read sent so far (of `bucket`)."""
        return [(args[0].shard, args[1]) for job, args in self.jobs
                if getattr(job, "__name__", "") == "_load_bucket" and bucket in (None, args[1])]

    def end_load(self, shard: int, bucket: int) -> None:
        """The read of `bucket` ends at once (an empty bucket), and the fire loop takes it in."""
        owned = self.ctx.shards[shard]
        self.reading._rows_loaded(shard, owned.token, [], bucket, bucket + BUCKET_MS - 1, self.now_ms)
        self.reading._preload_ended(shard, owned.token, bucket)


def test_buckets_ahead_are_read_a_few_at_a_time_and_the_next_goes_as_soon_as_one_ends() -> None:
    rec = Recorded(now_ms=T0 - 60_000, start_ms=T0 - 60_001)  # 08:59:00, every shard's cursor just behind
    rec.reading.start_loads(rec.now_ms)
    assert len(rec.loads(T0 - BUCKET_MS)) == SHARDS  # the current minute, due: all at once
    first = rec.loads(T0)
    assert first == [(shard, T0) for shard in range(PRELOADS_AT_ONCE)]
    rec.reading.start_loads(rec.now_ms)  # the next tick: still the same reads under way
    assert rec.loads(T0) == first
    rec.end_load(0, T0)
    assert rec.loads(T0) == [*first, (PRELOADS_AT_ONCE, T0)]
    rec.reading._preload_ended(0, rec.ctx.shards[0].token, T0)  # told twice: nothing more goes out
    assert len(rec.loads(T0)) == PRELOADS_AT_ONCE + 1


def test_a_bucket_already_due_is_read_at_once_whatever_is_under_way() -> None:
    rec = Recorded(now_ms=T0 + 5_000, start_ms=T0 - 1)  # taken mid-minute: the current bucket is due
    rec.reading.start_loads(rec.now_ms)
    assert sorted(shard for shard, _ in rec.loads(T0)) == list(range(SHARDS))
    assert len(rec.loads(T0 + BUCKET_MS)) == PRELOADS_AT_ONCE
