"""Watching every shard's cursor during a run: the promise that a cursor never moves
backwards, checked from outside, by reading each shard's record (`read_shard`) over
and over on a thread of the bench while the faults happen.

Each read of a shard is compared with the one before it: a later read with an earlier
cursor is a backward move, under whichever lease token. A read that fails (a node
down) is counted and skipped. The reads go through a store of the bench's own, at the
deployment's consistency, so they see what a new owner would read."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from bench.nine.common import now_ms
from scheduler.adapters.cassandra.store import CassandraTaskStore
from scheduler.errors import SchedulerError
from scheduler.settings import CassandraSettings


@dataclass
class Observation:
    at_ms: int
    token: int | None
    cursor_ms: int | None


@dataclass
class CursorWatch:
    settings: CassandraSettings
    interval_s: float = 0.5
    last: dict[int, Observation] = field(default_factory=dict)
    backwards: list[dict[str, Any]] = field(default_factory=list)
    tokens: dict[int, list[tuple[int, int, int | None]]] = field(default_factory=dict)
    """Shard -> (first seen ms, token, cursor when first seen) for each token it had."""
    reads = 0
    failed_reads = 0
    longest_pass_s = 0.0
    first_error: str | None = None

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cursor-watch", daemon=True)

    def start(self) -> CursorWatch:
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            store = CassandraTaskStore.open(self.settings)
        except SchedulerError as error:
            self.first_error = f"opening the store: {type(error).__name__}: {error}"[:300]
            return
        try:
            # The shards read 16 at a time: a read stuck on a stopped node holds up only
            # its own thread, and the others go on being read.
            with ThreadPoolExecutor(max_workers=16, thread_name_prefix="cursor-read") as pool:
                while not self._stop.is_set():
                    began = time.monotonic()
                    list(pool.map(lambda shard: self._read(store, shard), range(self.settings.shard_count)))
                    took = time.monotonic() - began
                    self.longest_pass_s = max(self.longest_pass_s, took)
                    self._stop.wait(max(0.0, self.interval_s - took))
        finally:
            store.close()

    def _read(self, store: CassandraTaskStore, shard: int) -> None:
        try:
            state = store.read_shard(shard)
        except SchedulerError as error:
            self.failed_reads += 1
            self.first_error = self.first_error or f"{type(error).__name__}: {error}"[:300]
            return
        self.reads += 1
        seen = Observation(now_ms(), state.lease_token, state.fired_through_ms)
        before = self.last.get(shard)
        if (before is not None and before.cursor_ms is not None
                and (seen.cursor_ms is None or seen.cursor_ms < before.cursor_ms)):
            self.backwards.append({"shard": shard, "at_ms": seen.at_ms, "from_ms": before.cursor_ms,
                                   "to_ms": seen.cursor_ms, "token_before": before.token, "token": seen.token})
        history = self.tokens.setdefault(shard, [])
        if seen.token is not None and (not history or history[-1][1] != seen.token):
            history.append((seen.at_ms, seen.token, seen.cursor_ms))
        self.last[shard] = seen

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)

    def figures(self) -> dict[str, Any]:
        changed = {shard: history for shard, history in self.tokens.items() if len(history) > 1}
        return {"reads": self.reads, "failed_reads": self.failed_reads, "first_error": self.first_error,
                "longest_pass_s": round(self.longest_pass_s, 1),
                "backwards": len(self.backwards), "backward_moves": self.backwards[:20],
                "shards_that_changed_owner": len(changed)}
