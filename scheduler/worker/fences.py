"""`Fences`: the latest fencing token the worker knows of each shard, and which
messages carry an older one.

Each message carries the token of the shard lease it was fired under; the worker learns
each shard's current token from the messages themselves and from the store (`shards`
table, read again every `refresh_s` on a short-lived thread of its own). A message with
an older token came from a dispatcher that has since lost the shard. It is **counted
(`stale_fence`) and run anyway**: the new owner re-fires only what is after the cursor
the old owner persisted, so a stale message for a task at or before that cursor is the
only copy there will ever be, and dropping it would lose the task. A stale copy that is
a true duplicate is absorbed like any other repeat, by the home-row check (a stale
message is a suspect, see `intake`) and by `ctx.once`.

Threads: `note`, `is_stale` and `maybe_refresh` are called by the main loop; the
refresh thread only raises a shard's token in the dict (one assignment, so a reader sees
the old token or the new one). A failed read leaves the tokens as they were: they are
a hint for the check, never a reason to drop a message.
"""

from __future__ import annotations

import threading
import time

from scheduler.errors import SchedulerError
from scheduler.model import Message
from scheduler.ports import TaskStore
from scheduler.worker.stats import WorkerStats


class Fences:
    def __init__(self, store: TaskStore, stats: WorkerStats, *, shard_count: int, refresh_s: float) -> None:
        self._store = store
        self._stats = stats
        self._shard_count = shard_count
        self._refresh_s = refresh_s
        self._tokens: dict[int, int] = {}
        self._seen: set[int] = set()
        """Shards of the messages since the last refresh: the ones worth reading."""
        self._read_at = 0.0

    def note(self, message: Message) -> None:
        """Count a stale token, learn a newer one."""
        shard = message.task.id.shard(self._shard_count)
        self._seen.add(shard)
        current = self._tokens.get(shard)
        if current is not None and message.fence < current:
            self._stats.stale_fence += 1
        elif current is None or message.fence > current:
            self._tokens[shard] = message.fence

    def is_stale(self, message: Message) -> bool:
        """Whether the message's token is older than its shard's latest known one."""
        return message.fence < self._tokens.get(message.task.id.shard(self._shard_count), 0)

    def maybe_refresh(self) -> None:
        """Read the tokens of the shards seen lately, at most every `refresh_s`."""
        now = time.monotonic()
        if now - self._read_at < self._refresh_s or not self._seen:
            return
        self._read_at = now
        shards, self._seen = self._seen, set()
        threading.Thread(target=self._refresh, args=(shards,), name="fences", daemon=True).start()

    def _refresh(self, shards: set[int]) -> None:
        for shard in shards:
            try:
                token = self._store.read_shard(shard).lease_token
            except SchedulerError:
                self._stats.fence_read_failures += 1
                return
            if token is not None and token > self._tokens.get(shard, -1):
                self._tokens[shard] = token
