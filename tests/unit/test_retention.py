"""The retention rule (`scheduler.retention`): what it reads, what it refuses, and how long
each write keeps what it writes."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler import retention
from scheduler.errors import ConfigError
from scheduler.model import BUCKET_MS, TaskId, minute_bucket

DAY_S = 86_400
NOW = 1_796_202_000_250  # 2026-12-02T09:00:00.250Z


@pytest.mark.parametrize(("text", "seconds"), [
    ("7d", 7 * DAY_S), ("36h", 36 * 3600), ("1d12h", 36 * 3600), ("90m", 5400), ("3600", 3600), (" 2d ", 2 * DAY_S),
    ("1h30m15s", 5415), ("3650d", 3650 * DAY_S), ("1h", 3600),
])
def test_durations_read_as_seconds(text: str, seconds: int) -> None:
    assert retention.parse_retention(text) == seconds


@pytest.mark.parametrize(("text", "reason"), [
    ("", "not a retention"), ("soon", "not a retention"), ("1.5d", "not a retention"), ("-1d", "not a retention"),
    ("7 d", "not a retention"), ("d", "not a retention"), ("59", "too short"), ("0", "too short"),
    ("59s", "too short"), ("3651d", "too long"), ("1m", "too short"), ("59m59s", "too short"), ("3599", "too short"),
])
def test_bad_retentions_are_refused_with_the_reason(text: str, reason: str) -> None:
    with pytest.raises(ConfigError, match=reason):
        retention.parse_retention(text)


@pytest.mark.parametrize("value", [True, 60.0, "60", None])
def test_a_retention_is_a_whole_number_of_seconds(value: object) -> None:
    with pytest.raises(ConfigError, match="whole number"):
        retention.check_retention(value)  # type: ignore[arg-type]


def test_the_command_refuses_what_would_not_outlast_a_stalled_dispatcher() -> None:
    """The floor covers a dead dispatcher's lease and the sweep's default horizon, with
    room for a stall; the reason says why. A store still takes a minute (for tests)."""
    from scheduler.dispatcher.shard import DEFAULT_HORIZON_MS

    assert retention.SHORTEST_SET_S >= 10 + DEFAULT_HORIZON_MS // 1000 + 600
    with pytest.raises(ConfigError, match="at least 1h, to outlast a dispatcher that stalls"):
        retention.parse_retention("30m")
    assert retention.check_retention(retention.MIN_RETENTION_S) == 60


@given(st.integers(min_value=retention.SHORTEST_SET_S, max_value=retention.MAX_RETENTION_S))
def test_describe_reads_back(seconds: int) -> None:
    assert retention.parse_retention(retention.describe(seconds)) == seconds


def test_a_partition_written_within_its_minute_ends_at_its_minute_plus_the_retention() -> None:
    bucket = minute_bucket(NOW + 3_600_000)
    for now in (NOW, NOW + 1_000, bucket + BUCKET_MS - 1):  # submit, a later write, a report within the minute
        assert retention.kept_until_ms(bucket, DAY_S, now) == bucket + BUCKET_MS + DAY_S * 1000
    assert retention.ttl_s(bucket, DAY_S, NOW) == -(-(bucket + BUCKET_MS + DAY_S * 1000 - NOW) // 1000)


@given(late_ms=st.integers(min_value=0, max_value=30 * DAY_S * 1000), retention_s=st.integers(60, 30 * DAY_S))
def test_a_write_keeps_what_it_writes_at_least_the_retention(late_ms: int, retention_s: int) -> None:
    bucket = minute_bucket(NOW)
    now = bucket + late_ms
    until = retention.kept_until_ms(bucket, retention_s, now)
    assert until >= now + retention_s * 1000
    assert until >= bucket + BUCKET_MS + retention_s * 1000
    ttl = retention.ttl_s(bucket, retention_s, now)
    assert ttl >= retention_s and now + ttl * 1000 >= until > now + (ttl - 1) * 1000


def test_a_cancel_keeps_the_row_as_long_as_a_retry_may_wait() -> None:
    bucket = minute_bucket(NOW)
    assert retention.cancel_kept_s(60) == retention.cancel_kept_s(DAY_S) == 15 * DAY_S  # the queues' 7 days count
    assert retention.cancel_kept_s(30 * DAY_S) == 38 * DAY_S
    assert retention.ttl_s(bucket, 60, NOW, floor_s=retention.cancel_kept_s(60)) >= 15 * DAY_S
    assert retention.ttl_s(bucket, 60, NOW) <= 120


def test_a_partition_ending_after_the_last_expiry_cassandra_keeps_gets_no_ttl() -> None:
    last_bucket = minute_bucket(retention.LAST_EXPIRY_S * 1000)
    assert retention.ttl_s(last_bucket - 10 * BUCKET_MS - DAY_S * 1000, DAY_S, NOW) > 0
    assert retention.ttl_s(last_bucket, DAY_S, NOW) == 0  # 0: none, kept


def test_a_missing_task_past_the_retention_is_said_to_have_expired() -> None:
    recent = TaskId.new(NOW - 3_600_000)
    assert retention.missing_task(recent, DAY_S, NOW) == f"no task with id {recent}"
    old = TaskId.new(NOW - 2 * DAY_S * 1000)
    said = retention.missing_task(old, DAY_S, NOW)
    assert said.startswith(f"no task with id {old}: it was due at 2026-11-30T09:00:00Z") and "(1d)" in said
    assert "it has expired" in said
    assert retention.task_expires_ms(old, DAY_S) == minute_bucket(old.run_at_ms) + BUCKET_MS + DAY_S * 1000
