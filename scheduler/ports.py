"""The ports the scheduler's core talks through; adapters implement them.

`TaskStore` is kept by two adapters that meet one contract suite
(`tests/contract/test_task_store.py`): Cassandra (`scheduler.adapters.cassandra.store`)
and SQLite (`scheduler.adapters.embedded.store`). Core modules import this file,
`model` and `errors`, never a driver.

Fencing, in one paragraph
-------------------------
A dispatcher owns a shard under a lease whose fencing token grows with every new
lease. Each store write a dispatcher makes carries that token and is conditional: the
`shards` row is written only by a token at least as new as the recorded one, and rows
written into a task partition only by a token at least as new as the partition's
`fence`. A fenced operation returns `True` when it was applied and `False` when a newer
token got there first; `False` means "stop, someone else owns this now", never "retry".
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from scheduler.model import Partition, Task, TaskId


class TaskStatus(enum.Enum):
    """What the store knows of a task. `SCHEDULED` means nothing has reported on it yet:
    it is waiting, or it has been published and no worker has reported (the dispatcher's
    `fired_through` tells which)."""

    SCHEDULED = "scheduled"
    RUNNING = "running"
    FAILED = "failed"
    CANCELLED = "cancelled"
    DONE = "done"
    DEAD = "dead"

    @property
    def finished(self) -> bool:
        """A task in a finished state will not run again (unless re-submitted)."""
        return self in (TaskStatus.DONE, TaskStatus.DEAD, TaskStatus.CANCELLED)

    @property
    def rank(self) -> int:
        """Order of reports within one attempt: a later phase wins over an earlier one.
        A cancel outranks `running` and `failed` (the attempt's own late reports do not
        undo it) but not `done` or `dead`: what has finished stays finished."""
        return _RANKS[self]


_RANKS = {
    TaskStatus.SCHEDULED: 0,
    TaskStatus.RUNNING: 1,
    TaskStatus.FAILED: 2,
    TaskStatus.CANCELLED: 3,
    TaskStatus.DONE: 4,
    TaskStatus.DEAD: 5,
}


@dataclass(frozen=True, slots=True)
class StoredTask:
    """A task as read back, with its status and the attempt that status belongs to."""

    task: Task
    status: TaskStatus
    status_attempt: int = 0

    @property
    def latest_attempt(self) -> int:
        """The newest attempt the row knows of: stored, or reported on."""
        return max(self.task.attempt, self.status_attempt)


@dataclass(frozen=True, slots=True)
class StatusReport:
    """A worker's (or the dispatcher's) word on one attempt of a task. It is recorded
    on the task's home row (see `TaskStore`), whichever attempt it is about."""

    task_id: TaskId
    attempt: int
    status: TaskStatus


class CancelOutcome(enum.Enum):
    CANCELLED = "cancelled"
    ALREADY_CANCELLED = "already cancelled"
    FINISHED = "already finished"
    NOT_FOUND = "not found"
    """Also the answer when the task belongs to another tenant: a tenant learns nothing
    about another tenant's tasks, not even that they exist."""


def refusal_to_cancel(found: StoredTask | None, tenant: str) -> CancelOutcome | None:
    """The answer to a cancel that must change nothing, or None if the task may be
    cancelled: the rule both adapters apply to the home row they read."""
    if found is None or found.task.tenant != tenant:
        return CancelOutcome.NOT_FOUND
    if found.status is TaskStatus.CANCELLED:
        return CancelOutcome.ALREADY_CANCELLED
    if found.status.finished:
        return CancelOutcome.FINISHED
    return None


@dataclass(frozen=True, slots=True)
class ShardState:
    shard: int
    owner: str | None
    lease_token: int | None
    fired_through_ms: int | None


@dataclass(frozen=True, slots=True)
class InsertFailure:
    """Tasks the store did not acknowledge, and why. They may or may not be stored:
    writing the same `Task` objects again is safe, since a task's id fixes its row."""

    tasks: Sequence[Task]
    reason: str


class TaskStore(Protocol):
    """Durable home of tasks, partitioned by `(minute_bucket, shard)`.

    A task's home row is the one at the `run_at` its id carries: `get`, `cancel` and
    status reports all address it, so the task's latest status is always there. A row
    written for a later attempt (at a later `run_at`, so that the dispatcher finds it)
    is only a copy to fire; whoever runs it checks the home row first.

    Thread-safety: every method may be called from several threads at once.
    Failures: methods raise `StoreError` (or `StoreUnavailable`) for a store that fails
    or cannot be reached; they never leak a driver's exception.
    """

    @property
    def shard_count(self) -> int:
        """Shards of this store, fixed when it was created."""
        ...

    def insert(self, tasks: Sequence[Task]) -> list[InsertFailure]:
        """Write `tasks`, each as one row of its partition, and return once every write
        was acknowledged durably, listing the groups that were not (empty on success).

        An insert of an id that exists replaces the task's fields but keeps its status,
        so a retried insert never revives a cancelled or finished task. Tasks are
        grouped by partition; no write spans two partitions.
        """
        ...

    def read_partition(
        self,
        partition: Partition,
        *,
        after_ms: int | None = None,
        through_ms: int | None = None,
        page_size: int = 5000,
    ) -> Iterator[StoredTask]:
        """Tasks of one partition in `(run_at, id)` order, fetched `page_size` at a time,
        optionally only those with `after_ms < run_at <= through_ms`, the same half-open
        interval as the shard cursor `fired_through`. Cancelled tasks are included: the
        reader decides what to skip."""
        ...

    def get(self, task_id: TaskId) -> StoredTask | None:
        """The task's home row, or None."""
        ...

    def cancel(self, task_id: TaskId, tenant: str) -> CancelOutcome:
        """Mark the task cancelled unless it is finished. Only its own tenant may cancel
        it; for any other tenant the answer is `NOT_FOUND` and nothing changes. If the
        task finishes while it is being cancelled, the answer is `FINISHED` and the
        finished status stays. A cancel does not interrupt an attempt that is running;
        it keeps any further attempt from starting."""
        ...

    def record_status(self, reports: Sequence[StatusReport]) -> None:
        """Record status reports on the tasks' home rows.

        A report replaces the stored status only when `(attempt, status.rank)` is at
        least the stored one's, so a stale attempt's late report never overwrites a newer
        attempt's, and `running` never overwrites `done` of the same attempt. No
        per-report conditional write: the order is kept by write timestamps (Cassandra)
        or by the comparison inside the update (SQLite).

        Reports are for stored tasks. One for a task that is not stored is never
        readable on its own; whether it survives until that id is inserted is the
        adapter's business (Cassandra keeps it, SQLite drops it).
        """
        ...

    # Fenced operations, for the owner of a shard's lease.

    def take_shard(self, shard: int, owner: str, token: int) -> bool:
        """Record `owner` and `token` as the shard's holder if no token, or an older one,
        is recorded (re-taking with the recorded token is accepted too)."""
        ...

    def read_shard(self, shard: int) -> ShardState:
        """The shard's recorded holder and cursor (all None when never taken)."""
        ...

    def advance_shard(self, shard: int, token: int, fired_through_ms: int) -> bool:
        """Set the shard's cursor if `token` is the recorded one. The cursor never moves
        backwards: an advance to a time before the recorded cursor is refused."""
        ...

    def write_fenced(self, partition: Partition, token: int, tasks: Sequence[Task]) -> bool:
        """Write `tasks` (all of `partition`) and raise the partition's fence to `token`,
        all or nothing, if `token` is at least the partition's fence (or it has none)."""
        ...

    def partition_fence(self, partition: Partition) -> int | None:
        """The highest token that has written to the partition, or None."""
        ...

    def close(self) -> None:
        """Release connections; the store is unusable afterwards."""
        ...


class Handoff(Protocol):
    """Where the producer hands tasks that fall due soon, and cancels of them, so the
    shard's owner learns of them at once (the dispatcher consumes it). Called after the
    store acknowledged the write; must return only once the hand-off is durable, and
    raise if it is not. A task due now may already be behind the dispatcher's cursor
    when it is stored, so for such a task the hand-off is what makes it fire: the
    producer treats a failed hand-off as a failed submit."""

    def submitted(self, tasks: Sequence[Task]) -> None: ...

    def cancelled(self, task_id: TaskId) -> None: ...
