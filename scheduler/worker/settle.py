"""The settler: the worker's one thread that makes outcomes durable, off the handler path.

A handler's outcome needs writes before its message may be committed: the status
report (`done`, `failed`, `dead`), a retry copy of the task in the store (and on the
hand-off log when it falls due soon), a dead letter. The main loop queues each outcome
as a `Plan`; the settler takes whatever has queued (up to `max_batch`), writes it as a
few large requests (one store insert, one hand-off append, one dead-letter flush, one
status write grouped by partition into unlogged batches), and only then hands the
plans' deliveries back as settled, so the main loop may commit them.

Status reports coalesce: a `running` report (queued once a handler has run for
`execution.RUNNING_REPORT_AFTER_S`) is dropped if the same attempt's `done` is in the
same batch, so each attempt costs one status write, two only if it runs long.

A failed write is retried, with backoff, until it succeeds or the worker stops: an
outcome is never settled before it is durable, so a crash at any point loses nothing
(the message is delivered again, and the home-row check or the ledger absorbs the
repeat).

Completions (which attempts finished, for the dispatchers' concurrency caps) go to the
hand-off log from a thread of their own, gathered over a few batches: best effort, so
they never hold up a status write or a commit.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from scheduler.errors import QueueError, SchedulerError
from scheduler.model import MESSAGE_ID_SLICE, Task
from scheduler.ports import Delivery, Handoff, Publisher, StatusReport, TaskStatus, TaskStore, report_order
from scheduler.workflows.engine import StepEnd

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Plan:
    """What must be durable before `delivery` may be committed (None: a report only)."""

    delivery: Delivery | None
    report: StatusReport | None = None
    retry: Task | None = None
    dead_letter: bytes | None = None
    step: StepEnd | None = None
    """How a workflow step's attempt ended: recorded, with what follows from it, before
    the status (`scheduler.workflows.engine`)."""


@dataclass
class SettlerStats:
    batches: int = 0
    reports_submitted: int = 0
    """Status reports queued (the main loop's count; the rest are the settler's)."""
    reports_written: int = 0
    reports_coalesced: int = 0
    retries_stored: int = 0
    retries_handed_off: int = 0
    dead_letters: int = 0
    write_failures: int = 0
    queue_failures: int = 0
    """The part of `write_failures` that the queue refused (a dead letter's publish, a
    retry's hand-off); the rest were the store's."""
    completions_sent: int = 0
    completion_failures: int = 0
    last_error: str | None = field(default=None)


class Settler:
    def __init__(
        self,
        *,
        store: TaskStore,
        handoff: Handoff | None,
        publisher: Publisher,
        dead_letter_topic: str,
        on_settled: Callable[[list[Delivery]], None],
        handoff_window_ms: int = 120_000,
        interval_s: float = 0.2,
        max_batch: int = 5000,
        clock_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
        on_steps: Callable[[list[StepEnd]], None] | None = None,
    ) -> None:
        self._store = store
        self._on_steps = on_steps
        self._handoff = handoff
        self._publisher = publisher
        self._dead_letter_topic = dead_letter_topic
        self._on_settled = on_settled
        self._handoff_window_ms = handoff_window_ms
        self._interval_s = interval_s
        self._max_batch = max_batch
        self._clock_ms = clock_ms
        self._plans: queue.SimpleQueue[Plan] = queue.SimpleQueue()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="settler", daemon=True)
        self._finished: queue.SimpleQueue[list[bytes]] = queue.SimpleQueue()
        self._completer = threading.Thread(target=self._send_completions, name="completions", daemon=True)
        self._last_write = 0.0
        self._deadline = float("inf")
        self.stats = SettlerStats()

    def start(self) -> None:
        self._thread.start()
        if self._handoff is not None:
            self._completer.start()

    def submit(self, plan: Plan) -> None:
        if plan.report is not None:
            self.stats.reports_submitted += 1
        self._plans.put(plan)

    def begin_stop(self, timeout_s: float) -> None:
        """Settle what is queued (retrying failed writes until `timeout_s`), then stop;
        `stopped` tells when. What is left unsettled is delivered again."""
        self._deadline = time.monotonic() + timeout_s
        self._stopping.set()

    def stopped(self) -> bool:
        """The outcomes are settled and the last completions sent (or the deadline passed)."""
        done = not self._thread.is_alive() and not self._completer.is_alive()
        return done or time.monotonic() > self._deadline + 1.0

    def _run(self) -> None:
        while True:
            batch = self._take()
            if batch:
                self._settle(batch)
            elif self._stopping.is_set():
                return

    def _take(self) -> list[Plan]:
        try:
            first = self._plans.get(timeout=self._interval_s)
        except queue.Empty:
            return []
        batch = [first]
        # Let a burst gather for up to one interval since the last write began: when the
        # writes themselves take that long (a backlog), the next one starts at once.
        wait = self._last_write + self._interval_s - time.monotonic()
        if wait > 0 and not self._stopping.is_set():
            time.sleep(wait)
        while len(batch) < self._max_batch:
            try:
                batch.append(self._plans.get_nowait())
            except queue.Empty:
                break
        return batch

    def _settle(self, batch: list[Plan]) -> None:
        delay = 0.1
        while True:
            self._last_write = time.monotonic()
            try:
                completed = self._write(batch)
            except SchedulerError as exc:
                self.stats.write_failures += 1
                if isinstance(exc, QueueError):
                    self.stats.queue_failures += 1
                self.stats.last_error = str(exc)
                if self._stopping.is_set() and time.monotonic() > self._deadline:
                    log.error("stopping with %d outcomes not durable (they will be delivered again): %s",
                              len(batch), exc)
                    return
                log.warning("settling %d outcomes failed, retrying in %.1f s: %s", len(batch), delay, exc)
                time.sleep(delay)
                delay = min(delay * 2, 5.0)
                continue
            self.stats.batches += 1
            deliveries = [plan.delivery for plan in batch if plan.delivery is not None]
            self._complete(deliveries, completed)
            self._on_settled(deliveries)
            return

    def _complete(self, deliveries: Sequence[Delivery], completed: set[bytes]) -> None:
        """Queue these attempts' completions for the completions thread (but those
        already sent with their retry's hand-off)."""
        if self._handoff is None or not deliveries:
            return
        ids = [delivery.value[MESSAGE_ID_SLICE] for delivery in deliveries if len(delivery.value) >= 20]
        self._finished.put([task_id for task_id in ids if task_id not in completed] if completed else ids)

    def _send_completions(self) -> None:
        """Tell the shards' owners which attempts are over, so capped tenants get their
        places back: what has gathered, at most every `interval_s`. Best effort: a
        completion lost frees its place at the dispatcher's hold timeout."""
        assert self._handoff is not None
        while True:
            try:
                ids = self._finished.get(timeout=self._interval_s)
            except queue.Empty:
                if self._stopping.is_set() and not self._thread.is_alive():
                    return  # settled, and everything sent
                continue
            if not self._stopping.is_set():
                self._stopping.wait(self._interval_s)  # let a few settled batches gather
            while True:
                try:
                    ids.extend(self._finished.get_nowait())
                except queue.Empty:
                    break
            try:
                self._handoff.completed(ids)
            except Exception as exc:  # a hand-off outage must not stop the worker
                self.stats.completion_failures += 1
                log.warning("sending %d completions failed: %s", len(ids), exc)
            else:
                self.stats.completions_sent += len(ids)

    def _write(self, batch: Sequence[Plan]) -> set[bytes]:
        """Each kind of write at most once per batch; idempotent, so a retried batch
        repeats nothing harmful (a retry copy's row is fixed by its id and run_at).
        Returns the ids whose completions went out with their retries' hand-off."""
        completed: set[bytes] = set()
        ends = [plan.step for plan in batch if plan.step is not None]
        if ends and self._on_steps is not None:
            self._on_steps(ends)  # before the statuses: a step shown ended has its successors
        retries = [plan.retry for plan in batch if plan.retry is not None]
        if retries:
            failures = self._store.insert(retries)
            if failures:
                raise SchedulerError(f"{sum(len(f.tasks) for f in failures)} retry copies not stored: "
                                     f"{failures[0].reason}")
            self.stats.retries_stored += len(retries)
            now = self._clock_ms()
            soon = [task for task in retries if task.run_at_ms <= now + self._handoff_window_ms]
            if soon and self._handoff is not None:
                # The attempt's completion first, in the same partition: the owner frees
                # its place before the retry can take one. (From the completions thread it
                # could arrive after the retry was released, and free the retry's place.)
                completed = {task.id.bytes for task in soon}
                self._handoff.completed(list(completed))
                self._handoff.submitted(soon)
                self.stats.retries_handed_off += len(soon)
        letters = [plan.dead_letter for plan in batch if plan.dead_letter is not None]
        if letters:
            self._publisher.publish(self._dead_letter_topic, letters)
            self._publisher.flush(30.0)
            self.stats.dead_letters += len(letters)
        reports = coalesce([plan.report for plan in batch if plan.report is not None])
        if reports:
            self._store.record_status(reports)
            self.stats.reports_written += len(reports)
            self.stats.reports_coalesced += sum(plan.report is not None for plan in batch) - len(reports)
        return completed


def coalesce(reports: Sequence[StatusReport]) -> list[StatusReport]:
    """One report per task: the one the store would keep, by `report_order`."""
    best: dict[object, StatusReport] = {}
    for report in reports:
        held = best.get(report.task_id)
        if held is None or report_order(report.attempt, report.status) >= report_order(held.attempt, held.status):
            best[report.task_id] = report
    return list(best.values())


def running_report(task: Task) -> StatusReport:
    return StatusReport(task.id, task.attempt, TaskStatus.RUNNING)
