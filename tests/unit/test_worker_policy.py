"""Retry policy layering, permanence, backoff with full jitter; weighted serving; commit
positions; dead-letter records."""

from __future__ import annotations

import random
import statistics
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler.errors import ConfigError
from scheduler.model import TaskId
from scheduler.ports import Delivery, StatusReport, TaskStatus
from scheduler.worker import App, PermanentError, Policy, RetryableError, dead_letters
from scheduler.worker.policy import attempts_allowed, backoff_s, backoff_window_s, is_permanent
from scheduler.worker.progress import Progress
from scheduler.worker.serving import WeightedServing
from scheduler.worker.settle import coalesce
from tests.tasks import NINE_OCLOCK_MS


class InvalidNumber(Exception):
    pass


def test_a_type_policy_overrides_the_app_policy_field_by_field() -> None:
    app = App("t", backoff_base_s=2, backoff_cap_s=30, timeout_s=5)
    app.register("sms", lambda ctx, payload: None, Policy(backoff_cap_s=8, pool="long"))
    policy = app.lookup("sms").policy  # type: ignore[union-attr]
    assert (policy.backoff_base_s, policy.backoff_cap_s, policy.timeout_s, policy.pool) == (2, 8, 5, "long")
    assert app.types() == ["sms"] and app.types("default") == [] and app.types("long") == ["sms"]


def test_a_policy_may_lower_a_tasks_attempts_never_raise_them() -> None:
    assert attempts_allowed(5, Policy()) == 5
    assert attempts_allowed(5, Policy(max_attempts=1)) == 1
    assert attempts_allowed(3, Policy(max_attempts=10)) == 3


def test_bad_registrations_are_clear_errors() -> None:
    app = App()
    app.register("sms", lambda ctx, payload: None)
    with pytest.raises(ConfigError, match="already has a handler"):
        app.register("sms", lambda ctx, payload: None)
    with pytest.raises(ConfigError, match="pool"):
        Policy(pool="fast")
    with pytest.raises(ConfigError, match="timeout_s"):
        Policy(timeout_s=0)
    with pytest.raises(ConfigError, match="exception types"):
        Policy(retry_on=("ValueError",))  # type: ignore[arg-type]


def test_which_errors_are_permanent() -> None:
    default = App().policy
    assert is_permanent(PermanentError("bad number"), default)
    assert not is_permanent(ValueError("flaky"), default)
    assert not is_permanent(TimeoutError(), default)
    declared = Policy(permanent_on=(InvalidNumber,)).over(default)
    assert is_permanent(InvalidNumber(), declared) and not is_permanent(ValueError(), declared)
    only_io = Policy(retry_on=(OSError,)).over(default)
    assert not is_permanent(ConnectionError(), only_io) and is_permanent(KeyError(), only_io)
    assert not is_permanent(RetryableError("asked"), only_io)


def test_backoff_windows_double_up_to_the_cap() -> None:
    policy = Policy(backoff_base_s=1, backoff_cap_s=10, jitter="none")
    assert [backoff_window_s(n, policy) for n in range(1, 7)] == [1, 2, 4, 8, 10, 10]
    assert [backoff_s(n, policy) for n in range(1, 5)] == [1, 2, 4, 8]
    assert backoff_window_s(500, policy) == 10  # no overflow for absurd attempt numbers


def test_full_jitter_spreads_retries_over_the_window_and_the_mean_doubles() -> None:
    policy = Policy(backoff_base_s=1, backoff_cap_s=300, jitter="full")
    rng = random.Random(1)
    draws = {n: [backoff_s(n, policy, rng.uniform) for _ in range(4000)] for n in (1, 2, 3, 4)}
    for n, values in draws.items():
        window = 2 ** (n - 1)
        assert all(0 <= v <= window for v in values)
        # Spread: the draws fill the window rather than bunching (a lockstep retry would
        # put them all at one point). Ten equal bins each get a fair share.
        bins = Counter(min(int(v / window * 10), 9) for v in values)
        assert min(bins.values()) > 0.6 * len(values) / 10
    means = [statistics.fmean(draws[n]) for n in (1, 2, 3, 4)]
    assert all(1.8 < later / earlier < 2.2 for earlier, later in zip(means, means[1:], strict=False))


def test_weighted_serving_is_7_2_1_under_a_full_backlog_and_interleaved() -> None:
    serving = WeightedServing({"high": 7, "normal": 2, "low": 1})
    picks = [serving.pick(lambda topic: True) for _ in range(1000)]
    assert Counter(picks) == {"high": 700, "normal": 200, "low": 100}
    for start in range(0, 1000, 10):  # every window of 10 holds exactly one low
        assert picks[start:start + 10].count("low") == 1
    assert max(len(run) for run in "".join(str(p)[0] for p in picks).split("n")) < 7  # high is interleaved


def test_weighted_serving_gives_an_empty_topics_share_to_the_others() -> None:
    serving = WeightedServing({"high": 7, "normal": 2, "low": 1})
    assert Counter(serving.pick(lambda t: t != "high") for _ in range(300)) == {"normal": 200, "low": 100}
    assert serving.pick(lambda t: False) is None
    assert [serving.pick(lambda t: t == "low") for _ in range(3)] == ["low"] * 3


@given(st.permutations(list(range(30))), st.integers(0, 30))
def test_the_commit_position_never_passes_an_unsettled_message(order: list[int], settled_count: int) -> None:
    progress = Progress()
    for offset in range(100, 130):
        progress.received(("t", 0), offset)
    settled = {100 + n for n in order[:settled_count]}
    for offset in settled:
        progress.settle(("t", 0), offset)
    position = progress.positions().get(("t", 0))
    expected = 100
    while expected in settled:
        expected += 1
    assert position == (None if expected == 100 else expected)
    assert progress.outstanding() == 130 - expected


def test_a_forgotten_partition_is_never_committed() -> None:
    progress = Progress()
    progress.received(("t", 1), 5)
    progress.forget([("t", 1)])
    progress.settle(("t", 1), 5)
    assert progress.positions() == {}
    progress.received(("t", 2), 7)
    progress.settle(("t", 2), 7)
    assert progress.positions() == {("t", 2): 8}


def test_coalescing_keeps_the_report_the_store_would_keep() -> None:
    task = TaskId.new(NINE_OCLOCK_MS)
    other = TaskId.new(NINE_OCLOCK_MS)
    third = TaskId.new(NINE_OCLOCK_MS)
    reports = [StatusReport(task, 1, TaskStatus.RUNNING), StatusReport(task, 1, TaskStatus.DONE),
               StatusReport(other, 3, TaskStatus.RUNNING), StatusReport(other, 2, TaskStatus.FAILED, "x"),
               StatusReport(third, 2, TaskStatus.FAILED, "x"), StatusReport(third, 1, TaskStatus.DONE),
               StatusReport(third, 3, TaskStatus.RUNNING)]
    kept = {report.task_id: report for report in coalesce(reports)}
    assert kept == {task: StatusReport(task, 1, TaskStatus.DONE), other: StatusReport(other, 3, TaskStatus.RUNNING),
                    third: StatusReport(third, 1, TaskStatus.DONE)}  # what has finished stays finished


def test_dead_letters_and_replay_markers_round_trip() -> None:
    task_id = TaskId.new(NINE_OCLOCK_MS)
    letter = dead_letters.DeadLetter(b"\x93raw", task_id, "board", "sms", 3, dead_letters.EXHAUSTED,
                                     "E" * 5000, "scheduler.ready.high", NINE_OCLOCK_MS)
    records = [
        Delivery("dead", 0, 0, dead_letters.encode_dead_letter(letter), 0),
        Delivery("dead", 0, 1, dead_letters.encode_dead_letter(dead_letters.DeadLetter(
            b"junk", None, None, None, 0, dead_letters.UNDECODABLE, "not msgpack", "t", NINE_OCLOCK_MS)), 0),
        Delivery("dead", 0, 2, b"\xc1garbage", 0),
        Delivery("dead", 0, 3, dead_letters.encode_replayed(dead_letters.Replayed("0:1", task_id, 1)), 0),
    ]
    waiting, replayed, unreadable = dead_letters.waiting(records)
    assert [w.letter for w in waiting] == ["0:0"] and list(replayed) == ["0:1"] and unreadable == 1
    (read,) = waiting
    assert (read.task_id, read.tenant, read.type, read.attempt, read.message) == (task_id, "board", "sms", 3, b"\x93raw")
    assert len(read.error) < 2100 and read.error.endswith("[3000 more characters]")
