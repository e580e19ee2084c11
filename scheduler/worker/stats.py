"""`WorkerStats`: a worker's counters, one object shared by its parts.

Each counter is written by the part that makes the event happen, on the main loop
(the one exception: `check_failures`, on a checker thread), and read by anyone: the
stats file's writer and the tests take them as they are, without a lock. The names
are the stats file's keys; keep them stable.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field


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
    served: dict[str, int] = field(default_factory=dict)
    started_ms: int = field(default_factory=wall_clock_ms)
