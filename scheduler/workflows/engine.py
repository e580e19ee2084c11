"""`Workflows`: submitting, advancing, cancelling and reading workflows, over a
`WorkflowStore` and a producer `Client`.

How a step follows its predecessors, whatever crashes or repeats
----------------------------------------------------------------
Every step member is an ordinary task whose id follows from (tenant, workflow, step,
index) and the time of the claim that created it (`TaskId.for_key`). A unit of steps
(a whole step, or one member of an `each_of` step) is created in three moves, each
safe to repeat:

1. *claim*: one conditional write that only one caller wins, and only while the
   workflow is running; a caller that loses gets the winner's time, so it would
   create the very same tasks;
2. *insert* the tasks (an insert of an existing id keeps its status, so a repeat
   never revives a finished step) and hand off those due now;
3. *mark* the claim created, so later callers skip the insert.

A member's end is recorded by the worker's settler (`ended`) *before* its status:
the member's outcome (and result) under its own key, then this module works out from
the stored outcomes what follows, then the status is written and the message
committed. A worker killed anywhere in between has not committed the message, which is
delivered again; the next worker finds the member's outcome stored (it does not run
the handler again, `start_check`) and works out the same successors, whose claims are
already held or marked. So a step delivered twice, or a worker killed between a
step's end and its successor's creation, leads to exactly one successor.

Joins need no counter: after recording its own outcome, each member of a joined step
reads the outcomes of every member the join waits for, and the one that finds them
all complete claims the join. Two members that end at once both read after both wrote
(writes and reads at the same consistency), so at least one of them sees the join
complete, and the claim lets only one create it. Before the whole steps, a member reads
a few of their rows (`PROBES`) and stops if one has not ended: the member whose end was
written last finds every probe ended, so exactness is kept; an N-wide fan-in reads about
N^2/10 rows (a member reads the whole steps with the chance that 8 random others
ended, f^8 when a share f did) instead of N^2/2.

Failure: a member that ends dead fails the workflow (unless every step after it is an
`all_finished` join), with one conditional write; nothing is claimed any more, so the
steps after it are skipped, and the on-failure step, if any, is claimed under the
failed state (once). A member that succeeds in a failed workflow (a dead-letter replay
of the dead step) opens it again when no member is dead any more, and `sweep` then
creates whatever became ready meanwhile.

Cancel: one conditional write (running or failed -> cancelled) serialised with the
claims, then every claimed member's task is cancelled (`Client.cancel_many`, which
waits until no attempt can start). A claim won before the cancel but inserted after
those cancels is stopped by the worker: it reads the workflow's state before starting
a step (`start_check`), after the step was created, so after the cancel.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import logging
import random
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from scheduler.errors import SchedulerError
from scheduler.model import Task, TaskId, decode_payload, to_ms
from scheduler.ports import CancelOutcome
from scheduler.ports.workflows import (
    WHOLE,
    Claim,
    Member,
    MemberOutcome,
    WorkflowRecord,
    WorkflowState,
    WorkflowStore,
)
from scheduler.producer import Client
from scheduler.workflows.definition import (
    Definition,
    InvalidWorkflow,
    StepSpec,
    Workflow,
    check_workflow_id,
    compile_workflow,
    parse_step_key,
    step_key,
)

log = logging.getLogger(__name__)

ENDED_THREADS = 8
_TERMINAL_OK = (MemberOutcome.DONE,)
_FINISHED = (MemberOutcome.DONE, MemberOutcome.DEAD)

PROBES = 8
"""Members of each step a join waits for that a member's end reads before the whole
steps (`Workflows._join_may_be_ready`)."""


@dataclass(frozen=True, slots=True)
class StepEnd:
    """How an attempt of a step's task ended, for `Workflows.ended`."""

    task: Task
    outcome: MemberOutcome
    result: bytes | None = None
    error: str | None = None


@dataclass(frozen=True, slots=True)
class StepStart:
    """What a worker does with a step's task before it runs the handler: `cancelled`
    (the workflow is), or `done` with the stored result (the member ended before; its
    handler is not run again)."""

    cancelled: bool = False
    done: bool = False
    result: bytes | None = None


RUN = StepStart()


class Workflows:
    """Thread-safe when the store and the client are."""

    def __init__(self, store: WorkflowStore, client: Client, *,
                 now_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000) -> None:
        self.store = store
        self.client = client
        self._now_ms = now_ms
        self._definitions: dict[tuple[str, str], Definition] = {}
        self._lock = threading.Lock()
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._random = random.Random()
        self._pool_lock = threading.Lock()

    # Submitting.

    def submit(self, workflow: Workflow, *, run_at: datetime | None = None) -> str:
        """Store the workflow and create its first steps; its id once they are stored.

        `InvalidWorkflow` (nothing stored) for a bad definition, or for an id already
        used by this tenant for another workflow. A `StoreError` or `HandoffFailed` may
        leave it part-way: submitting it again with the same `workflow_id` finishes it
        (pass one to be able to)."""
        definition, root_payloads = compile_workflow(workflow)
        workflow_id = check_workflow_id(workflow.workflow_id) if workflow.workflow_id is not None \
            else str(uuid.uuid4())
        encoded = definition.encode() + _digest(root_payloads)
        now = self._now_ms()
        start = now if run_at is None else max(now, to_ms(run_at))
        stored = self.store.create(WorkflowRecord(workflow.tenant, workflow_id, encoded, WorkflowState.RUNNING, now))
        if stored.definition != encoded:
            raise InvalidWorkflow(f"tenant {workflow.tenant!r} already has a workflow {workflow_id!r} with another "
                                  "definition; choose another id")
        self._remember(workflow.tenant, workflow_id, definition)
        for step in definition.steps:
            if step.root:
                self._create(workflow.tenant, workflow_id, step, WHOLE, WorkflowState.RUNNING, start,
                             root_payloads[step.name])
        return workflow_id

    # A member's end (the worker's settler calls this before writing the status).

    def ended(self, end: StepEnd) -> None:
        """Record how a step's attempt ended, and create what follows from it. Safe to
        call again for the same end (a retried batch, a message delivered again)."""
        parsed = parse_step_key(end.task.idempotency_key)
        if parsed is None:
            return
        workflow_id, step_name, index = parsed
        tenant = end.task.tenant
        definition = self.definition(tenant, workflow_id)
        if definition is None:
            return  # a task whose key looks like a step's, of no workflow: nothing follows it
        step = definition.by_name.get(step_name)
        if step is None or not 0 <= index < step.width:
            log.warning("task %s names step %s[%d], which workflow %s of %s does not have", end.task.id,
                        step_name, index, workflow_id, tenant)
            return
        self.store.record_member(tenant, workflow_id, Member(step_name, index, end.outcome, end.task.id,
                                                             end.task.attempt, self._now_ms(), end.error),
                                 end.result)
        self._advance(tenant, workflow_id, definition, step, index, end.outcome)

    def ended_many(self, ends: Sequence[StepEnd]) -> None:
        """`ended` for a settler's batch, `ENDED_THREADS` at a time (a join's read and
        a claim are round trips). Raises what any raised, after all were tried: the
        batch is then retried, its statuses unwritten and its messages uncommitted, so a
        successor is never lost to an error, however unexpected (it is logged with the
        step it concerns)."""
        if len(ends) == 1:
            self._ended_logged(ends[0])
            return
        with self._pool_lock:
            if self._pool is None:
                self._pool = concurrent.futures.ThreadPoolExecutor(ENDED_THREADS, thread_name_prefix="workflow")
            pool = self._pool
        futures = [pool.submit(self._ended_logged, end) for end in ends]
        concurrent.futures.wait(futures)
        for future in futures:
            future.result()

    def _ended_logged(self, end: StepEnd) -> None:
        try:
            self.ended(end)
        except SchedulerError:
            raise
        except Exception:
            log.exception("following the end of step task %s (%s) failed", end.task.id, end.task.idempotency_key)
            raise

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False)

    def _advance(self, tenant: str, workflow_id: str, definition: Definition, step: StepSpec, index: int,
                 outcome: MemberOutcome) -> None:
        if definition.on_failure is not None and step.name == definition.on_failure.name:
            return
        if outcome is MemberOutcome.CANCELLED:
            return  # only a cancelled workflow cancels its steps
        record = self.store.read(tenant, workflow_id)
        state = None if record is None else record.state
        if outcome is MemberOutcome.DEAD:
            _, stored, _ = self.store.start_check(tenant, workflow_id, step.name, index)
            if stored is not None and stored.outcome is MemberOutcome.DONE:
                return  # another copy of the member succeeded: done wins, and its settle advanced
            if not definition.tolerated(step.name):
                self._fail(tenant, workflow_id, definition)
                # Another copy may have ended done meanwhile, after this read but before
                # the fail, and found the workflow still running: read again, and open it
                # again if so (one of the two always sees the other's write).
                _, again, _ = self.store.start_check(tenant, workflow_id, step.name, index)
                if again is not None and again.outcome is MemberOutcome.DONE:
                    self._reopen(tenant, workflow_id, definition)
                return
        if state is WorkflowState.FAILED and outcome is MemberOutcome.DONE:
            self._reopen(tenant, workflow_id, definition)
            return
        if state is not WorkflowState.RUNNING:
            return
        for successor in definition.successors[step.name]:
            if successor.each_of is not None:
                if outcome is MemberOutcome.DONE:
                    self._create(tenant, workflow_id, successor, index, WorkflowState.RUNNING)
            elif self._join_may_be_ready(tenant, workflow_id, definition, successor, (step.name, index)) \
                    and self._join_ready(tenant, workflow_id, definition, successor):
                self._create(tenant, workflow_id, successor, WHOLE, WorkflowState.RUNNING)
        if not definition.successors[step.name]:
            self._maybe_succeed(tenant, workflow_id, definition)

    def _join_may_be_ready(self, tenant: str, workflow_id: str, definition: Definition, join: StepSpec,
                           own: tuple[str, int]) -> bool:
        """A few rows before the whole steps: False when one of `PROBES` members of each
        step the join waits for (the last index, which tends to end last, and random
        others) has not ended as the join needs. Each member's end reads every member a
        join waits for, N^2/2 rows for an N-wide fan-in; most ends now read a few.
        Exactness is kept: the member whose end is written last probes after every other
        end is written, finds them all, and reads the whole steps."""
        accepted = _TERMINAL_OK if join.join == "all_succeeded" else _FINISHED
        for name in join.after:
            width = definition.by_name[name].width
            if width <= PROBES:
                continue
            picks = {width - 1, *self._random.sample(range(width), PROBES - 1)} - {own[1] if own[0] == name else -1}
            found = self.store.members_at(tenant, workflow_id, name, sorted(picks))
            if len(found) < len(picks) or any(m.outcome not in accepted for m in found):
                return False
        return True

    def _join_ready(self, tenant: str, workflow_id: str, definition: Definition, join: StepSpec,
                    members: Sequence[Member] | None = None) -> bool:
        if members is None:
            members = self.store.members(tenant, workflow_id, join.after)
        accepted = _TERMINAL_OK if join.join == "all_succeeded" else _FINISHED
        ended: dict[str, int] = {}
        for member in members:
            if member.step in join.after and member.outcome in accepted:
                ended[member.step] = ended.get(member.step, 0) + 1
        return all(ended.get(name, 0) == definition.by_name[name].width for name in join.after)

    def _maybe_succeed(self, tenant: str, workflow_id: str, definition: Definition) -> None:
        sinks = definition.sinks
        done: dict[str, int] = {}
        for member in self.store.members(tenant, workflow_id, tuple(s.name for s in sinks)):
            if member.outcome is MemberOutcome.DONE:
                done[member.step] = done.get(member.step, 0) + 1
        if all(done.get(sink.name, 0) == sink.width for sink in sinks):
            self.store.transition(tenant, workflow_id, (WorkflowState.RUNNING,), WorkflowState.SUCCEEDED,
                                  self._now_ms())

    def _fail(self, tenant: str, workflow_id: str, definition: Definition) -> None:
        state = self.store.transition(tenant, workflow_id, (WorkflowState.RUNNING,), WorkflowState.FAILED,
                                      self._now_ms())
        if state is WorkflowState.FAILED and definition.on_failure is not None:
            self._create(tenant, workflow_id, definition.on_failure, WHOLE, WorkflowState.FAILED)

    def _reopen(self, tenant: str, workflow_id: str, definition: Definition) -> None:
        """Open a failed workflow again once no member is dead. A member that dies while
        this runs records its end and then tries to fail the workflow, which is still
        failed, so does nothing; this reads the members again after opening it, and
        fails it again if one died: one of the two always sees the other."""
        if self._any_dead(tenant, workflow_id, definition):
            return
        state = self.store.transition(tenant, workflow_id, (WorkflowState.FAILED,), WorkflowState.RUNNING,
                                      self._now_ms())
        if state is not WorkflowState.RUNNING:
            return
        if self._any_dead(tenant, workflow_id, definition):
            self._fail(tenant, workflow_id, definition)
            return
        self.sweep(tenant, workflow_id)

    def _any_dead(self, tenant: str, workflow_id: str, definition: Definition) -> bool:
        """A dead member that fails the workflow: not one before `all_finished` joins
        only, nor the on-failure step's own (it follows the failure, it does not cause it)."""
        failure = definition.on_failure.name if definition.on_failure is not None else None
        return any(m.outcome is MemberOutcome.DEAD and m.step != failure and not definition.tolerated(m.step)
                   for m in self.store.members(tenant, workflow_id))

    def sweep(self, tenant: str, workflow_id: str) -> None:
        """Create whatever the stored outcomes say should exist and does not (a workflow
        opened again after a replay, or one whose submit stopped part-way); then
        settle its state. Reads every member: not for the per-member path."""
        definition = self.definition(tenant, workflow_id)
        if definition is None:
            return
        members = self.store.members(tenant, workflow_id)
        claims = {(c.step, c.index): c for c in self.store.claims(tenant, workflow_id)}
        done = {(m.step, m.index) for m in members if m.outcome is MemberOutcome.DONE}
        for step in definition.steps:
            if step.root:
                held = claims.get((step.name, WHOLE))
                if held is not None and not held.created:
                    self._create(tenant, workflow_id, step, WHOLE, WorkflowState.RUNNING)
            elif step.each_of is not None:
                for index in range(step.width):
                    held = claims.get((step.name, index))
                    if (step.each_of, index) in done and (held is None or not held.created):
                        self._create(tenant, workflow_id, step, index, WorkflowState.RUNNING)
            else:
                held = claims.get((step.name, WHOLE))
                if (held is None or not held.created) and self._join_ready(tenant, workflow_id, definition, step,
                                                                           members):
                    self._create(tenant, workflow_id, step, WHOLE, WorkflowState.RUNNING)
        self._maybe_succeed(tenant, workflow_id, definition)

    # Creating a unit of steps.

    def _create(self, tenant: str, workflow_id: str, step: StepSpec, index: int, when: WorkflowState,
                run_at_ms: int | None = None, payloads: Sequence[bytes] | None = None) -> bool:
        """Claim, insert, mark (see the module); False when the workflow's state forbids
        a new claim."""
        claim = self.store.claim(tenant, workflow_id, step.name, index,
                                 self._now_ms() if run_at_ms is None else run_at_ms, when)
        if claim is None:
            return False
        if claim.created:
            return True
        indexes = range(step.width) if index == WHOLE else (index,)
        tasks = []
        for i in indexes:
            key = step_key(workflow_id, step.name, i)
            tasks.append(Task.unchecked(
                TaskId.for_key(claim.run_at_ms, tenant, key), tenant, step.type,
                step.payload if payloads is None else payloads[i], claim.run_at_ms, step.priority, 1,
                step.max_attempts, key, step.cost))
        # Counted as submitted by the claim's winner only: a loser that finds the claim not
        # yet marked inserts the same tasks again (the winner may have died), uncounted.
        self.client.store_tasks(tasks, count=claim.won)
        self.store.mark_created(tenant, workflow_id, step.name, index)
        return True

    # Workers, before running a step.

    def start_check(self, task: Task) -> StepStart:
        parsed = parse_step_key(task.idempotency_key)
        if parsed is None:
            return RUN
        workflow_id, step, index = parsed
        state, member, result = self.store.start_check(task.tenant, workflow_id, step, index)
        if state is None:
            return RUN
        if state is WorkflowState.CANCELLED:
            return StepStart(cancelled=True)
        if member is not None and member.outcome is MemberOutcome.DONE:
            return StepStart(done=True, result=result)
        return RUN

    def results(self, tenant: str, workflow_id: str, step: str) -> list[Any]:
        """The decoded results of a step's members, in index order (None where a member
        has none, or has not ended)."""
        definition = self.definition(tenant, workflow_id)
        if definition is None or step not in definition.by_name:
            raise InvalidWorkflow(f"workflow {workflow_id!r} of {tenant!r} has no step {step!r}")
        found = self.store.results(tenant, workflow_id, step)
        return [None if i not in found else decode_payload(found[i]) for i in range(definition.by_name[step].width)]

    # Cancelling and reading.

    def cancel(self, tenant: str, workflow_id: str) -> tuple[WorkflowState, dict[TaskId, CancelOutcome]] | None:
        """Cancel the workflow: it is `cancelled` at once, no step starts after this
        returns, and running ones finish. None if there is no such workflow; otherwise
        its state (`succeeded` or `cancelled`: a succeeded workflow stays so) and the
        outcome of cancelling each created step task."""
        state = self.store.transition(tenant, workflow_id, (WorkflowState.RUNNING, WorkflowState.FAILED),
                                      WorkflowState.CANCELLED, self._now_ms())
        if state is None:
            return None
        if state is not WorkflowState.CANCELLED:
            return state, {}
        definition = self.definition(tenant, workflow_id)
        assert definition is not None
        ids = [task_id for claim in self.store.claims(tenant, workflow_id)
               for task_id in _claim_ids(tenant, workflow_id, definition, claim)]
        return state, self.client.cancel_many(ids, tenant, workflow_steps=True)

    def definition(self, tenant: str, workflow_id: str) -> Definition | None:
        """The workflow's definition (kept once read: it never changes)."""
        with self._lock:
            held = self._definitions.get((tenant, workflow_id))
        if held is not None:
            return held
        record = self.store.read(tenant, workflow_id)
        if record is None:
            return None
        definition = decode_definition(record.definition)
        self._remember(tenant, workflow_id, definition)
        return definition

    def _remember(self, tenant: str, workflow_id: str, definition: Definition) -> None:
        with self._lock:
            if len(self._definitions) > 10_000:
                self._definitions.clear()
            self._definitions[(tenant, workflow_id)] = definition


def _claim_ids(tenant: str, workflow_id: str, definition: Definition, claim: Claim) -> list[TaskId]:
    step = definition.by_name.get(claim.step)
    if step is None:
        return []
    indexes = range(step.width) if claim.index == WHOLE else (claim.index,)
    return [TaskId.for_key(claim.run_at_ms, tenant, step_key(workflow_id, claim.step, i)) for i in indexes]


def member_task_ids(tenant: str, workflow_id: str, definition: Definition, claims: Sequence[Claim]
                    ) -> dict[tuple[str, int], TaskId]:
    """The task id of every created member, by (step, index)."""
    found: dict[tuple[str, int], TaskId] = {}
    for claim in claims:
        step = definition.by_name.get(claim.step)
        if step is None:
            continue
        for i, task_id in zip(range(step.width) if claim.index == WHOLE else (claim.index,),
                              _claim_ids(tenant, workflow_id, definition, claim), strict=True):
            found[(claim.step, i)] = task_id
    return found


_DIGEST_BYTES = 16


def _digest(root_payloads: dict[str, list[bytes]]) -> bytes:
    """Stored after the definition: two submits under one id with different root
    payloads are different workflows."""
    hasher = hashlib.blake2b(digest_size=_DIGEST_BYTES)
    for name in sorted(root_payloads):
        hasher.update(name.encode())
        for payload in root_payloads[name]:
            hasher.update(len(payload).to_bytes(4, "big"))
            hasher.update(payload)
    return hasher.digest()


def decode_definition(stored: bytes) -> Definition:
    try:
        return Definition.decode(stored[:-_DIGEST_BYTES])
    except Exception as exc:
        raise SchedulerError(f"a stored workflow definition cannot be read: {exc}") from exc
