"""How long a task's rows are kept: one rule for both backends.

A task's rows (its home row with its status and history, and the rows of its retries)
expire `retention` after the end of the minute they are stored in: a partition
`(minute_bucket, shard)` expires whole, at `minute_bucket + 1 min + retention`. The
rule needs no scan and no delete on Cassandra, where every write into the partition
carries the TTL that ends at that moment (`ttl_s`), so whole SSTables age out together;
the embedded store deletes the partitions past it a bounded number of rows at a time.

Why the task's minute and not the moment it finished: the finish is known only to the
worker's status write, which cannot give the payload cells written at submit a new
TTL without writing them again. The minute is known to every writer, so every cell of
a partition ends together. A task far in the future therefore keeps its rows until
its minute plus the retention; a task that finished late (retries for days) keeps them
less long after finishing. A task that never fired by then (a dispatcher outage longer
than the retention) is gone too: the retention bounds the outage the store outlives,
hence the minimum and the default of days.

The retention is recorded in the store (`scheduler retention set`), so every process
writing a partition gives it the same end; a process reads it when it opens the store.
"""

from __future__ import annotations

import re

from scheduler.errors import ConfigError
from scheduler.model import BUCKET_MS, TaskId, minute_bucket

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
until deleted, never refused and never cut short."""

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
    """When the partition of minute `bucket_ms` expires, with everything in it."""
    return bucket_ms + BUCKET_MS + retention_s * 1000


def task_expires_ms(task_id: TaskId, retention_s: int) -> int:
    """When the home row of `task_id` expires (its id carries its minute)."""
    return expires_ms(minute_bucket(task_id.run_at_ms), retention_s)


def ttl_s(bucket_ms: int, retention_s: int, now_ms: int) -> int:
    """The TTL of a write into the partition of minute `bucket_ms` at `now_ms`: the
    seconds left until the partition expires, rounded up, at least 1 (a TTL of 0 means
    none). 0, no TTL, if the partition would expire after `LAST_EXPIRY_S`."""
    end = expires_ms(bucket_ms, retention_s)
    if end > LAST_EXPIRY_S * 1000:
        return 0
    return max(1, -(-(end - now_ms) // 1000))
