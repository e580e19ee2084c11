"""Folding past hours into the snapshot, so that the totals of all time are read from one
snapshot and the hour or two since, however long the deployment has run.

A writer writes an hour's rows only during that hour by its own clock
(`EventCounter.take`), so once an hour has ended, plus `FOLD_GRACE_MS` for clocks and
writes in flight, its rows are final and the fold is a pure function of the previous
snapshot and that hour's rows: two folders, or one folding again after a crash, write
the same snapshot. The dispatcher that holds shard 0 folds (`Dispatcher`'s limits
thread calls `fold_hours`), bounded to `MAX_HOURS_PER_PASS` hours a call.
"""

from __future__ import annotations

import logging

from scheduler.ports import CountStore
from scheduler.visibility.counts import HOUR_MS, sum_rows
from scheduler.visibility.retention import FOLD_GRACE_MS

log = logging.getLogger(__name__)

MAX_HOURS_PER_PASS = 24


def foldable_through(now_ms: int) -> int:
    """The last hour whose rows are final at `now_ms`."""
    return (now_ms - FOLD_GRACE_MS) // HOUR_MS - 1


def fold_hours(store: CountStore, now_ms: int) -> int:
    """Fold every final hour after the snapshot into a new one (at most
    `MAX_HOURS_PER_PASS`); returns how many hours were folded."""
    snapshot = store.read_snapshot()
    if snapshot is None:
        return 0  # no writer has started yet: nothing to fold
    hour, totals = snapshot
    folded = 0
    last = foldable_through(now_ms)
    while hour < last and folded < MAX_HOURS_PER_PASS:
        nxt = hour + 1
        totals = sum_rows(store.read_hours([nxt]), totals)
        # Drops a snapshot more than a whole pass old: a reader, or a second folder during
        # a hand-over of shard 0, that read the pointer before this pass can still read
        # the snapshot it names (dropping the one just replaced would leave it an empty base).
        store.write_snapshot(nxt, totals, nxt - MAX_HOURS_PER_PASS - 2)
        hour = nxt
        folded += 1
    if folded:
        log.info("counts folded through hour %d (%d hours)", hour, folded, extra={"action": "counts_folded"})
    return folded
