"""What a worker does just before a step's handler (`scheduler.workflows.steps.before`,
and `before_async` for an `async` one): a check that answered, or was resumed, late is
made again, so a cancel that returned is never missed."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from scheduler.model import Task, TaskId
from scheduler.worker.context import EffectBusy
from scheduler.workflows import steps
from scheduler.workflows.engine import StepStart

TASK = Task(TaskId.for_key(1_700_000_000_000, "board", "workflow/w/a/0"), "board", "step", b"\xc0",
            1_700_000_000_000, idempotency_key="workflow/w/a/0")


class Checks:
    """A store whose checks answer as listed: (seconds the check takes, its answer)."""

    def __init__(self, answers: list[tuple[float, StepStart]]) -> None:
        self.answers = iter(answers)
        self.now = 0.0
        self.made = 0

    def start_check(self, task: Task) -> StepStart:
        took, answer = next(self.answers)
        self.made += 1
        self.now += took
        return answer

    def clock(self) -> float:
        return self.now


RUNNING = StepStart()
CANCELLED = StepStart(cancelled=True)


def before(checks: Checks) -> StepStart:
    flows: Any = checks
    return steps.before(flows, TASK, clock=checks.clock)


def test_a_prompt_check_is_made_once() -> None:
    checks = Checks([(0.01, RUNNING)])
    assert before(checks) == RUNNING and checks.made == 1


def test_a_late_running_is_not_trusted_and_the_check_again_finds_the_cancel() -> None:
    checks = Checks([(3.0, RUNNING), (0.01, CANCELLED)])
    with pytest.raises(steps.StepCancelled):
        before(checks)
    assert checks.made == 2


def test_a_store_slow_every_time_defers_the_attempt_rather_than_start_it_unchecked() -> None:
    """Deferred as a busy effect is (the same attempt later, no report): a slow store
    never uses up the step's attempts."""
    def slow() -> Iterator[tuple[float, StepStart]]:
        while True:
            yield 1.0, RUNNING

    checks = Checks([])
    checks.answers = slow()
    with pytest.raises(steps.CheckTooSlow, match="too slow") as raised:
        before(checks)
    assert checks.made == steps.CHECK_TRIES and isinstance(raised.value, EffectBusy)


class LateResume(Checks):
    """Checks that answer as listed, whose coroutine the event loop then resumes
    `resume_s` later (another handler blocking the loop), each in turn."""

    def __init__(self, answers: list[tuple[float, StepStart]], resume_s: list[float]) -> None:
        super().__init__(answers)
        self.resume_s = iter(resume_s)


def before_async(checks: LateResume, monkeypatch: pytest.MonkeyPatch) -> StepStart:
    real_to_thread = asyncio.to_thread

    async def to_thread_then_late(function: Any, *args: Any) -> Any:
        result = await real_to_thread(function, *args)
        checks.now += next(checks.resume_s)  # the loop comes back to this coroutine only now
        return result

    monkeypatch.setattr(asyncio, "to_thread", to_thread_then_late)
    flows: Any = checks
    return asyncio.run(steps.before_async(flows, TASK, clock=checks.clock))


def test_an_async_steps_check_resumed_late_is_made_again_and_finds_the_cancel(monkeypatch: pytest.MonkeyPatch) -> None:
    checks = LateResume([(0.01, RUNNING), (0.01, CANCELLED)], resume_s=[3.0, 0.0])
    with pytest.raises(steps.StepCancelled):
        before_async(checks, monkeypatch)
    assert checks.made == 2


def test_an_async_steps_prompt_check_is_made_once(monkeypatch: pytest.MonkeyPatch) -> None:
    checks = LateResume([(0.01, RUNNING)], resume_s=[0.1])
    assert before_async(checks, monkeypatch) == RUNNING and checks.made == 1


def test_an_async_step_resumed_late_every_time_is_deferred(monkeypatch: pytest.MonkeyPatch) -> None:
    checks = LateResume([(0.01, RUNNING)] * steps.CHECK_TRIES, resume_s=[1.0] * steps.CHECK_TRIES)
    with pytest.raises(steps.CheckTooSlow, match="resumed"):
        before_async(checks, monkeypatch)
    assert checks.made == steps.CHECK_TRIES
