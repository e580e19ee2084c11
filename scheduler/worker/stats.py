"""`WorkerStats`: a worker's counters, one object shared by its parts.

Each counter is written by the part that makes the event happen, on the main loop
(the exceptions: `check_failures`, on a checker thread, and `fence_read_failures`, on
the fences thread), and read by anyone: the stats file's writer, the metrics and the
tests take them as they are, without a lock. The names are the stats file's keys; keep
them stable.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from scheduler.model import Task
from scheduler.visibility.histogram import LatencyHistogram
from scheduler.visibility.labels import TypeLabels

UNKNOWN_PRIORITY = -1
"""The priority code `handled` counts a message under when it could not be decoded."""


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass
class WorkerStats:
    received: int = 0
    started: int = 0
    done: int = 0
    retried: int = 0
    dead: int = 0
    skipped_cancelled: int = 0
    skipped_finished: int = 0
    skipped_superseded: int = 0
    stale_fence: int = 0
    undecodable: int = 0
    unknown_type: int = 0
    timed_out: int = 0
    merged: int = 0
    deferred: int = 0
    stuck: int = 0
    launches: int = 0
    """Hand-offs to a handler thread or the event loop (below `started` when chunked)."""
    check_failures: int = 0
    cancel_checks: int = 0
    """Messages checked because their shard had a cancel near their time."""
    cancel_rechecks: int = 0
    """Placed messages checked again before starting: their shard had a cancel since."""
    waited_for_marks: int = 0
    """Turns in which nothing started because the copy of the cancel marks was too old."""
    commits: int = 0
    commit_failures: int = 0
    revoked: int = 0
    effects_run: int = 0
    effects_skipped: int = 0
    lag_failures: int = 0
    """Reads of the consumer's lag that failed."""
    fence_read_failures: int = 0
    """Reads of the shards' fencing tokens that failed (the fences thread)."""
    served: dict[str, int] = field(default_factory=dict)
    types: TypeLabels = field(default_factory=lambda: TypeLabels(fixed=()))
    """The types `handled` labels: the app's handler types; any other counts as `other`."""
    handled: dict[tuple[str, int, str], int] = field(default_factory=dict)
    """(outcome, priority code, type label) -> tasks: the outcomes `done`, `retried`,
    `deferred`, `dead`, `skipped_cancelled`, `skipped_finished`, `skipped_superseded`."""
    start_lateness: LatencyHistogram = field(default_factory=LatencyHistogram)
    """Handler start - run_at, in ms, of every attempt started."""
    consumer_lag: dict[str, int] | None = None
    """Messages of this worker's partitions not yet fetched, by topic short name; replaced
    whole by the main loop every few seconds (None until first read, or if the queue
    cannot tell)."""
    started_ms: int = field(default_factory=wall_clock_ms)

    def count(self, outcome: str, task: Task | None) -> None:
        """One more task with this outcome (`task` None: a message that could not be decoded)."""
        key = (outcome, UNKNOWN_PRIORITY, self.types.name(0)) if task is None \
            else (outcome, task.priority.code, self.types.label(task.type))
        self.handled[key] = self.handled.get(key, 0) + 1

    def document(self) -> dict[str, object]:
        """The counters as the stats file keeps them (JSON): the numbers and `served`, the
        outcomes as `outcome/priority/type` keys, and the start lateness's quantiles."""
        document: dict[str, object] = {k: v for k, v in vars(self).items() if v is None or isinstance(v, int)}
        document["served"] = dict(self.served)
        document["handled"] = {f"{outcome}/{code}/{type_}": n for (outcome, code, type_), n in list(self.handled.items())}
        lateness = self.start_lateness.snapshot()
        document["start_lateness_ms"] = {"count": lateness.total, "p50": lateness.quantile(0.5),
                                         "p99": lateness.quantile(0.99)}
        if self.consumer_lag is not None:
            document["consumer_lag"] = dict(self.consumer_lag)
        return document
