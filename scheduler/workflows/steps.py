"""What a worker does around a step's handler: the check before it starts, the result
after it returns, and `ctx.workflow`, through which a handler reads its predecessors'
results.

A step's result is what its handler returns, encoded as msgpack, at most
`MAX_RESULT_BYTES` (16 KiB); a result that cannot be encoded, or is larger, ends the
step dead with a `PermanentError` saying so (a retry would return the same). A task
that is not a step is run as before, its return value ignored.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from scheduler.errors import InvalidPayload
from scheduler.model import Task, decode_payload, encode_payload
from scheduler.ports.workflows import MemberOutcome
from scheduler.worker.context import EffectBusy
from scheduler.worker.policy import PermanentError
from scheduler.workflows.definition import MAX_RESULT_BYTES, parse_step_key
from scheduler.workflows.engine import StepEnd, StepStart, Workflows


class CheckTooSlow(EffectBusy):
    """The store answered the check before a step too slowly, `CHECK_TRIES` times: the
    same attempt is tried again after a backoff, with no report, as for a busy effect;
    a slow store never uses up a step's attempts."""


class StepCancelled(Exception):
    """The step's workflow is cancelled: the task is recorded cancelled, never run."""


@dataclass
class StepContext:
    """`ctx.workflow` of a step's handler (None for any other task)."""

    workflows: Workflows
    tenant: str
    workflow_id: str
    step: str
    index: int

    @property
    def input(self) -> Any:
        """The result of the member this one follows (`each_of`), or None: one read of
        that member's row, not of the whole step (a 4,000-wide `each_of` reads 4,000
        rows in all, not 4,000 squared)."""
        definition = self.workflows.definition(self.tenant, self.workflow_id)
        spec = None if definition is None else definition.by_name.get(self.step)
        if spec is None or spec.each_of is None:
            return None
        _, _, result = self.workflows.store.start_check(self.tenant, self.workflow_id, spec.each_of, self.index)
        return decoded(result)

    def results(self, step: str) -> list[Any]:
        """The results of every member of `step`, in index order (None where a member
        returned nothing or has not ended): what a join reads of the steps it waited for."""
        return self.workflows.results(self.tenant, self.workflow_id, step)


def step_context(workflows: Workflows | None, task: Task) -> StepContext | None:
    parsed = None if workflows is None else parse_step_key(task.idempotency_key)
    if workflows is None or parsed is None:
        return None
    return StepContext(workflows, task.tenant, *parsed)


FRESH_S = 0.5
"""A check older than this when it answers is made again: a cancel waits
`scheduler.cancels.SETTLE_MS` (2 s) after its write, so a state read sent before the
cancel and answered within this, followed at once by the handler, starts the handler
before the cancel returns."""
CHECK_TRIES = 5


def before(workflows: Workflows, task: Task, clock: Callable[[], float] = time.monotonic) -> StepStart:
    """`StepCancelled` for a step of a cancelled workflow; otherwise what to do. Called
    just before the handler, on its thread. A check that took longer than `FRESH_S` is
    made again (after `CHECK_TRIES` slow ones, `CheckTooSlow`: the same attempt later)."""
    return _verdict(task, _fresh_check(workflows, task, clock)[0])


async def before_async(workflows: Workflows, task: Task, clock: Callable[[], float] = time.monotonic) -> StepStart:
    """`before` for an `async` handler, its check run on a thread. The event loop may
    resume this coroutine late (another handler blocking it), so the check is good only
    if the coroutine resumed within `FRESH_S` of sending it; else it is made again
    (after `CHECK_TRIES` late ones, `CheckTooSlow`)."""
    for _ in range(CHECK_TRIES):
        start, sent = await asyncio.to_thread(_fresh_check, workflows, task, clock)
        if clock() - sent <= FRESH_S:
            return _verdict(task, start)
    raise CheckTooSlow(f"the workflow check of step {task.idempotency_key} resumed over {FRESH_S} s after it was "
                       f"sent {CHECK_TRIES} times: the worker is too busy to start it safely")


def _fresh_check(workflows: Workflows, task: Task, clock: Callable[[], float]) -> tuple[StepStart, float]:
    """The step's start check, answered within `FRESH_S` of being sent, and when it was sent."""
    for _ in range(CHECK_TRIES):
        sent = clock()
        start = workflows.start_check(task)
        if clock() - sent <= FRESH_S:
            return start, sent
    raise CheckTooSlow(f"the workflow check of step {task.idempotency_key} took over {FRESH_S} s {CHECK_TRIES} "
                       "times: the store is too slow to start it safely")


def _verdict(task: Task, start: StepStart) -> StepStart:
    if start.cancelled:
        raise StepCancelled(f"workflow of step {task.idempotency_key} is cancelled")
    return start


def encode_result(value: Any) -> bytes | None:
    if value is None:
        return None
    try:
        return encode_payload(value, max_bytes=MAX_RESULT_BYTES)
    except InvalidPayload as exc:
        raise PermanentError(f"a step's result must be msgpack-encodable and at most {MAX_RESULT_BYTES // 1024} "
                             f"KiB: {exc}") from None


def decoded(result: bytes | None) -> Any:
    return None if result is None else decode_payload(result)


def end_of(task: Task, outcome: MemberOutcome, result: bytes | None = None, error: str | None = None
           ) -> StepEnd | None:
    """The `StepEnd` to record for this task's attempt, or None for a task that is not a step."""
    if parse_step_key(task.idempotency_key) is None:
        return None
    return StepEnd(task, outcome, result, error)
