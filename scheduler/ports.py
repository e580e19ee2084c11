"""The ports the scheduler's core talks through; adapters implement them.

`TaskStore` is kept by two adapters that meet one contract suite
(`tests/contract/test_task_store.py`): Cassandra (`scheduler.adapters.cassandra.store`)
and SQLite (`scheduler.adapters.embedded.store`). `ScheduleStore` (recurring schedules) likewise,
with `tests/contract/test_schedule_store.py`. Core modules import this file,
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
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from scheduler.model import Partition, Task, TaskId
from scheduler.recurring.schedule import Schedule


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
    error: str | None = None
    """The last error reported with the status (`failed` or `dead`), if any."""

    @property
    def latest_attempt(self) -> int:
        """The newest attempt the row knows of: stored, or reported on."""
        return max(self.task.attempt, self.status_attempt)


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

    def get_many(self, task_ids: Sequence[TaskId]) -> dict[TaskId, StoredTask]:
        """The home rows of `task_ids` that exist (missing ids are left out). One query per
        partition the ids fall in, run concurrently: the worker's check of a whole polled
        batch before it runs anything (cancelled, finished, or superseded by a newer
        attempt)."""
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


class AdvanceOutcome(enum.Enum):
    """The answer of `ScheduleStore.advance`."""

    APPLIED = "applied"
    CHANGED = "changed"
    """The stored schedule is not the one read (another creator advanced it first, it was
    paused, or deleted): re-read it, create nothing more now."""
    FENCED = "fenced"
    """A newer lease of the shard has written to its schedules: stop, the shard is not ours."""


class ScheduleStore(Protocol):
    """Durable home of recurring schedules (`scheduler.recurring`), kept by two adapters
    that meet one contract suite (`tests/contract/test_schedule_store.py`).

    Schedules live in the partition of their shard (`Schedule.shard`), so the owner of a
    shard reads its schedules with one partition read. Each partition has a fence like a
    task partition's: `advance` is refused to a token older than one that has advanced
    a schedule of the shard. Every write is conditional and atomic per schedule.
    Failures: `StoreError`, never a driver's exception. Thread-safe.
    """

    @property
    def shard_count(self) -> int: ...

    def create(self, schedule: Schedule) -> bool:
        """Store `schedule` unless one with its id exists; False (nothing changed) if one does."""
        ...

    def get(self, schedule_id: uuid.UUID) -> Schedule | None: ...

    def list_shard(self, shard: int) -> list[Schedule]:
        """Every schedule of `shard` (paused ones too), by id."""
        ...

    def list_all(self, tenant: str | None = None) -> list[Schedule]:
        """Every schedule (of `tenant`, when given), by tenant and name. Reads every shard."""
        ...

    def advance(self, schedule: Schedule, next_slot_ms: int, token: int) -> AdvanceOutcome:
        """Move the schedule's next slot from `schedule.next_slot_ms` to `next_slot_ms` and
        raise the shard's fence to `token`, all or nothing, if the stored schedule exists,
        is not paused, still has that next slot, and `token` is at least the fence."""
        ...

    def pause(self, schedule_id: uuid.UUID) -> bool:
        """Mark the schedule paused; False if there is none or it already was."""
        ...

    def resume(self, schedule_id: uuid.UUID, next_slot_ms: int) -> bool:
        """Unpause the schedule and set its next slot; False if there is none or it was
        not paused."""
        ...

    def delete(self, schedule_id: uuid.UUID) -> bool:
        """Remove the schedule; False if there was none. Runs already created stay."""
        ...

    def close(self) -> None: ...


class Handoff(Protocol):
    """Where the producer hands tasks that fall due soon, and cancels of them, so the
    shard's owner learns of them at once (the dispatcher consumes it). Called after the
    store acknowledged the write; must return only once the hand-off is durable, and
    raise if it is not. A task due now may already be behind the dispatcher's cursor
    when it is stored, so for such a task the hand-off is what makes it fire: the
    producer treats a failed hand-off as a failed submit."""

    def submitted(self, tasks: Sequence[Task]) -> None: ...

    def cancelled(self, task_id: TaskId) -> None: ...

    def completed(self, task_ids: Sequence[bytes]) -> None:
        """Workers: these attempts (16-byte task ids) finished (done, stored for a retry,
        dead, or skipped), so the dispatcher that released them frees their places under
        their tenant's concurrency cap. Best effort: a completion lost is a place freed
        later, by the dispatcher's hold timeout."""


# Coordination: membership, shard leases and fencing tokens.


class SessionState(enum.Enum):
    """The coordinator session's health, as its listener hears of it.

    `CONNECTED`: leases are held. `SUSPENDED`: the connection dropped; the session (and
    its leases) may still be alive, or may be expiring now; stop firing at once, keep the
    leases, and resume if `CONNECTED` follows. `LOST`: the session expired; every lease it
    held is gone (others may hold those shards already) and must never be used again.
    """

    CONNECTED = "connected"
    SUSPENDED = "suspended"
    LOST = "lost"


@dataclass(frozen=True, slots=True)
class Lease:
    """A held shard lease. `token` is its fencing token: every new lease of a shard gets
    a larger one (ZooKeeper: the lease znode's `czxid`), so a store write carrying it is
    refused once a newer lease has written. `session` names the coordinator session that
    created it (opaque), so a lease from an expired session is never taken for valid."""

    shard: int
    token: int
    session: int


class Coordinator(Protocol):
    """Membership of dispatchers and exclusive, fenced shard leases.

    A lease lives as long as the session that created it: an ephemeral znode (ZooKeeper)
    or an entry of the embedded hub. A member that dies stops renewing its session, the
    session expires after the session timeout, and its leases and membership vanish, so
    other members can take the shards. At most one lease of a shard exists at any moment.

    Thread-safety: every method may be called from several threads at once. Failures:
    `CoordinatorUnavailable` from `start` when no server answers; `CoordinatorError` from
    the others when the session is not usable (a lost lease is never an exception: it
    shows as `is_valid` turning False and as a `LOST` or `SUSPENDED` state).
    """

    def start(self, member: str, on_state: Callable[[SessionState], None]) -> None:
        """Open the session and register `member` (unique among live members). `on_state`
        is called on every change of the session's state, from the coordinator's own
        thread, at once: it must only set flags, never block."""
        ...

    def members(self) -> list[str]:
        """Live members, sorted."""
        ...

    def lease_holders(self) -> dict[int, str]:
        """Every live lease: shard -> the member holding it."""
        ...

    def acquire(self, shard: int) -> Lease | None:
        """Take the shard's lease, or None if any session (this one included) holds it."""
        ...

    def release(self, lease: Lease) -> None:
        """Give the lease up if it is still this session's with this token; no error if it
        is already gone. Callers stop firing the shard before they release it."""
        ...

    def is_valid(self, lease: Lease) -> bool:
        """Whether the lease may still be used: the session that made it is this one's and
        is `CONNECTED`. No I/O: called before every publish batch."""
        ...

    def confirm(self, lease: Lease) -> bool:
        """Whether the lease still exists and is this session's, asked of the coordinator
        itself (I/O). For a process that was paused: its own view of the session may not
        have caught up yet, so before firing again it asks."""
        ...

    def watch(self, callback: Callable[[], None]) -> None:
        """Call `callback` (from the coordinator's thread; it must not block) whenever the
        members or the leases may have changed. Callers also re-check periodically."""
        ...

    def close(self) -> None:
        """Release every lease this session holds, leave, and close the session."""
        ...


# Queueing: the ready topics that workers consume, and the dispatchers' hand-off log.


class Publisher(Protocol):
    """Publishes fired tasks' messages to the ready topics (`high`, `normal`, `low`,
    `long`). Kafka: an idempotent producer with `acks=all`, batched."""

    def publish(self, topic: str, values: Sequence[bytes], timestamp_ms: int | None = None) -> None:
        """Queue `values` for `topic` (the queue picks partitions). Returns at once unless
        the local buffer is full, then waits for room. `QueueError` if refused.
        `timestamp_ms` stamps the messages (Kafka: their CreateTime) with the moment the
        dispatcher released them, rather than when they were handed to the client."""
        ...

    def flush(self, timeout_s: float) -> None:
        """Return once every value published so far is durably stored; `QueueError` if
        any was not, or if `timeout_s` passed first. After an error the caller publishes
        again what it cannot prove stored (duplicates are allowed, loss is not)."""
        ...

    def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class HandoffRecord:
    """One message read from the hand-off log: the partition is the shard, `offset` its
    position there."""

    shard: int
    offset: int
    value: bytes
    timestamp_ms: int | None = None
    """When the writer appended it, by the writer's clock (Kafka: the record's CreateTime):
    how the dispatcher measures the writers' clocks against its own."""


class HandoffLog(Protocol):
    """The write side of the hand-off log: one partition per shard (Kafka: the hand-off
    topic, partition = shard), durable on return."""

    def append(self, batches: Sequence[tuple[int, Sequence[bytes]]]) -> None:
        """Append each `(shard, values)` batch to the shard's partition, in order; return
        once all are durable (one flush for all), `QueueError` if any is not."""
        ...

    def close(self) -> None: ...


class HandoffReader(Protocol):
    """The read side of the hand-off log, for the owner of some shards. Positions are
    committed per shard under one name shared by all dispatchers, so a new owner resumes
    where the last owner committed (and from the start of the partition if nobody ever
    committed): what the last owner read but did not commit is read again."""

    def assign(self, shard: int) -> None:
        """Start reading the shard's partition from its committed position."""
        ...

    def unassign(self, shard: int) -> None:
        """Stop reading the shard's partition; records not yet polled are dropped."""
        ...

    def poll(self, max_records: int, timeout_s: float) -> list[HandoffRecord]:
        """Up to `max_records` records of assigned shards, in order within each shard;
        waits up to `timeout_s` for the first. `QueueError` if the log fails."""
        ...

    def commit(self, positions: Mapping[int, int]) -> None:
        """Record, for each shard, the offset of the next record to read (one past the last
        one whose effect is safe). Synchronous; `QueueError` if it fails."""
        ...

    def close(self) -> None: ...


# Workers: consuming the ready topics, dead letters, and the effect ledger.


class Delivery(NamedTuple):
    """One message read from a topic by a consumer-group member. (A named tuple, not a
    frozen dataclass: a worker makes one per message, and a tuple is made 3x faster.)"""

    topic: str
    partition: int
    offset: int
    value: bytes
    timestamp_ms: int
    """The record's timestamp: when the queue stored the message, or the moment its
    publisher stamped on it (a task the fairness gate let out: its release)."""


TopicPartition = tuple[str, int]


class Consumer(Protocol):
    """A member of a consumer group reading some topics (Kafka: a subscribed consumer
    with auto-commit off; embedded: a member of the queue's own group table).

    The group spreads the topics' partitions over its live members; a member that dies
    (stops polling past the session timeout) loses its partitions, and whoever gets them
    next starts at the last committed position, so whatever was read but not committed is
    delivered again. Each topic's partitions are spread over the members (not just the
    total count), so a burst on one topic reaches every member. `poll` is the only place
    the assignment changes: partitions taken away (with Kafka's eager protocol, all of
    them, before a new assignment) are reported to `on_revoked` from inside `poll`, before anyone else can read
    them, so the caller can commit what it finished; commits for partitions no longer
    assigned are ignored (Kafka refuses them) and their messages will be delivered again.

    Not thread-safe: one thread polls, pauses, resumes and commits.
    """

    def poll(self, max_records: int, timeout_s: float) -> list[Delivery]:
        """Up to `max_records` messages of assigned, unpaused partitions, in offset order
        within each partition; waits up to `timeout_s` for the first. Must be called at
        least every few seconds even when paused, to stay in the group. `QueueError` if
        the queue fails."""
        ...

    def pause(self, topics: Sequence[str]) -> None:
        """Stop fetching `topics` (already-fetched messages may still come once)."""
        ...

    def resume(self, topics: Sequence[str]) -> None:
        ...

    def assignment(self) -> set[TopicPartition]:
        """The partitions this member holds now."""
        ...

    def commit(self, positions: Mapping[TopicPartition, int]) -> None:
        """Record, for each partition, the offset of the next message to deliver
        (synchronously). Positions of partitions not assigned to this member are dropped.
        `QueueError` if the commit fails."""
        ...

    def close(self) -> None:
        """Leave the group (its partitions go to other members at once); no commit."""
        ...


class TopicScanner(Protocol):
    """Reads a whole topic without joining any group: dead letters, for `dlq list`."""

    def scan(self, topic: str, *, limit: int | None = None) -> list[Delivery]:
        """Every message of `topic` (up to `limit`, oldest first within each partition),
        as of the call."""
        ...


class EffectClaim(enum.Enum):
    """The answer of `EffectLedger.claim`."""

    CLAIMED = "claimed"
    """The caller holds the claim: it runs the effect, then calls `done` (or `release`
    if the effect failed)."""
    DONE = "done"
    """The effect is recorded as done: skip it."""
    BUSY = "busy"
    """Another attempt holds an unexpired claim (it is running the effect now, or died
    doing so and its claim has not expired): try again later."""


class EffectLedger(Protocol):
    """Which side effects have happened, keyed by `(scope, key)` (scope: the tenant), so a
    repeated attempt skips the effects an earlier one completed. See
    `scheduler.worker.context.Context.once` for what this can and cannot guarantee.

    A claim expires `ttl_s` after it is taken unless marked done; a done record is kept
    for the ledger's retention (days), after which the key may run again.
    """

    def claim(self, scope: str, key: str, owner: str, ttl_s: float) -> EffectClaim:
        """Take the claim for `(scope, key)` unless it is done or claimed by another owner
        (an atomic insert-if-absent). Re-claiming one's own claim answers `CLAIMED`."""
        ...

    def done(self, scope: str, key: str, owner: str) -> None:
        """Record the effect as done (durable on return)."""
        ...

    def release(self, scope: str, key: str, owner: str) -> None:
        """Drop `owner`'s claim (the effect failed and may be tried again); no error if the
        claim is gone or another's."""
        ...


# Fairness between tenants: the limits that dispatchers enforce at release.

from scheduler.fairness.limits import Limits, TenantLimits  # noqa: E402  (kept with the port that uses it)


class LimitsStore(Protocol):
    """Durable home of the fairness limits (`scheduler.fairness.limits`), kept by two
    adapters that meet one contract suite (`tests/contract/test_limits_store.py`).

    One row per scope: a tenant's (`tenant:<name>`), the `default` row (for tenants
    without one) and the `global` row (its rate only). Operators write them through
    `scheduler limits`; every dispatcher re-reads them all every few seconds. Writes are
    whole rows, last writer wins. Failures: `StoreError`, never a driver's exception.
    Thread-safe.
    """

    def read(self) -> Limits:
        """Every row, as one `Limits`. A row that does not pass the checks of
        `scheduler.fairness.limits` is left out with a warning, never raised, so a row
        written by hand cannot stop a dispatcher (`limits_from_rows`)."""
        ...

    def set_tenant(self, tenant: str, limits: TenantLimits) -> None:
        """Write `tenant`'s whole row (a cap or rate of None is stored as none)."""
        ...

    def set_default(self, limits: TenantLimits) -> None:
        """Write the default row: the limits of every tenant without a row of its own."""
        ...

    def set_global_rate(self, rate: float | None) -> None:
        """Set the rate across all tenants, or remove it (None)."""
        ...

    def delete_tenant(self, tenant: str) -> bool:
        """Remove `tenant`'s row, so the default applies to it; False if it had none."""
        ...

    def close(self) -> None: ...
