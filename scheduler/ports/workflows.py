"""The workflow store's port: one record per workflow (its definition and state), the
outcome of each step member that ended, and the claims that create steps.

Everything of a workflow lives in one partition (Cassandra) or under one key (SQLite),
so its state changes and its claims are ordered against each other: a claim made
while the workflow is running and a cancel are serialised, and whichever came first
is what the other sees (`WorkflowStore.claim`, `WorkflowStore.transition`).

No counters anywhere: a member's outcome is an absolute value written under the
member's own key, so writing it twice writes it once; a join fires when a reader finds
every member it waits for, through one conditional write (the claim) that only one
caller can win. Kept by two adapters under one contract suite
(`tests/contract/test_workflow_store.py`).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from scheduler.model import TaskId


class WorkflowState(enum.Enum):
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    """A step ended dead: nothing new starts but the on-failure step. A dead-letter
    replay of that step that succeeds opens the workflow again."""
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        """No step of the workflow will be created any more (but its on-failure step)."""
        return self is not WorkflowState.RUNNING


class MemberOutcome(enum.Enum):
    DONE = "done"
    DEAD = "dead"
    CANCELLED = "cancelled"


@dataclass(frozen=True, slots=True)
class WorkflowRecord:
    """A workflow as stored: who owns it, what it is, and where it stands."""

    tenant: str
    workflow_id: str
    definition: bytes
    """The encoded definition (`scheduler.workflows.definition`), fixed at submit."""
    state: WorkflowState
    created_ms: int
    ended_ms: int | None = None
    """When the state last became terminal (None while running)."""


@dataclass(frozen=True, slots=True)
class Member:
    """How one member of a step (a step of width N has members 0..N-1) ended."""

    step: str
    index: int
    outcome: MemberOutcome
    task_id: TaskId
    attempt: int
    finished_ms: int
    error: str | None = None


@dataclass(frozen=True, slots=True)
class Claim:
    """The right to create a unit of steps, won once. `index` is the member for a step
    created member by member (`each_of`), or `WHOLE` for a step created all at once;
    `run_at_ms` is the time the winner chose, from which every member's task id follows
    (so a caller that finds the claim taken creates the very same tasks)."""

    step: str
    index: int
    run_at_ms: int
    created: bool
    """Every task of the unit is known stored (set after the insert)."""
    won: bool = field(default=False, compare=False)
    """This call's conditional write made the claim (False for a claim found held, and
    in `claims`): its winner counts the tasks it creates, a loser only repeats the insert."""


WHOLE = -1
"""The claim index of a step created all at once."""


class WorkflowStore(Protocol):
    """Durable workflows. Every method may be called from several threads at once;
    failures raise `StoreError`."""

    def create(self, record: WorkflowRecord) -> WorkflowRecord:
        """Store `record` unless a workflow of this tenant and id exists; return the
        stored one (the caller compares definitions)."""
        ...

    def read(self, tenant: str, workflow_id: str) -> WorkflowRecord | None:
        ...

    def start_check(self, tenant: str, workflow_id: str, step: str, index: int
                    ) -> tuple[WorkflowState | None, Member | None, bytes | None]:
        """What a worker needs before it starts a member: the workflow's state (None if
        there is no such workflow), and the member's recorded outcome and result, if any."""
        ...

    def record_member(self, tenant: str, workflow_id: str, member: Member, result: bytes | None) -> None:
        """Write how a member ended, with its result when it has one. Done wins: a done
        end replaces a dead one (a dead-letter replay that succeeded), but a dead or
        cancelled end never replaces a done one (another copy of the member, run at the
        same time, that died), whatever order the writes land in."""
        ...

    def members(self, tenant: str, workflow_id: str, steps: tuple[str, ...] | None = None) -> list[Member]:
        """The recorded members of `steps` (all steps if None), without their results."""
        ...

    def members_at(self, tenant: str, workflow_id: str, step: str, indexes: Sequence[int]) -> list[Member]:
        """The recorded members among `indexes` of one step (those not ended are left
        out): a few rows, where `members` reads the whole step."""
        ...

    def results(self, tenant: str, workflow_id: str, step: str) -> dict[int, bytes]:
        """The results recorded for a step's members, by index (members without one
        are left out)."""
        ...

    def claim(self, tenant: str, workflow_id: str, step: str, index: int, run_at_ms: int,
              when: WorkflowState) -> Claim | None:
        """Claim a unit unless it is claimed, if the workflow is in state `when`, with
        one conditional write. Returns the claim that holds, this caller's or an earlier
        one (whatever the state); None when there is none and the state is not `when`."""
        ...

    def claims(self, tenant: str, workflow_id: str) -> list[Claim]:
        ...

    def mark_created(self, tenant: str, workflow_id: str, step: str, index: int) -> None:
        """Record that every task of a claimed unit is stored."""
        ...

    def transition(self, tenant: str, workflow_id: str, from_states: tuple[WorkflowState, ...],
                   to: WorkflowState, at_ms: int) -> WorkflowState | None:
        """Move the workflow to `to` if its state is one of `from_states`, with one
        conditional write; return the state it has afterwards (None: no such workflow)."""
        ...

    def close(self) -> None:
        ...
