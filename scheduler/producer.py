"""The producer SDK: `Client.submit`, `submit_many`, `get` and `cancel` over any `TaskStore`.

A task is accepted once the store acknowledged its write: `submit` returns its id
only then, and `submit_many` counts an item as stored only then.

When is a task due?
-------------------
Pass `run_at` (an aware datetime), or `delay` (a `timedelta` or seconds from now), or
neither (due now). A `run_at` already in the past means "due now": without an
idempotency key the task is stored at the current time. A task due now may be behind
the dispatcher's cursor by the time it is stored; the hand-off (below) is what brings
it to the dispatcher.

What identifies a task
----------------------
Without an idempotency key, every `submit` makes a new task with a fresh random id.
With `idempotency_key=k`, the task is `(tenant, k, run_at to the millisecond)`: its id
is computed from exactly those three (`TaskId.for_key`), so a retried submit, from this
process or any other, writes the same row again instead of a second task. The rewrite
replaces type, payload, priority, max_attempts and cost and keeps the status, so a
retry never revives a cancelled or finished task. Because `run_at` is part of the
identity, a keyed submit needs an explicit `run_at` taken from the caller's own data
(for example `order.created_at + 15 minutes`); `delay=` is refused with a key, since
each retry would compute another time and name another task. A keyed `run_at` in the
past is kept as given, so that retries still agree, and such a task reaches the
dispatcher through the hand-off.

Hand-off
--------
Tasks due within `handoff_window_s` (two minutes by default) are, after the store
acknowledged them, also given to `handoff.submitted`, and a cancel of such a task to
`handoff.cancelled`, so the owner of the shard, which has already read that minute,
hears of them at once. `scheduler.connect()` makes a client with the hand-off of the
configured backend. A failed hand-off is a failed submit (`HandoffFailed`, or the item
in `SubmitReport.failed`): the task is stored and will fire, but late (see below), so
the caller must know. `submit_many` holds a chunk with such a task at most
`URGENT_FLUSH_MS` before writing it.

Without a hand-off (a `Client` built around a store of your own) nothing is lost: a
stored row is a promise, and the dispatchers find rows written behind their reads (a
second count of every slice a second after it fired, and sweeps behind the cursor;
see `scheduler.dispatcher.shard`). Such a task fires late: by about 2 s after its time
when written before it, within about 20 s when written up to a minute after it, and
within about 2 minutes when written up to 10 minutes after it. The one thing a hand-off is needed for is a task written more than
`LATE_WRITE_LIMIT_MS` (5 minutes) after its time, which only a keyed task can be: a
client without a hand-off refuses those (`InvalidTask`).

Cancels are definite: once `cancel` answered `CANCELLED`, no attempt of the task starts,
however the client was built (`scheduler.cancels`). For a task that may already be in
flight (due within minutes) the answer takes `cancels.SETTLE_MS` (2 s) to come;
`cancel_many` waits once for all.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal, Self

from scheduler import cancels, retention
from scheduler.errors import ConfigError, HandoffFailed, InvalidTask, QueueAccessDenied, StoreError
from scheduler.model import (
    DEFAULT_MAX_ATTEMPTS,
    LATE_WRITE_LIMIT_MS,
    MAX_ATTEMPTS_LIMIT,
    MAX_PAYLOAD_BYTES,
    Priority,
    Task,
    TaskId,
    check_cost,
    check_name,
    check_run_at_ms,
    encode_payload,
    to_ms,
    valid_max_attempts,
)
from scheduler.ports import CancelOutcome, Handoff, InsertFailure, StoredTask, TaskStore
from scheduler.visibility.counts import EventCounter, count_pairs
from scheduler.workflows.definition import KEY_PREFIX as STEP_KEY_PREFIX

if TYPE_CHECKING:
    from scheduler.workflows.engine import Workflows

log = logging.getLogger(__name__)

DEFAULT_CHUNK_SIZE = 50_000
"""Tasks `submit_many` holds before writing (about 20 MB with 100-byte payloads): when a
burst falls in one minute over 64 shards, ~780 tasks a partition, i.e. batches of
~200-260 rows, near the size the Cassandra store batches at best."""

DEFAULT_HANDOFF_WINDOW_S = 120.0

FLUSH_MS = 1000
"""Longest an item waits in `submit_many`'s chunk for more items (checked as items
arrive: an iterable that blocks holds its chunk until it yields or ends)."""

URGENT_FLUSH_MS = 50
"""The same for a chunk holding a task due within the hand-off window: such a task may
be due before a full chunk would be written."""

_PRIORITIES: dict[object, Priority] = {**{p: p for p in Priority}, **{p.value: p for p in Priority}}


@dataclass(frozen=True, slots=True)
class Submission:
    """One item for `submit_many`; the fields mean what `Client.submit`'s arguments mean."""

    type: str
    payload: Any = None
    tenant: str | None = None
    run_at: datetime | None = None
    delay: timedelta | float | None = None
    priority: str | Priority = Priority.NORMAL
    idempotency_key: str | None = None
    max_attempts: int | None = None
    cost: int = 1


@dataclass(frozen=True, slots=True)
class ItemError:
    """Why item `index` (0-based, in the order given) was not stored."""

    index: int
    reason: str
    task_id: TaskId | None = None


@dataclass
class SubmitReport:
    """The outcome of `submit_many`, item by item.

    Every item read from the iterable is in exactly one of three places: stored (its id
    in `ids`, when ids are kept), `rejected` (invalid, never sent) or `failed`: not
    acknowledged (it may or may not be stored) or, if due soon, stored but not handed to
    the dispatcher. Each failure names the task id it was given: writing that id again
    is safe, and so is submitting the item again if it has an idempotency key; an item
    without a key submitted again gets a new id, and may then exist twice. Items after
    `consumed` were not read, which happens only when the call stopped early.
    """

    consumed: int = 0
    stored: int = 0
    ids: list[TaskId | None] | None = field(default_factory=list)
    rejected: list[ItemError] = field(default_factory=list)
    failed: list[ItemError] = field(default_factory=list)
    stopped_early: bool = False

    @property
    def complete(self) -> bool:
        """All items were read and stored."""
        return not (self.rejected or self.failed or self.stopped_early)


Progress = Callable[[SubmitReport], None]


_MAX_DELAY_S = 1e11  # about 3,000 years: more is a mistake, and inf or nan is no time


def _check_text(what: str, text: str) -> None:
    """Strings are stored as UTF-8: a lone surrogate (which json.loads can produce from
    `"\\udc80"`) cannot be, so it is refused here rather than failing the write. For the
    idempotency key; the tenant and the type follow the stricter `check_name`."""
    if not text.isascii():
        try:
            text.encode()
        except UnicodeEncodeError:
            raise InvalidTask(f"the {what} {text!r} is not valid Unicode text (a lone surrogate)") from None


def _priority(value: object) -> Priority:
    try:
        found = _PRIORITIES.get(value)
    except TypeError:  # unhashable: certainly no priority
        found = None
    return found or Priority.parse(value)  # type: ignore[arg-type]


class Client:
    """Submits, reads and cancels tasks in a `TaskStore`.

    `tenant` is the default tenant of every call that names none. `now_ms` is injectable
    for tests. Thread-safe when the store is.
    """

    def __init__(
        self,
        store: TaskStore,
        *,
        tenant: str | None = None,
        handoff: Handoff | None = None,
        handoff_window_s: float = DEFAULT_HANDOFF_WINDOW_S,
        default_max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        max_payload_bytes: int = MAX_PAYLOAD_BYTES,
        chunk_size: int = DEFAULT_CHUNK_SIZE,
        now_ms: Callable[[], int] | None = None,
        closer: Callable[[], None] | None = None,
        sleep: Callable[[float], None] = time.sleep,
        events: EventCounter | None = None,
        workflows: Callable[[Client], Any] | None = None,
    ) -> None:
        if chunk_size < 1:
            raise ValueError("chunk_size must be positive")
        if not valid_max_attempts(default_max_attempts):
            raise ConfigError(f"max attempts must be from 1 to {MAX_ATTEMPTS_LIMIT}, got {default_max_attempts!r}")
        self.store = store
        self.tenant = tenant
        self.handoff = handoff
        self.handoff_window_ms = int(handoff_window_s * 1000)
        self.default_max_attempts = default_max_attempts
        self.max_payload_bytes = max_payload_bytes
        self.chunk_size = chunk_size
        self._now_ms = now_ms or (lambda: time.time_ns() // 1_000_000)
        self._last_run_at: tuple[datetime | None, int] = (None, 0)
        self._closer = closer
        self.cancel_settle_s = cancels.SETTLE_MS / 1000
        """How long a cancel of a task that may be in flight waits before it answers (see
        `scheduler.cancels`); lowering it breaks the promise that nothing starts after."""
        self._settle = sleep
        self._open_workflows = workflows
        self._workflows: Any = None
        self._workflows_lock = threading.Lock()
        self.events = events
        """Where this client counts the tasks it stored and cancelled, for `scheduler
        status` (`scheduler.connect` gives one; a client without counts nothing)."""

    @property
    def workflows(self) -> Workflows:
        """Workflows on this client's backend (`scheduler.workflows`): `submit`, `cancel`,
        `results`, `definition`. Opened on first use; a client of `scheduler.connect` has
        them, one made around a store of your own has none (`ConfigError`)."""
        with self._workflows_lock:
            if self._workflows is None:
                if self._open_workflows is None:
                    raise ConfigError("this client has no workflow store: make it with scheduler.connect()")
                self._workflows = self._open_workflows(self)
            return self._workflows  # type: ignore[no-any-return]

    # Closing.

    def close(self) -> None:
        """Close what was opened for this client (`scheduler.connect` passes its store and
        hand-off as `closer`); a client made around a store of your own leaves the store
        open. Closing again does nothing."""
        closer, self._closer = self._closer, None
        if closer is not None:
            closer()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # Building and checking a task.

    def task(
        self,
        type: str,
        payload: Any = None,
        *,
        tenant: str | None = None,
        run_at: datetime | None = None,
        delay: timedelta | float | None = None,
        priority: str | Priority = Priority.NORMAL,
        idempotency_key: str | None = None,
        max_attempts: int | None = None,
        cost: int = 1,
        now_ms: int | None = None,
    ) -> Task:
        """The task a `submit` with these arguments would store, or `InvalidTask` saying
        what is wrong. Nothing is written."""
        tenant = tenant if tenant is not None else self.tenant
        if not isinstance(tenant, str) or not tenant:
            raise InvalidTask("a task needs a tenant: pass tenant=..., or give the Client a default tenant")
        check_name("tenant", tenant)
        check_name("type", type)
        now = self._now_ms() if now_ms is None else now_ms
        if run_at is not None and delay is not None:
            raise InvalidTask("pass run_at or delay, not both")
        if idempotency_key is not None and run_at is None:
            raise InvalidTask(
                "an idempotency key needs an explicit run_at: the key names the task together with its time, "
                "and with delay= (or no time) every retry would compute another time and make another task. "
                "Derive run_at from your own data, e.g. order.created_at + timedelta(minutes=15)"
            )
        if run_at is not None:
            if not isinstance(run_at, datetime):
                raise InvalidTask(f"run_at must be an aware datetime, got {run_at!r}")
            cached = self._last_run_at  # submit_many's items often share one run_at object
            if cached[0] is run_at:
                run_at_ms = cached[1]
            else:
                run_at_ms = to_ms(run_at)
                self._last_run_at = (run_at, run_at_ms)
            if idempotency_key is None:
                run_at_ms = max(run_at_ms, now)
            elif self.handoff is None and run_at_ms < now - LATE_WRITE_LIMIT_MS:
                raise InvalidTask(
                    f"this task is due {(now - run_at_ms) / 1000:.0f} s ago, and a client without a hand-off can "
                    f"only submit a task up to {LATE_WRITE_LIMIT_MS // 1000} s after its time (dispatchers find "
                    "rows written later only through the hand-off): make the client with scheduler.connect()"
                )
            elif self.store is not None and run_at_ms < retention.oldest_keyed_run_ms(self.store.retention_s, now):
                # Its task, if it ran, is past the retention and gone: storing it again
                # would run it again rather than find it.
                raise InvalidTask(
                    f"this keyed task was due {(now - run_at_ms) / 86_400_000:.1f} days ago, past the store's "
                    f"retention ({retention.describe(self.store.retention_s)}): a key names one task only that "
                    "long, and a task it named then is gone; submit it without the key, or with a new one"
                )
        elif delay is not None:
            seconds = delay.total_seconds() if isinstance(delay, timedelta) else delay
            if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not 0 <= seconds < _MAX_DELAY_S:
                raise InvalidTask(f"delay must be a timedelta or a finite number of seconds, not negative; got {delay!r}")
            run_at_ms = check_run_at_ms(now + int(seconds * 1000))
        else:
            run_at_ms = now
        priority = _priority(priority)
        if max_attempts is None:
            max_attempts = self.default_max_attempts
        elif not valid_max_attempts(max_attempts):
            raise InvalidTask(f"max_attempts must be an integer from 1 to {MAX_ATTEMPTS_LIMIT}, got {max_attempts!r}")
        check_cost(cost)
        if idempotency_key is None:
            task_id = TaskId.new(run_at_ms)
        elif isinstance(idempotency_key, str) and idempotency_key:
            _check_text("idempotency key", idempotency_key)
            if idempotency_key.startswith(STEP_KEY_PREFIX):
                raise InvalidTask(f"idempotency keys starting {STEP_KEY_PREFIX!r} name workflow steps, which only a "
                                  "workflow creates (client.workflows.submit): choose another key")
            task_id = TaskId.for_key(run_at_ms, tenant, idempotency_key)
        else:
            raise InvalidTask("an idempotency key, when given, must be a non-empty string")
        return Task.unchecked(
            task_id, tenant, type, encode_payload(payload, max_bytes=self.max_payload_bytes), run_at_ms, priority,
            1, max_attempts, idempotency_key, cost,
        )

    # Writing.

    def submit(
        self,
        type: str,
        payload: Any = None,
        *,
        tenant: str | None = None,
        run_at: datetime | None = None,
        delay: timedelta | float | None = None,
        priority: str | Priority = Priority.NORMAL,
        idempotency_key: str | None = None,
        max_attempts: int | None = None,
        cost: int = 1,
    ) -> TaskId:
        """Store one task and return its id once the store acknowledged the write.

        `cost` is how many units of the tenant's rate limit the task uses when it is
        released (1 to `MAX_COST`): 500 for a task that sends 500 SMS.

        Raises `InvalidTask` (nothing written) for bad arguments and `StoreError` when
        the write was not acknowledged; the task may then exist or not, and retrying
        with an idempotency key is safe. `HandoffFailed` means the task is stored but,
        due within the hand-off window, could not be handed to the dispatcher.
        """
        task = self.task(
            type, payload, tenant=tenant, run_at=run_at, delay=delay, priority=priority,
            idempotency_key=idempotency_key, max_attempts=max_attempts, cost=cost,
        )
        failures = self.store.insert([task])
        if failures:
            raise StoreError(f"task {task.id} was not acknowledged by the store: {failures[0].reason}")
        if self.events is not None:
            self.events.add("submitted", task.tenant, task.type)
        try:
            self._hand_off([task])
        except HandoffFailed as error:
            raise HandoffFailed(f"task {task.id} is {error}") from error.__cause__
        return task.id

    def submit_many(
        self,
        items: Iterable[Submission | Mapping[str, Any] | InvalidTask],
        *,
        on_invalid: Literal["skip", "stop"] = "skip",
        progress: Progress | None = None,
        keep_ids: bool = True,
    ) -> SubmitReport:
        """Store many tasks, streaming: at most `chunk_size` are held at once, and none for
        longer than `FLUSH_MS` (`URGENT_FLUSH_MS` when a held task is due soon).

        An invalid item is reported in `rejected` and skipped (`on_invalid="skip"`), or
        ends the reading there (`"stop"`) after the items before it are written. A write
        the store does not acknowledge puts its items in `failed` and ends the reading,
        since the store is then failing. `progress`, if given, is called with the report
        so far after each chunk. `keep_ids=False` drops the per-item ids, for streams too
        large to hold them. An item may be an `InvalidTask` instance: a caller that
        parses its input passes what it could not parse, and it is rejected with that
        message, so one report accounts for every input record.
        """
        if on_invalid not in ("skip", "stop"):
            raise ValueError(f"on_invalid must be 'skip' or 'stop', got {on_invalid!r}")
        report = SubmitReport(ids=[] if keep_ids else None)
        chunk: list[tuple[int, Task]] = []
        oldest = 0  # when the chunk's first item was read (ms; the injectable clock)
        urgent = False  # the chunk holds a task due within the hand-off window
        for index, item in enumerate(items):
            report.consumed = index + 1
            try:
                task = self._task_of(item)
            except InvalidTask as error:
                report.rejected.append(ItemError(index, str(error)))
                if report.ids is not None:
                    report.ids.append(None)
                if on_invalid == "stop":
                    report.stopped_early = True
                    break
                continue
            now = self._now_ms()
            if not chunk:
                oldest = now
            chunk.append((index, task))
            urgent = urgent or self._due_soon(task.run_at_ms, now)
            if report.ids is not None:
                report.ids.append(task.id)
            if len(chunk) >= self.chunk_size or now - oldest >= (URGENT_FLUSH_MS if urgent else FLUSH_MS):
                if not self._write_chunk(chunk, report, progress):
                    report.stopped_early = True
                    return report
                chunk, urgent = [], False
        if chunk:
            self._write_chunk(chunk, report, progress)
        elif progress is not None:
            progress(report)
        return report

    def store_tasks(self, tasks: Sequence[Task], *, count: bool = True) -> None:
        """Store tasks already built and checked (a workflow's steps, whose ids follow from
        their claim), count them as submitted (unless `count` is False: a writer that
        only repeats another's insert) and hand off those due soon, like `submit`.
        `StoreError` when any write was not acknowledged, `HandoffFailed` after a failed
        hand-off; writing the same tasks again is safe."""
        failures = self.store.insert(tasks)
        if failures:
            raise StoreError(f"{sum(len(f.tasks) for f in failures)} tasks were not acknowledged by the store: "
                             f"{failures[0].reason}")
        if count and self.events is not None:
            self.events.add_many("submitted", count_pairs((task.tenant, task.type) for task in tasks))
        self._hand_off(tasks)

    def _task_of(self, item: Submission | Mapping[str, Any] | InvalidTask) -> Task:
        if isinstance(item, InvalidTask):
            raise item
        if isinstance(item, Submission):
            return self.task(
                item.type, item.payload, tenant=item.tenant, run_at=item.run_at, delay=item.delay,
                priority=item.priority, idempotency_key=item.idempotency_key, max_attempts=item.max_attempts,
                cost=item.cost,
            )
        if not isinstance(item, Mapping):
            raise InvalidTask(f"an item must be a Submission or a mapping, got {type(item).__name__}")
        unknown = set(item) - set(Submission.__slots__)
        if unknown:
            names = ", ".join(sorted(map(repr, unknown)))
            raise InvalidTask(f"unknown field(s) {names}; known: {', '.join(Submission.__slots__)}")
        if "type" not in item:
            raise InvalidTask("a task needs a type: a non-empty string naming its handler")
        return self.task(**item)

    def _write_chunk(self, chunk: Sequence[tuple[int, Task]], report: SubmitReport, progress: Progress | None) -> bool:
        """Write one chunk and account for each of its items; False when any failed."""
        tasks = [task for _, task in chunk]
        try:
            failures = self.store.insert(tasks)
        except StoreError as error:  # the report must survive: it says what was stored before
            failures = [InsertFailure(tasks, str(error))]
        failed_ids = {task.id: failure.reason for failure in failures for task in failure.tasks}
        written = [task for task in tasks if task.id not in failed_ids]
        if self.events is not None:
            self.events.add_many("submitted", count_pairs((task.tenant, task.type) for task in written))
        try:
            self._hand_off(written)
        except HandoffFailed as error:
            now = self._now_ms()
            failed_ids.update((task.id, str(error)) for task in written if self._due_soon(task.run_at_ms, now))
        if not failed_ids:  # the common case, without a look-up per item
            report.stored += len(chunk)
        else:
            for index, task in chunk:  # an id may stand for several items (a key given twice)
                reason = failed_ids.get(task.id)
                if reason is None:
                    report.stored += 1
                    continue
                report.failed.append(ItemError(index, reason, task.id))
                if report.ids is not None:
                    report.ids[index] = None
            report.failed.sort(key=lambda error: error.index)
        if progress is not None:
            progress(report)
        return not failed_ids

    def _due_soon(self, run_at_ms: int, now_ms: int) -> bool:
        """Due within the hand-off window (or overdue): the dispatcher must be told."""
        return run_at_ms <= now_ms + self.handoff_window_ms

    def _hand_off(self, tasks: Sequence[Task]) -> None:
        """Give the hand-off the tasks due within the window; `HandoffFailed` if it fails."""
        if self.handoff is None or not tasks:
            return
        now = self._now_ms()
        due_soon = [task for task in tasks if self._due_soon(task.run_at_ms, now)]
        if not due_soon:
            return
        try:
            self.handoff.submitted(due_soon)
        except Exception as exc:
            # A refusal is a setting, said in full by the error: no traceback for it.
            log.warning("hand-off of %d tasks failed", len(due_soon), exc_info=not isinstance(exc, QueueAccessDenied),
                        extra={"action": "handoff_failed"})
            if isinstance(exc, QueueAccessDenied):
                # Submitting again would be refused again: the task stands, the setting is to fix.
                raise HandoffFailed(
                    f"stored, but the queue refused its hand-off to the dispatcher, so a task due this soon may fire "
                    f"late (the dispatchers find it within about 20 s); fix this for the next ones: {exc}"
                ) from exc
            raise HandoffFailed(
                f"stored, but the hand-off to the dispatcher failed ({type(exc).__name__}: {exc}), so a task due "
                "this soon may fire late (the dispatchers find it within about 20 s); submit it again with the same "
                "idempotency key to hand it off again, or cancel it"
            ) from exc

    # Reading and cancelling.

    def get(self, task_id: TaskId | str, tenant: str | None = None) -> StoredTask | None:
        """The stored task and its status, or None if there is none. With a tenant (given
        here or the client's default) a task of another tenant reads as None too."""
        stored = self.store.get(TaskId.parse(task_id) if isinstance(task_id, str) else task_id)
        tenant = tenant if tenant is not None else self.tenant
        if stored is None or (tenant is not None and stored.task.tenant != tenant):
            return None
        return stored

    def expired(self, task_id: TaskId | str) -> bool:
        """Whether a task with this id would be past the store's retention (its minute
        plus `store.retention_s`): `get` answers None for it, whether or not it existed.
        `scheduler.retention.missing_task` words that for a person."""
        parsed = TaskId.parse(task_id) if isinstance(task_id, str) else task_id
        return time.time_ns() // 1_000_000 >= retention.task_expires_ms(parsed, self.store.retention_s)

    def cancel(self, task_id: TaskId | str, tenant: str | None = None) -> CancelOutcome:
        """Cancel a task that has not finished. Only the task's tenant can: for another
        tenant the answer is `NOT_FOUND` and nothing changes. A running attempt is not
        interrupted; no further attempt starts.

        The answer is definite: after `CANCELLED` (or `ALREADY_CANCELLED`), no attempt
        starts, wherever the task was (`scheduler.cancels`). For a task that may already be
        loaded or queued (due within minutes, or overdue) that takes `cancels.SETTLE_MS`:
        the call returns after it. A cancel of a task due soon is also handed to the
        dispatcher, which may hold the task, so it is not published at all (if that hand-off
        fails, nothing is lost: the workers skip it; it is logged).
        """
        task_id = TaskId.parse(task_id) if isinstance(task_id, str) else task_id
        return self.cancel_many([task_id], tenant)[task_id]

    def cancel_many(self, task_ids: Iterable[TaskId | str], tenant: str | None = None, *,
                    workflow_steps: bool = False) -> dict[TaskId, CancelOutcome]:
        """`cancel` each task, waiting `cancels.SETTLE_MS` once for them all (not once
        each): the outcome of each, by id. A store that fails part-way raises `StoreError`
        after that wait, so the cancels already answered are definite; cancelling the rest
        again is safe (a cancelled task answers `ALREADY_CANCELLED`).

        A workflow's step is refused (`InvalidTask`, nothing cancelled): its workflow
        would wait for it for ever; cancel the workflow (`client.workflows.cancel`).
        `workflow_steps=True` is that cancel's own way in, and always waits the settle
        time (a replayed step's task is not among the ids it can derive)."""
        tenant = tenant if tenant is not None else self.tenant
        if not isinstance(tenant, str) or not tenant:
            raise InvalidTask("cancel needs the tenant that owns the task")
        ids = [TaskId.parse(task_id) if isinstance(task_id, str) else task_id for task_id in task_ids]
        rows = self.store.get_many(ids) if self.events is not None or not workflow_steps else {}
        if not workflow_steps:
            for stored in rows.values():
                key = stored.task.idempotency_key
                if stored.task.tenant == tenant and key is not None and key.startswith(STEP_KEY_PREFIX):
                    raise InvalidTask(f"task {stored.task.id} is a workflow's step ({key}): cancel its workflow "
                                      "(scheduler workflow cancel), or its workflow would wait for it for ever")
        outcomes: dict[TaskId, CancelOutcome] = {}
        in_flight: list[TaskId] = []
        try:
            for task_id in ids:
                outcome = outcomes[task_id] = self.store.cancel(task_id, tenant)
                if outcome is CancelOutcome.CANCELLED and self.events is not None and task_id in rows:
                    self.events.add("cancelled", rows[task_id].task.tenant, rows[task_id].task.type)
                if outcome in (CancelOutcome.CANCELLED, CancelOutcome.ALREADY_CANCELLED) \
                        and cancels.may_be_in_flight(task_id.run_at_ms, self._now_ms()):
                    in_flight.append(task_id)
        finally:
            if in_flight:
                self._hand_off_cancels(in_flight)
            if in_flight or workflow_steps:
                self._settle(self.cancel_settle_s)
        return outcomes

    def _hand_off_cancels(self, task_ids: Sequence[TaskId]) -> None:
        if self.handoff is None:
            return
        now = self._now_ms()
        for task_id in task_ids:
            if self._due_soon(task_id.run_at_ms, now):
                try:
                    self.handoff.cancelled(task_id)
                except Exception:
                    log.warning("hand-off of the cancel of %s failed; the workers skip it all the same", task_id,
                                exc_info=True, extra={"action": "handoff_failed"})
