"""The task store's port: the rows of tasks and their statuses, the shards' cursors and
fences, cancels, and what a read reports in place of a row that is not a task.

`TaskStore` is kept by two adapters that meet one contract suite
(`tests/contract/test_task_store.py`): Cassandra (`scheduler.adapters.cassandra.store`)
and SQLite (`scheduler.adapters.embedded.store`). Fencing: see `scheduler.ports`.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from scheduler.model import MAX_ATTEMPTS_LIMIT, Partition, Task, TaskId


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
        See `report_order` for the order across attempts."""
        return _RANKS[self]


_RANKS = {
    TaskStatus.SCHEDULED: 0,
    TaskStatus.RUNNING: 1,
    TaskStatus.FAILED: 2,
    TaskStatus.CANCELLED: 3,
    TaskStatus.DONE: 4,
    TaskStatus.DEAD: 5,
}

FINAL_SLOT = MAX_ATTEMPTS_LIMIT + 1
"""The place of the finished states in `report_order`: above every attempt."""

ORDER_LIMIT = FINAL_SLOT * 8 + 8
"""Every `report_order` is below this (814: a Cassandra status timestamp stays within a
millisecond of its task's time)."""


def report_order(attempt: int, status: TaskStatus) -> int:
    """Where a report stands in the order that decides a home row's status: the report
    of the greatest order wins, whatever order the reports are written in.

    `running` and `failed` order by attempt, then phase: a stale attempt's late report
    never overwrites a newer attempt's. `cancelled`, `done` and `dead` stand above every
    attempt, in that order. So a cancel outranks every attempt of its task, including
    one that was starting while the cancel was written and reports only afterwards (its
    `running` and `failed`, at an attempt the cancel did not know of, do not undo it,
    and the retry after them finds the task cancelled); and what has finished stays
    finished: an attempt that was already running when the cancel came and then
    succeeds shows `done`, since it did run. A cancel never stops a running attempt,
    and `scheduler.cancels` keeps any attempt from *starting* once a cancel answered."""
    return (FINAL_SLOT if status.finished else attempt) * 8 + _RANKS[status]


@dataclass(frozen=True, slots=True)
class StoredTask:
    """A task as read back, with its status and the attempt that status belongs to."""

    task: Task
    status: TaskStatus
    status_attempt: int = 0
    error: str | None = None
    """The last error reported with the status (`failed` or `dead`), if any."""

    @property
    def latest_attempt(self) -> int:
        """The newest attempt the row knows of: stored, or reported on."""
        return max(self.task.attempt, self.status_attempt)


class HomeStatus(NamedTuple):
    """What a home row says of a task's progress: its status and the attempt the status
    is about. (A named tuple: a worker reads one per checked message.)"""

    status: TaskStatus
    status_attempt: int


class StatusReport(NamedTuple):
    """A worker's (or the dispatcher's) word on one attempt of a task. It is recorded
    on the task's home row (see `TaskStore`), whichever attempt it is about. (A named
    tuple: a worker makes one or two per task.)"""

    task_id: TaskId
    attempt: int
    status: TaskStatus
    error: str | None = None
    """Why the attempt failed (`failed`, `dead`); recorded with the status and replaced
    with it, so the home row always shows the error of the status it shows."""
    record: str | None = None
    """The attempt's history record (`scheduler.visibility.history.AttemptRecord`,
    encoded), written with a report that ends the attempt; kept per attempt, never
    replaced by a report without one."""


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
    baselines: Mapping[int, int] | None = None
    """Written with the cursor: for each bucket of the owner's look-back horizon, how many
    of its rows at or before the cursor the owner had handled (None if never written).
    A new owner compares its sweep's counts with these."""


@dataclass(frozen=True, slots=True)
class BadRow:
    """A stored row that is not a valid task (written by hand or by another tool, or
    damaged): where it is, what it holds, and why it cannot be read. Its key always
    reads (`run_at` and id are the clustering key)."""

    partition: Partition
    run_at_ms: int
    task_id: bytes
    """The 16 bytes of the row's id."""
    fields: Mapping[str, object]
    """The row's columns as read, as plain values (str, int, bytes, None)."""
    reason: str


ROW_ERRORS = (ValueError, TypeError, OverflowError)
"""What building a task from a stored row raises when the row is not a valid task
(`InvalidTask` is a `ValueError`)."""


def hand_over(bad: BadRow, on_bad_row: Callable[[BadRow], None] | None) -> None:
    """What `read_partition` does with a row that is not a task: pass it to `on_bad_row`,
    or, without one, raise `InvalidTask` naming it."""
    if on_bad_row is None:
        from scheduler.errors import InvalidTask

        raise InvalidTask(f"row {bad.run_at_ms}/{bad.task_id.hex()} of {bad.partition}: {bad.reason}")
    on_bad_row(bad)


@dataclass(frozen=True, slots=True)
class CancelMarks:
    """Per shard, what workers need to honour cancels without reading every task's row:
    `at`, the latest time a task of the shard that may be in flight was cancelled (the
    canceller's clock, ms), and `counts`, how many such cancels there have been (a value
    that changes with every one, whatever the clocks). See `scheduler.cancels`."""

    at: Mapping[int, int]
    counts: Mapping[int, int]


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

    @property
    def created_ms(self) -> int | None:
        """When the store was created (no task can be older), if it recorded that: where a
        shard that was never fired starts."""
        ...

    @property
    def retention_s(self) -> int:
        """How long a partition's rows are kept after its minute (`scheduler.retention`),
        as recorded in the store when it was opened."""
        ...

    def set_retention(self, seconds: int) -> None:
        """Record a new retention (checked by `retention.check_retention`; `ConfigError`
        and nothing changed if it is not one). Rows written from then on by this store,
        and by processes that open the store after, get it; rows already written keep
        the end they were written with (on the embedded store a longer retention also
        keeps them longer: its purge reads the one recorded when it runs)."""
        ...

    def purge_expired(self, now_ms: int, limit: int) -> int:
        """Remove up to `limit` rows of partitions past their retention at `now_ms`;
        return how many. Cassandra's TTLs remove them without a purge (0)."""
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
        on_bad_row: Callable[[BadRow], None] | None = None,
    ) -> Iterator[StoredTask]:
        """Tasks of one partition in `(run_at, id)` order, fetched `page_size` at a time,
        optionally only those with `after_ms < run_at <= through_ms`, the same half-open
        interval as the shard cursor `fired_through`. Cancelled tasks are included: the
        reader decides what to skip. A row that is not a valid task raises `InvalidTask`,
        or, with `on_bad_row`, is passed to it (in its place in the order) and skipped."""
        ...

    def count_partition(self, partition: Partition, *, after_ms: int, through_ms: int) -> int:
        """How many rows of `partition` have `after_ms < run_at <= through_ms`, cancelled
        ones included. The dispatcher's cheap re-read of a slice just ahead of its cursor:
        it compares this with the rows it already knows of and reads the slice only when
        the store has more."""
        ...

    def count_buckets(self, shard: int, buckets: Sequence[int], through_ms: int,
                      after_ms: int | None = None) -> dict[int, int]:
        """For each of `buckets` (minute buckets of `shard`), how many rows it holds with
        `run_at <= through_ms` (and `run_at > after_ms` if given), cancelled ones
        included; buckets with none are left out. One request for all: the dispatcher's
        sweep behind its cursor."""
        ...

    def get(self, task_id: TaskId) -> StoredTask | None:
        """The task's home row, or None."""
        ...

    def attempts(self, task_id: TaskId) -> dict[int, str]:
        """The history records of the task's attempts (attempt -> encoded record), as
        the reports that ended them wrote them; empty for a task without any (or none)."""
        ...

    def get_many(self, task_ids: Sequence[TaskId]) -> dict[TaskId, StoredTask]:
        """The home rows of `task_ids` that exist (missing ids are left out). One query per
        partition the ids fall in, run concurrently."""
        ...

    def statuses(self, task_ids: Sequence[TaskId]) -> dict[TaskId, HomeStatus]:
        """The status of each of `task_ids` whose home row exists (missing ids are left
        out), as `get_many` would read it, but without the rest of the row: the worker's
        check of a polled batch needs no more, and reading less costs the store and the
        worker about half as much an id."""
        ...

    def cancel(self, task_id: TaskId, tenant: str) -> CancelOutcome:
        """Mark the task cancelled unless it is finished. Only its own tenant may cancel
        it; for any other tenant the answer is `NOT_FOUND` and nothing changes. If the
        task finishes while it is being cancelled, the answer is `FINISHED` and the
        finished status stays. A cancel does not interrupt an attempt that is running;
        it keeps any further attempt from starting.

        When the task may already be loaded by a dispatcher or queued for a worker (its
        `run_at` within `cancels.REACH_MS` of now, or past), the cancel then raises its
        shard's cancel mark (`read_cancel_marks`), after the status is written, so a worker
        that sees the mark reads the status. The caller that needs "no attempt starts after
        this returned" waits `cancels.SETTLE_MS` after it (`Client.cancel` does)."""
        ...

    def read_cancel_marks(self) -> CancelMarks:
        """Every shard's cancel mark (shards never marked are left out). One small read:
        workers ask it several times a second."""
        ...

    def record_status(self, reports: Sequence[StatusReport]) -> None:
        """Record status reports on the tasks' home rows.

        A report replaces the stored status only when its `report_order` is at least the
        stored one's, so a stale attempt's late report never overwrites a newer
        attempt's, nothing but `done` or `dead` overwrites a cancel, and nothing
        overwrites what has finished. `cancel` writes by the same order. No
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

    def advance_shard(self, shard: int, token: int, fired_through_ms: int,
                      baselines: Mapping[int, int] | None = None) -> bool:
        """Set the shard's cursor, and its `baselines` (replacing the ones recorded), if
        `token` is the recorded one. The cursor never moves backwards: an advance to a
        time before the recorded cursor is refused."""
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
