"""`Outcomes`: what a finished attempt must make durable before its message may be
committed, decided on the main loop and queued for the settler as a `settle.Plan`.

- done: a `done` report;
- the payload cannot be decoded, a permanent error (`policy.is_permanent`), or the
  last attempt allowed failed: a dead letter (`dead_letters`) and a `dead` report;
- `EffectBusy` (another copy of the same attempt holds an effect's claim): the same
  attempt again after the backoff (at least 1 s), with no report;
- any other failure: a `failed` report and the next attempt, stored to run after the
  handler's own `RetryableError(delay_s=...)` if it is sane, else the backoff with
  full jitter (`retry_delay_s`).

A message that never reaches a handler (undecodable, or of a type the app has no
handler for) is dead-lettered through `dead` as well. Deliveries merged into a job (the
same attempt received twice) are settled with it, after its own plan, with nothing to
write. The settler (`settle`) does the writing; nothing here does I/O.
"""

from __future__ import annotations

import logging
import math
import traceback
from collections.abc import Callable
from dataclasses import replace

from scheduler.errors import SchedulerError
from scheduler.model import MAX_RETRY_DELAY_S, MESSAGE_ID_SLICE, Message, TaskId
from scheduler.ports import Delivery, StatusReport, TaskStatus
from scheduler.ports.workflows import MemberOutcome
from scheduler.visibility.history import AttemptRecord
from scheduler.worker import dead_letters
from scheduler.worker.context import EffectBusy
from scheduler.worker.job import Job
from scheduler.worker.policy import (
    Policy,
    RetryableError,
    attempts_allowed,
    backoff_s,
    is_permanent,
)
from scheduler.worker.settle import Plan
from scheduler.worker.stats import WorkerStats
from scheduler.worker.visible import WorkerVisibility
from scheduler.workflows.steps import StepCancelled, end_of

log = logging.getLogger("scheduler.worker.runtime")  # the worker logs under one name, whichever part writes


class Outcomes:
    """Turns outcomes into plans for `submit` (the settler's queue); counts `done`,
    `retried`, `deferred`, `dead` and the timeouts of `async` handlers."""

    def __init__(self, stats: WorkerStats, submit: Callable[[Plan], None], clock_ms: Callable[[], int],
                 member: str | None = None) -> None:
        self._stats = stats
        self._member = member
        self._submit = submit
        self._clock_ms = clock_ms
        self.visible: WorkerVisibility | None = None
        """Told of every attempt that ends (`scheduler status`)."""

    def settle(self, job: Job, error: BaseException | None, payload_error: str | None,
               result: bytes | None = None) -> None:
        """Plan the job's outcome (`error` None: done; `result`: a workflow step's), then
        settle its followers."""
        self._plan(job, error, payload_error, result)
        for delivery in job.followers:  # settled once the outcome itself is
            if self.visible is not None and delivery[:3] != job.delivery[:3]:
                # A second message of the attempt (published twice), not the same one delivered again.
                self.visible.skipped(job.message.task, cancelled=False)
            self._submit(Plan(delivery))

    def _plan(self, job: Job, error: BaseException | None, payload_error: str | None,
              result: bytes | None = None) -> None:
        task = job.message.task
        delivery = job.delivery
        if error is None:
            self._stats.done += 1
            self._stats.count("done", task)
            if self.visible is not None:
                self.visible.ended("done", task)
            self._submit(Plan(delivery, report=StatusReport(task.id, task.attempt, TaskStatus.DONE,
                                                            record=self._record(job, delivery, "done", None)),
                              step=end_of(task, MemberOutcome.DONE, result)))
            return
        if isinstance(error, StepCancelled):  # its workflow is cancelled: never run, recorded cancelled
            self._stats.skipped_cancelled += 1
            self._stats.count("skipped_cancelled", task)
            if self.visible is not None:
                self.visible.skipped(task, cancelled=True)
            self._submit(Plan(delivery, report=StatusReport(task.id, task.attempt, TaskStatus.CANCELLED, str(error)),
                              step=end_of(task, MemberOutcome.CANCELLED)))
            return
        text = describe(error)
        policy = job.handler.policy
        if payload_error is not None:
            self.dead(delivery, job.message, dead_letters.UNDECODABLE, payload_error, job)
            return
        if is_permanent(error, policy):
            self.dead(delivery, job.message, dead_letters.PERMANENT, text, job)
            return
        if isinstance(error, TimeoutError) and job.handler.is_async:
            self._stats.timed_out += 1
        if isinstance(error, EffectBusy):
            # Another copy of this attempt holds the effect's claim right now: try this
            # copy again later as the same attempt, with no report. It costs no attempt,
            # and it can never end the task `dead` while the other copy ends it `done`.
            wait_s = max(1.0, backoff_s(task.attempt, policy))
            self._stats.deferred += 1
            self._stats.count("deferred", task)
            if self.visible is not None:
                self.visible.skipped(task, cancelled=False)  # its copy is fired again, as a new message
            self._submit(Plan(delivery, retry=replace(task, run_at_ms=self._clock_ms() + int(wait_s * 1000))))
            return
        if task.attempt >= attempts_allowed(task.max_attempts, policy):
            self.dead(delivery, job.message, dead_letters.EXHAUSTED, text, job)
            return
        delay_s = retry_delay_s(error, task.attempt, policy)
        retry = replace(task, attempt=task.attempt + 1, run_at_ms=self._clock_ms() + int(delay_s * 1000))
        self._stats.retried += 1
        self._stats.count("retried", task)
        if self.visible is not None:
            self.visible.ended("retried", task)
        self._submit(Plan(delivery, report=StatusReport(task.id, task.attempt, TaskStatus.FAILED, text,
                                                        self._record(job, delivery, "failed", text)),
                          retry=retry))

    def dead(self, delivery: Delivery, message: Message | None, reason: str, error: str,
             job: Job | None = None) -> None:
        """Dead-letter the delivery (`message` None: it could not be decoded; `job` None:
        it never started)."""
        self._stats.dead += 1
        task = None if message is None else message.task
        self._stats.count("dead", task)
        if task is not None and self.visible is not None:
            self.visible.ended("dead", task)
        task_id = task.id if task is not None else _id_of(delivery.value)
        letter = dead_letters.DeadLetter(
            message=delivery.value, task_id=task_id, tenant=task.tenant if task else None,
            type=task.type if task else None, attempt=task.attempt if task else 0, reason=reason, error=error,
            source_topic=delivery.topic, dead_at_ms=self._clock_ms(),
        )
        report = None
        if task is not None:
            text = dead_letters.bounded(f"{reason}: {error}")
            report = StatusReport(task.id, task.attempt, TaskStatus.DEAD, text,
                                  self._record(job, delivery, "dead", text))
        log.warning("dead-lettered %s (%s): %s", task_id or f"{delivery.topic}@{delivery.offset}", reason, error)
        step = None if task is None else end_of(task, MemberOutcome.DEAD, error=dead_letters.bounded(error))
        self._submit(Plan(delivery, report=report, dead_letter=dead_letters.encode_dead_letter(letter), step=step))


    def _record(self, job: Job | None, delivery: Delivery, outcome: str, error: str | None) -> str:
        """The attempt's history record, written with the report that ends it."""
        task = job.message.task if job is not None else None
        return AttemptRecord(task.attempt if task else 0, delivery.timestamp_ms,
                             job.started_ms if job is not None and job.started_ms else None, self._clock_ms(),
                             self._member, outcome, None if error is None else dead_letters.bounded(error)).encode()




def retry_delay_s(error: BaseException, failed_attempt: int, policy: Policy) -> float:
    """The handler's own `delay_s` if it is a sane number of seconds, else the backoff.
    (A NaN, a negative or an absurd delay must not crash the main loop of every worker
    the message reaches.)"""
    asked = error.delay_s if isinstance(error, RetryableError) else None
    if isinstance(asked, int | float) and math.isfinite(asked) and 0 <= asked <= MAX_RETRY_DELAY_S:
        return float(asked)
    if asked is not None:
        log.warning("ignoring RetryableError(delay_s=%r): not a number of seconds from 0 to %d", asked,
                    MAX_RETRY_DELAY_S)
    return backoff_s(failed_attempt, policy)


def describe(error: BaseException) -> str:
    """The error as a dead letter or a status shows it: type, message, and the last
    frames of the traceback (bounded)."""
    frames = traceback.format_exception(error, limit=-3)
    return dead_letters.bounded("".join(frames).strip())


def _id_of(value: bytes) -> TaskId | None:
    """The task id of an undecodable message, if its bytes still hold one."""
    try:
        return TaskId.from_bytes(value[MESSAGE_ID_SLICE])
    except SchedulerError:
        return None
