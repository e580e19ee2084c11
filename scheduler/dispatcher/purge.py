"""The dispatcher's purge of what the embedded backend keeps past its retention.

Cassandra's TTLs and Kafka's `retention.ms` remove old tasks and messages by themselves;
the embedded backend's files need someone to delete them: the dispatcher that holds
shard 0, one at a time most of the time (two for a moment during a hand-over delete the
same rows, which is harmless). Its **purge thread** calls each purger (the task store's
`purge_expired`, the queue's) with the dispatcher's clock and `PURGE_ROWS`: one short
transaction each, so ingest and the workers' reports, which share SQLite's one writer,
wait at most one of them. While a purger fills its limit there is more to do, and the
next pass comes `AGAIN_S` later; else `INTERVAL_S` later. A failure is logged, counted
(`Stats.purge_failures`) and tried again at the next pass; it never stops the
dispatcher. Nothing here touches the fire loop or the shards' state: holding shard 0
is read with a look at `ctx.shards`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping

from scheduler.dispatcher.context import DispatcherContext
from scheduler.errors import SchedulerError

log = logging.getLogger(__name__)

Purger = Callable[[int, int], int]
"""(now_ms, limit) -> rows deleted: `TaskStore.purge_expired`, `SqliteQueue.purge_expired`."""

PURGE_SHARD = 0
"""The shard whose holder purges."""

PURGE_ROWS = 2_000
"""Rows a purger deletes at most per pass: some tens of milliseconds of the writer."""

INTERVAL_S = 60.0
"""Between passes once nothing more was left to purge, and after a failure."""

AGAIN_S = 10.0
"""Between passes while there is more to purge: up to 12,000 rows a minute a purger
(some 17 million a day)."""

CHECK_S = 5.0
"""How often a dispatcher that does not hold shard 0 looks again whether it does."""

STOP_WAIT_S = 10.0
"""How long a stopping dispatcher waits for a pass under way (one transaction a purger)."""


class PurgePass:
    """Runs the purgers on a thread of its own while the dispatcher holds `PURGE_SHARD`."""

    def __init__(self, ctx: DispatcherContext, purgers: Mapping[str, Purger], *, rows: int = PURGE_ROWS,
                 interval_s: float = INTERVAL_S, again_s: float = AGAIN_S, check_s: float = CHECK_S) -> None:
        if rows < 1:
            raise ValueError(f"a purge needs a positive row limit, got {rows}")
        self.ctx = ctx
        self.purgers = dict(purgers)
        self.rows = rows
        self.interval_s = interval_s
        self.again_s = again_s
        self.check_s = check_s
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="dispatcher-purge", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Wait (up to `STOP_WAIT_S`) for a pass under way; `ctx.stopping` ends the loop."""
        if self._thread is not None:
            self._thread.join(STOP_WAIT_S)

    def _loop(self) -> None:
        wait_s = 0.0
        while not self.ctx.stopping.wait(wait_s):
            wait_s = self.run_once()

    def run_once(self) -> float:
        """One pass if this dispatcher holds `PURGE_SHARD`: each purger once. Returns how
        long to wait before the next one."""
        if PURGE_SHARD not in self.ctx.shards:
            return self.check_s
        stats = self.ctx.stats
        now = self.ctx.clock()
        more = False
        for name, purge in self.purgers.items():
            try:
                removed = purge(now, self.rows)
            except SchedulerError as exc:
                stats.purge_failures += 1
                log.warning("purging the expired rows of the %s failed: %s; trying again in %.0f s", name, exc,
                            self.interval_s, extra={"action": "purge_failed", "purged": name})
                continue
            except Exception:
                stats.job_errors += 1
                log.exception("purging the expired rows of the %s failed unexpectedly", name,
                              extra={"action": "purge_failed", "purged": name})
                continue
            stats.rows_purged += removed
            if removed:
                log.info("purged %d expired row(s) of the %s", removed, name,
                         extra={"action": "purged", "purged": name, "rows": removed})
            more = more or removed >= self.rows
        return self.again_s if more else self.interval_s
