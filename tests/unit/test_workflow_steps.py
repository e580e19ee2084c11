"""What a worker does just before a step's handler (`scheduler.workflows.steps.before`):
a check that answered late is made again, so a cancel that returned is never missed."""

from __future__ import annotations

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
