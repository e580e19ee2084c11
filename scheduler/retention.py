"""How long a task's rows are kept: one rule for both backends.

Every write into a task's partition `(minute_bucket, shard)` keeps what it writes until
`max(end of the minute, now) + retention` (`kept_until_ms`): a task submitted before its
minute, fired and finished within it, is kept until its minute plus the retention, with
every cell of the partition ending together; a write after the minute (a task submitted
late, a status reported late) keeps its cells the retention from that write. Nothing is
scanned and nothing deleted on Cassandra, where each write carries the TTL that ends
then (`ttl_s`) and whole SSTables age out together; the embedded store deletes rows past
their `kept_until` a bounded number at a time.

Why the minute and not the moment a task finished: the finish is known only to the
worker's status write, which cannot give the payload cells written at submit a new TTL
without writing them again. So a task far in the future keeps its rows until its minute
plus the retention; on Cassandra a task that never fired by then (an outage longer
than the retention) is removed too, which is why the default is days (the embedded
purge never passes a shard's cursor). And on Cassandra a task whose retries run longer
than the retention after its minute loses its fields before its last status: it reads
as expired while its retries still run.

One write is kept longer: a cancel writes the task's row again with at least
`cancel_kept_s`: the longest a retry may wait, plus the longest it may then wait to be
fired and consumed, plus a day. A retry scheduled before the cancel then finds the
cancel in the home row, whatever the retention; without it, a retention shorter than a
retry's wait would let a cancelled task run again. (An attempt still running more than
a day after the cancel, that then fails, schedules a retry the floor may not cover.)

The retention is recorded in the store (`scheduler retention set`), so every process
writing a partition gives it the same end; a process reads it when it opens the store.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime

from scheduler.errors import ConfigError
from scheduler.model import BUCKET_MS, MAX_RETRY_DELAY_S, TaskId, minute_bucket
from scheduler.settings import QUEUE_RETENTION_MS

DEFAULT_RETENTION_S = 7 * 86_400
MIN_RETENTION_S = 60
"""Shortest retention: below a minute a task due now could expire before a busy
dispatcher fires it. A production store should keep days (the outage it outlives)."""
MAX_RETENTION_S = 3_650 * 86_400
"""Ten years: longer is keeping forever, and Cassandra's TTLs end at 20 years."""
LAST_EXPIRY_S = 2**31 - 1 - 86_400
"""Latest moment (epoch s) a Cassandra cell may expire: 5.0 in its default storage
compatibility mode stores expiry times as 32-bit seconds (2038-01-19), and rejects a
write past them. A day short of it, for clock skew between client and server. A write
that would expire later carries no TTL at all: a task due after about 2038 is kept
with no expiry, never refused and never cut short."""

def cancel_kept_s(retention_s: int) -> int:
    """Least a cancel keeps the task's row: the longest wait of a retry it stops, plus the
    longest that retry may then lie unfired or unconsumed (the retention, or the queues'
    7 days, whichever is longer), plus a day. 15 days at the default retention."""
    return int(MAX_RETRY_DELAY_S) + max(retention_s, QUEUE_RETENTION_MS // 1000) + 86_400

_DURATION = re.compile(r"(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?")


def parse_retention(text: str) -> int:
    """`7d`, `36h`, `1d12h`, `90m` or plain seconds: a retention in whole seconds,
    within `MIN_RETENTION_S` and `MAX_RETENTION_S`."""
    stripped = text.strip()
    seconds: int | None = None
    if stripped.isdigit():
        seconds = int(stripped)
    else:
        match = _DURATION.fullmatch(stripped)
        if stripped and match is not None:
            days, hours, minutes, secs = (int(part) if part else 0 for part in match.groups())
            seconds = ((days * 24 + hours) * 60 + minutes) * 60 + secs
    if seconds is None:
        raise ConfigError(f"{text!r} is not a retention: use units such as 7d, 36h, 1d12h, 90m, or seconds")
    return check_retention(seconds)


def check_retention(seconds: int) -> int:
    if isinstance(seconds, bool) or not isinstance(seconds, int):
        raise ConfigError(f"a retention is a whole number of seconds, got {seconds!r}")
    if seconds < MIN_RETENTION_S:
        raise ConfigError(f"a retention of {describe(seconds)} is too short: at least {describe(MIN_RETENTION_S)}, "
                          "and days in production (a task not fired by then is removed too)")
    if seconds > MAX_RETENTION_S:
        raise ConfigError(f"a retention of {describe(seconds)} is too long: at most {describe(MAX_RETENTION_S)}")
    return seconds


def describe(seconds: int) -> str:
    """`7d`, `1d12h`, `90s`: the shortest form `parse_retention` reads back."""
    parts = []
    for unit, size in (("d", 86_400), ("h", 3_600), ("m", 60), ("s", 1)):
        count, seconds = divmod(seconds, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts) or "0s"


def expires_ms(bucket_ms: int, retention_s: int) -> int:
    """When the rows of the partition of minute `bucket_ms` written within its minute
    expire (later writes keep theirs longer: `kept_until_ms`)."""
    return bucket_ms + BUCKET_MS + retention_s * 1000


def oldest_keyed_run_ms(retention_s: int, now_ms: int) -> int:
    """The earliest `run_at` a task with an idempotency key may have to be stored at
    `now_ms`: one due earlier is in a partition past its retention (`expires_ms`), where
    a task its key named may have run and be gone, so storing it would run it again. A
    minute boundary: `run_at >= oldest_keyed_run_ms(r, now)` exactly when
    `now < expires_ms(minute_bucket(run_at), r)`."""
    last_expired = now_ms - BUCKET_MS - retention_s * 1000  # a bucket at or before this has expired
    return (last_expired // BUCKET_MS + 1) * BUCKET_MS


def task_expires_ms(task_id: TaskId, retention_s: int) -> int:
    """When the home row of `task_id` expires if it was written and ended within its
    minute (its id carries its minute)."""
    return expires_ms(minute_bucket(task_id.run_at_ms), retention_s)


def kept_until_ms(bucket_ms: int, retention_s: int, now_ms: int, *, floor_s: int = 0) -> int:
    """Until when a write at `now_ms` into the partition of minute `bucket_ms` keeps what
    it writes: the later of the minute's end and now, plus the retention, and at least
    `floor_s` from now."""
    return max(max(bucket_ms + BUCKET_MS, now_ms) + retention_s * 1000, now_ms + floor_s * 1000)


def ttl_s(bucket_ms: int, retention_s: int, now_ms: int, *, floor_s: int = 0) -> int:
    """The Cassandra TTL of that write: the seconds until `kept_until_ms`, rounded up
    (never 0, which means none). 0, no TTL, if it would end after `LAST_EXPIRY_S`."""
    end = kept_until_ms(bucket_ms, retention_s, now_ms, floor_s=floor_s)
    if end > LAST_EXPIRY_S * 1000:
        return 0
    return max(1, -(-(end - now_ms) // 1000))


def missing_task(task_id: TaskId, retention_s: int, now_ms: int) -> str:
    """What to tell someone who asked for a task the store does not have: past the
    retention, that it would have expired (an id says when its task was due, not that
    it was ever stored)."""
    expiry = task_expires_ms(task_id, retention_s)
    if now_ms < expiry:
        return f"no task with id {task_id}"
    return (f"no task with id {task_id}: it was due at {_iso(task_id.run_at_ms)}, and a task is kept for the "
            f"retention ({describe(retention_s)}) after its minute and its last report, so if it existed it has "
            f"expired (at {_iso(expiry)} if it ran on time)")


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
