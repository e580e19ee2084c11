"""How long the visibility rows are kept, one rule for both backends (Cassandra's TTLs,
the embedded store's deletes).

Hour rows must outlive the fold that adds them into a snapshot (a dispatcher holding
shard 0 folds every past hour within minutes; a week leaves room for a deployment with
no dispatcher for days). Minute rows and lateness serve charts over the last hours.
A process's report expires a minute after its last write: `scheduler status` shows as
live only those heard from within `LIVE_MS`.
"""

from __future__ import annotations

HOUR_ROWS_KEPT_MS = 7 * 24 * 3_600_000
MINUTE_ROWS_KEPT_MS = 2 * 24 * 3_600_000
PROCESS_TTL_MS = 60_000
LIVE_MS = 10_000
"""A process whose last report is older than this is not shown as live."""
FOLD_GRACE_MS = 5 * 60_000
"""An hour is folded this long after it ended: writers write a row only during its own
period by their clock, so this is the clock skew and write delay the fold tolerates."""
