"""`CassandraTaskStore`: the `TaskStore` port on Cassandra (table `tasks_by_bucket`).

How it writes
-------------
`insert` groups tasks by partition `(minute_bucket, shard)` and sends each group as
single-partition UNLOGGED batches of up to `batch_rows` rows (a multi-partition batch
would make one coordinator wait on many replicas: the anti-pattern). Batches go out
asynchronously, token-aware, with at most `max_in_flight` outstanding for the whole
store; `insert` returns once every batch was acknowledged at the configured
consistency, and lists the groups that were not.

Fenced writes are lightweight transactions, one per call, never one per task:
- taking a shard: `INSERT ... IF NOT EXISTS`, else `UPDATE ... IF lease_token <= t`;
- advancing the cursor: `IF lease_token = t AND fired_through <= x`, or
  `... AND fired_through = null` for the first advance;
- rows into a partition: one conditional batch, `UPDATE ... SET fence = t IF fence <= t`
  (or `IF fence = null` for the first) plus the rows, all applied or none.
A never-written column is null and null compares false, hence the second forms.

Status reports are plain writes whose write timestamp is derived from the report,
`status_write_timestamp_us`, so the cell of the greatest `report_order` wins whatever
order the writes arrive in, with no read and no transaction per report: a cancel (and
`done`, `dead`) above every attempt, other reports by attempt, then phase. The report's
error is written in the same statement, so with the same timestamp: it is replaced
exactly when the status is. "No error" is written as '' rather than null (a null would
be a tombstone per report) and read back as None. Two reports of the same attempt and
status tie on the timestamp; Cassandra then keeps the greater value, so of two errors
for one (attempt, status) the row keeps one of them, and an error over none. Errors are
cut to `MAX_ERROR_CHARS` (see `bounded_error`).

A task's cost is written with every insert; a row written before the column existed
has none, which reads as cost 1.

How it reads many tasks
-----------------------
`get_many` (and `statuses`, which reads only the status columns) groups the ids by
partition and sends one query per partition (and per `GET_MANY_CHUNK` ids), selecting
the home rows by their whole clustering key,
`(run_at, task_id) IN ?`, with the id list serialised by `rows.clustering_keys`. The
queries go out like inserts: asynchronously, token-aware, with at most
`max_reads_in_flight` outstanding (a bound of their own, higher than the writes': a
poll batch spans every shard, and with the driver's per-request cost the batch's
queries are best all in flight at once).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from cassandra.cluster import NoHostAvailable, ResponseFuture, Session
from cassandra.query import (
    UNSET_VALUE,
    BatchStatement,
    BatchType,
    BoundStatement,
    PreparedStatement,
    SimpleStatement,
    Statement,
    tuple_factory,
)

from scheduler import cancels, retention
from scheduler.adapters.cassandra import rows
from scheduler.adapters.cassandra.connection import DRIVER_ERRORS, CassandraConnection, answer_column, connect
from scheduler.adapters.cassandra.queries import named_queries
from scheduler.adapters.cassandra.refusals import raise_if_denied
from scheduler.errors import SchemaConflict, StoreError, StoreUnavailable
from scheduler.model import (
    BUCKET_MS,
    Partition,
    Task,
    TaskId,
    check_in_partition,
    from_ms,
    minute_bucket,
    to_ms,
)
from scheduler.ports import (
    ROW_ERRORS,
    BadRow,
    CancelMarks,
    CancelOutcome,
    HomeStatus,
    InsertFailure,
    ShardState,
    StatusReport,
    StoredTask,
    TaskStatus,
    hand_over,
    refusal_to_cancel,
    report_order,
)
from scheduler.settings import CassandraSettings


class _CountBucketsWarning(logging.Filter):
    """Cassandra warns of every aggregate over several partitions; `count_buckets` sends
    one by design (a few partitions of one shard, once per shard per sweep), so that
    warning is dropped rather than logged several times a second."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Aggregation query used on multiple partition keys" not in record.getMessage()


logging.getLogger("cassandra.protocol").addFilter(_CountBucketsWarning())

DEFAULT_BATCH_ROWS = 250
_CONDITION_ROUNDS = 5
"""Tries of a conditional write whose first form (`IF col = null`) lost a race; each
lost race means another writer set the column, so the second round decides."""
DEFAULT_MAX_IN_FLIGHT = 16
DEFAULT_MAX_READS_IN_FLIGHT = 64
GET_MANY_CHUNK = 100
"""Most ids one `get_many` query asks for; a partition with more gets several queries.
Well under the driver's page size (5000 rows), so an answer is always one page."""
MAX_ERROR_CHARS = 2000
"""Longest error text kept with a status (see `bounded_error`)."""
TUPLES = "scheduler.tuples"
"""Execution profile returning plain tuples: a third cheaper to build than named tuples."""

def bounded_error(error: str | None) -> str | None:
    """`error` cut to at most `MAX_ERROR_CHARS` characters, the cut marked with how much
    was left out. The store bounds what it keeps whoever reports: a traceback or a
    response body can be any size, and every read of the task carries it."""
    if error is None or len(error) <= MAX_ERROR_CHARS:
        return error
    marker = f"... [{len(error)} characters, cut]"
    return error[:MAX_ERROR_CHARS - len(marker)] + marker


def status_write_timestamp_us(task_id: TaskId, attempt: int, status: TaskStatus) -> int:
    """The write timestamp of a status report: the task's own time in µs plus the
    report's `report_order`, so the cell of the greatest order wins whatever order the
    writes arrive in, and stays within a millisecond of the task's time (every order is
    below `ORDER_LIMIT`)."""
    value = status._value_
    final = _FINAL_ORDERS_BY_VALUE.get(value)
    return task_id.run_at_ms * 1000 + (attempt * 8 + _RANKS_BY_VALUE[value] if final is None else final)


_RANKS_BY_VALUE = {status.value: status.rank for status in TaskStatus}
_FINAL_ORDERS_BY_VALUE = {status.value: report_order(0, status) for status in TaskStatus if status.finished}
"""`report_order` by the status's value, for `status_write_timestamp_us` on the
settler's hot path: `status.rank` looks the member up in a dict, and an enum member's
hash is a Python-level call (a third of the function's time); a str's is not."""


Context = TypeVar("Context")


@dataclass
class _Tally:
    """Outstanding requests of one `_send_all` call and what failed."""

    pending: int = 1  # the submitting loop itself, released when it has sent everything
    failures: list[tuple[Any, BaseException]] = field(default_factory=list)


class CassandraTaskStore:
    """The distributed `TaskStore`. Open with `CassandraTaskStore.open(settings)`."""

    def __init__(
        self,
        connection: CassandraConnection,
        keyspace: str,
        shard_count: int,
        *,
        batch_rows: int = DEFAULT_BATCH_ROWS,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
        max_reads_in_flight: int = DEFAULT_MAX_READS_IN_FLIGHT,
        owns_connection: bool = False,
        retention_s: int = retention.DEFAULT_RETENTION_S,
    ) -> None:
        if batch_rows < 1 or max_in_flight < 1 or max_reads_in_flight < 1:
            raise ValueError("batch_rows, max_in_flight and max_reads_in_flight must be positive")
        self._connection = connection
        self._session: Session = connection.session
        self._owns_connection = owns_connection
        self.keyspace = keyspace
        self._shard_count = shard_count
        self._retention_s = retention.check_retention(retention_s)
        self._batch_rows = batch_rows
        self._slots = threading.BoundedSemaphore(max_in_flight)
        self._read_slots = threading.BoundedSemaphore(max_reads_in_flight)
        if TUPLES not in connection.cluster.profile_manager.profiles:
            connection.cluster.add_execution_profile(TUPLES, _tuple_profile(connection))
        try:
            self._q: dict[str, PreparedStatement] = {
                name: self._session.prepare(text) for name, text in named_queries(keyspace).items()
            }
        except DRIVER_ERRORS as exc:
            raise_if_denied(exc, self._session, f"preparing the task store's statements in keyspace {keyspace!r}")
            raise StoreError(
                f"cannot prepare the task store's statements in keyspace {keyspace!r} ({exc}); "
                "has `scheduler schema apply` been run for it?"
            ) from exc
        rows.check_insert_columns(self._q["insert_task"])
        rows.check_status_columns(self._q["set_status"])
        self._created_ms: int | None = None

    @classmethod
    def open(cls, settings: CassandraSettings, **options: Any) -> CassandraTaskStore:
        """Connect, read the shard count recorded in the keyspace, prepare statements."""
        connection = connect(settings)
        try:
            recorded = recorded_shard_count(connection, settings.keyspace)
            if recorded != settings.shard_count:
                raise SchemaConflict(
                    f"keyspace {settings.keyspace!r} was created with {recorded} shards, not {settings.shard_count}"
                )
            options.setdefault("retention_s", recorded_retention_s(connection, settings.keyspace))
            store = cls(connection, settings.keyspace, recorded, owns_connection=True, **options)
            store._created_ms = recorded_created_ms(connection, settings.keyspace)
            return store
        except BaseException:
            connection.close()
            raise

    @property
    def connection(self) -> CassandraConnection:
        """The store's session and cluster, e.g. for `CassandraEffectLedger.for_store`."""
        return self._connection

    @property
    def shard_count(self) -> int:
        return self._shard_count

    @property
    def created_ms(self) -> int | None:
        return self._created_ms

    @property
    def retention_s(self) -> int:
        return self._retention_s

    def set_retention(self, seconds: int) -> None:
        retention.check_retention(seconds)
        # A whole number of seconds, checked above: safe to write into the statement.
        self._execute(SimpleStatement(f"INSERT INTO {self.keyspace}.meta (name, value) "
                                      f"VALUES ('retention_s', '{int(seconds)}')"))
        self._retention_s = seconds

    def purge_expired(self, now_ms: int, limit: int) -> int:
        return 0  # every write into a partition carries the TTL that ends with it

    def _ttl(self, bucket_ms: int, now_ms: int) -> bytes:
        """The packed TTL of a write at `now_ms` into a partition of minute `bucket_ms`."""
        return rows.packed_ttl(retention.ttl_s(bucket_ms, self._retention_s, now_ms))

    # Writes on the submit path.

    def insert(self, tasks: Sequence[Task]) -> list[InsertFailure]:
        groups: dict[tuple[int, int], list[Task]] = defaultdict(list)
        shard_count = self._shard_count
        for task in tasks:
            groups[(minute_bucket(task.run_at_ms), task.id.shard(shard_count))].append(task)
        insert = self._q["insert_task"]
        step = self._batch_rows
        now_ms = _now_ms()

        def batches() -> Iterator[tuple[Statement, Sequence[Task]]]:
            for (bucket, shard), group in groups.items():
                key = rows.partition_key(bucket, shard)
                ttl = self._ttl(bucket, now_ms)
                size = -(-len(group) // -(-len(group) // step))  # even batches: 260 rows go as 130 + 130
                for start in range(0, len(group), size):
                    chunk = group[start:start + size]
                    yield rows.insert_batch(insert, self.keyspace, key, chunk, ttl), chunk

        return self._run_all(batches())

    def _run_all(self, requests: Iterable[tuple[Statement, Sequence[Task]]]) -> list[InsertFailure]:
        """Send `requests` with bounded concurrency; wait for all; collect failures. A write
        the role is not granted raises `StoreAccessDenied` instead: retrying is no remedy.
        The writes that did not fail are stored (nodes' permission caches can disagree for
        a moment after a GRANT or REVOKE), so the caller counts none as stored for certain."""
        failures = self._send_all(requests, self._slots)
        for _, exc in failures:
            raise_if_denied(exc, self._session, "writing tasks")
        return [InsertFailure(tasks, _describe(exc)) for tasks, exc in failures]

    def _send_all(
        self,
        requests: Iterable[tuple[Statement, Context]],
        slots: threading.BoundedSemaphore,
        on_rows: Callable[[Any], None] | None = None,
    ) -> list[tuple[Context, BaseException]]:
        """Send `requests` with at most as many outstanding as `slots` allows (shared by
        all calls on the store), wait for all, and return the failed ones' contexts with
        their errors. `on_rows` gets each answer's rows (tuples), on the driver's thread
        but one answer at a time."""
        tally = _Tally()
        finished = threading.Event()
        lock = threading.Lock()

        def settle(context: Any, answer: Any, failure: BaseException | None) -> None:
            slots.release()
            with lock:
                if failure is not None:
                    tally.failures.append((context, failure))
                elif on_rows is not None:
                    try:
                        on_rows(answer)
                    except Exception as exc:  # a callback must never kill the driver's thread
                        tally.failures.append((context, exc))
                tally.pending -= 1
                if tally.pending == 0:
                    finished.set()

        try:
            for statement, context in requests:
                slots.acquire()
                with lock:
                    tally.pending += 1
                try:
                    future: ResponseFuture = self._session.execute_async(statement, execution_profile=TUPLES)
                    future.add_callbacks(
                        callback=lambda answer, context=context: settle(context, answer, None),
                        errback=lambda exc, context=context: settle(context, None, exc),
                    )
                except DRIVER_ERRORS as exc:
                    settle(context, None, exc)
                except BaseException as exc:
                    settle(context, None, exc)
                    raise
        finally:  # even when the loop fails, wait for what is in flight before returning
            with lock:
                tally.pending -= 1
                if tally.pending == 0:
                    finished.set()
        finished.wait()
        return tally.failures

    # Reads.

    def read_partition(
        self,
        partition: Partition,
        *,
        after_ms: int | None = None,
        through_ms: int | None = None,
        page_size: int = 5000,
        on_bad_row: Callable[[BadRow], None] | None = None,
    ) -> Iterator[StoredTask]:
        if page_size < 1:
            raise ValueError(f"page_size must be positive, got {page_size}")
        low = partition.minute_bucket - 1 if after_ms is None else after_ms
        high = partition.minute_bucket + BUCKET_MS if through_ms is None else through_ms
        statement = self._q["read_range"].bind(
            (from_ms(partition.minute_bucket), partition.shard, from_ms(low), from_ms(high))
        )
        statement.fetch_size = page_size
        result = self._execute(statement)
        try:
            for row in result:  # later pages are fetched while iterating
                if row[2] is None:  # a row holding only a status (a report for a missing row)
                    continue
                try:
                    stored = rows.stored_task(row)
                except ROW_ERRORS as exc:
                    hand_over(rows.bad_row(partition, row, exc), on_bad_row)
                    continue
                yield stored
        except DRIVER_ERRORS as exc:
            raise_if_denied(exc, self._session, f"reading partition {partition}")
            raise StoreError(f"reading partition {partition} failed: {_describe(exc)}") from exc

    def count_partition(self, partition: Partition, *, after_ms: int, through_ms: int) -> int:
        statement = self._q["count_range"].bind(
            (from_ms(partition.minute_bucket), partition.shard, from_ms(after_ms), from_ms(through_ms))
        )
        row = self._execute(statement).one()
        return int(row[0]) if row is not None else 0

    def count_buckets(self, shard: int, buckets: Sequence[int], through_ms: int,
                      after_ms: int | None = None) -> dict[int, int]:
        if not buckets:
            return {}
        moments = [from_ms(bucket) for bucket in buckets]
        if after_ms is None:
            statement = self._q["count_buckets"].bind((moments, shard, from_ms(through_ms)))
        else:
            statement = self._q["count_buckets_after"].bind((moments, shard, from_ms(after_ms), from_ms(through_ms)))
        return {to_ms(rows.as_utc(bucket)): int(count) for bucket, count in self._execute(statement) if count}

    def get(self, task_id: TaskId) -> StoredTask | None:
        row = self._execute(self._q["read_task"].bind(self._key(task_id))).one()
        return rows.stored_task(row) if row is not None and row[2] is not None else None

    def attempts(self, task_id: TaskId) -> dict[int, str]:
        row = self._execute(self._q["read_history"].bind(self._key(task_id))).one()
        return {} if row is None or not row[0] else {int(attempt): str(text) for attempt, text in row[0].items()}

    def get_many(self, task_ids: Sequence[TaskId]) -> dict[TaskId, StoredTask]:
        wanted = {task_id.bytes: task_id for task_id in task_ids}
        found: dict[TaskId, StoredTask] = {}
        for answer in self._home_rows("read_tasks", wanted.values()):
            for row in answer:
                if row[1] is not None:  # a row holding only a status is not a task
                    task_id = wanted[row[0]]
                    found[task_id] = rows.home_row(task_id, row)
        return found

    def statuses(self, task_ids: Sequence[TaskId]) -> dict[TaskId, HomeStatus]:
        wanted = {task_id.bytes: task_id for task_id in task_ids}
        found: dict[TaskId, HomeStatus] = {}
        for answer in self._home_rows("read_statuses", wanted.values()):
            for row in answer:
                # A row holding only a status still says what it says: a task written again
                # (a keyed resubmit) gives its fields a shorter TTL than a cancel gave its
                # status, and that cancel must still stop the task's retries.
                if row[1] is not None or row[2] is not None:
                    found[wanted[row[0]]] = rows.home_status(row)
        return found

    def _home_rows(self, query_name: str, task_ids: Iterable[TaskId]) -> list[Any]:
        """The answers of `query_name` (a query by whole clustering keys, as `read_tasks`)
        for the home rows of `task_ids`, without repeats: one query per partition (and
        per `GET_MANY_CHUNK` ids), run concurrently."""
        groups: dict[tuple[int, int], list[TaskId]] = defaultdict(list)
        shard_count = self._shard_count
        for task_id in task_ids:
            groups[(minute_bucket(task_id.run_at_ms), task_id.shard(shard_count))].append(task_id)
        query = self._q[query_name]

        def requests() -> Iterator[tuple[Statement, Partition]]:
            for (bucket, shard), ids in groups.items():
                key = rows.partition_key(bucket, shard)
                for start in range(0, len(ids), GET_MANY_CHUNK):
                    # Values serialised here, as the driver's bind would (see rows.py).
                    statement = BoundStatement(query)
                    statement.values = [key[0], key[1], rows.clustering_keys(ids[start:start + GET_MANY_CHUNK])]
                    yield statement, Partition(bucket, shard)

        answers: list[Any] = []
        failures = self._send_all(requests(), self._read_slots, answers.append)
        if failures:
            partition, exc = failures[0]
            message = (
                f"reading tasks failed in {len(failures)} of {len(groups)} partitions, "
                f"e.g. {partition}: {_describe(exc)}"
            )
            if isinstance(exc, NoHostAvailable):
                raise StoreUnavailable(message) from exc
            raise_if_denied(exc, self._session, "reading tasks")
            raise StoreError(message) from exc
        return answers

    def _key(self, task_id: TaskId) -> tuple[object, ...]:
        """The bound primary key of the task's home row."""
        run_at = task_id.run_at_ms
        return (from_ms(minute_bucket(run_at)), task_id.shard(self._shard_count), from_ms(run_at), task_id.uuid)

    # Cancel and status.

    def cancel(self, task_id: TaskId, tenant: str) -> CancelOutcome:
        found = self.get(task_id)
        refusal = refusal_to_cancel(found, tenant)
        if refusal is CancelOutcome.ALREADY_CANCELLED:
            self._mark_cancel(task_id)  # the first cancel may have failed before its mark
        if refusal is not None:
            return refusal
        assert found is not None  # a missing task is refused above
        self._execute(self._cancel_batch(found))
        # The read and the write are not one step: a `done` reported in between outranks
        # the cancel (see report_order). Read again to answer what the row now says.
        after = self.get(task_id)
        if after is not None and after.status.finished and after.status is not TaskStatus.CANCELLED:
            return CancelOutcome.FINISHED
        self._mark_cancel(task_id)
        return CancelOutcome.CANCELLED

    def _mark_cancel(self, task_id: TaskId) -> None:
        """Raise the shard's cancel mark if the task may be in flight (see `scheduler.cancels`)."""
        now = time.time_ns() // 1_000_000
        if not cancels.may_be_in_flight(task_id.run_at_ms, now):
            return
        shard = task_id.shard(self._shard_count)
        try:
            self._execute(self._q["mark_cancel_at"].bind((from_ms(now), shard)))
            self._execute(self._q["mark_cancel_count"].bind((shard,)))
        except StoreError as exc:
            raise StoreError(f"task {task_id} is cancelled in the store, but workers could not be told ({exc}); "
                             "cancel it again") from exc

    def read_cancel_marks(self) -> CancelMarks:
        at = {int(shard): to_ms(rows.as_utc(moment))
              for shard, moment in self._execute(self._q["read_cancel_at"].bind(())) if moment is not None}
        counts = {int(shard): int(n) for shard, n in self._execute(self._q["read_cancel_counts"].bind(()))
                  if n is not None}
        return CancelMarks(at, counts)

    def _cancel_batch(self, found: StoredTask) -> BatchStatement:
        """The cancel of `found` at its latest attempt, with its row written again (status
        columns aside), both kept at least `retention.cancel_kept_s`: a row whose other
        cells expired would hold only the status, which the home-row check does not
        count as a task, and a retry waiting past the retention would run."""
        task = found.task
        bucket = minute_bucket(task.id.run_at_ms)
        key = rows.partition_key(bucket, task.id.shard(self._shard_count))
        ttl = rows.packed_ttl(retention.ttl_s(bucket, self._retention_s, _now_ms(), floor_s=retention.cancel_kept_s(self._retention_s)))
        report = StatusReport(task.id, found.latest_attempt, TaskStatus.CANCELLED)
        batch = rows.insert_batch(self._q["insert_task"], self.keyspace, key, [task], ttl)
        rows.add_rows(batch, self._q["set_status"], [_status_values(key, ttl, report)])
        return batch

    def record_status(self, reports: Sequence[StatusReport]) -> None:
        by_partition: dict[tuple[int, int], list[StatusReport]] = defaultdict(list)
        shard_count = self._shard_count
        for report in reports:
            task_id = report.task_id
            by_partition[(minute_bucket(task_id.run_at_ms), task_id.shard(shard_count))].append(report)
        set_status = self._q["set_status"]
        step = self._batch_rows
        now_ms = _now_ms()

        def batches() -> Iterator[tuple[Statement, Sequence[Task]]]:
            for (bucket, shard), group in by_partition.items():
                key = rows.partition_key(bucket, shard)
                ttl = self._ttl(bucket, now_ms)
                for start in range(0, len(group), step):
                    # Values serialised here, as the driver's bind would (see rows.py).
                    batch = rows.partition_batch(self.keyspace, key)
                    rows.add_rows(batch, set_status,
                                  [_status_values(key, ttl, report) for report in group[start:start + step]])
                    yield batch, ()

        failures = self._run_all(batches())
        if failures:
            raise StoreError(f"{len(failures)} status batches were not written: {failures[0].reason}")

    # Fenced operations.

    def take_shard(self, shard: int, owner: str, token: int) -> bool:
        if self._execute(self._q["create_shard"].bind((shard, owner, token))).was_applied:
            return True
        return bool(self._execute(self._q["take_shard"].bind((owner, token, shard, token))).was_applied)

    def read_shard(self, shard: int) -> ShardState:
        row = self._execute(self._q["read_shard"].bind((shard,))).one()
        if row is None:
            return ShardState(shard, None, None, None)
        owner, token, fired_through, baselines = row
        return ShardState(shard, owner, token, None if fired_through is None else to_ms(rows.as_utc(fired_through)),
                          None if baselines is None else {int(bucket): int(n) for bucket, n in baselines.items()})

    def advance_shard(self, shard: int, token: int, fired_through_ms: int,
                      baselines: Mapping[int, int] | None = None) -> bool:
        moment = from_ms(fired_through_ms)
        counts: object = UNSET_VALUE if baselines is None else dict(baselines)
        for _ in range(_CONDITION_ROUNDS):
            result = self._execute(self._q["advance_shard"].bind((moment, counts, shard, token, moment)))
            if result.was_applied:
                return True
            current = result.one()
            if current is None or current[1] != token or current[2] is not None:
                return False
            # The cursor was null: the first advance. If another caller with the same token
            # sets it first, go round and compare with what it set.
            if self._execute(self._q["advance_shard_first"].bind((moment, counts, shard, token))).was_applied:
                return True
        raise StoreError(f"advancing shard {shard} kept racing other writers; giving up")

    def write_fenced(self, partition: Partition, token: int, tasks: Sequence[Task]) -> bool:
        check_in_partition(tasks, partition, self._shard_count)
        bucket = from_ms(partition.minute_bucket)
        key = rows.partition_key(partition.minute_bucket, partition.shard)

        def attempt(condition: str, values: tuple[object, ...]) -> Any:
            # The fence is kept as long as the rows this write makes. Rows written later
            # (a late report, a cancel) may outlive it; a fenced write into the partition
            # after that takes the first-write form again, which only matters for a
            # partition written long after its retention.
            ttl_s = retention.ttl_s(partition.minute_bucket, self._retention_s, _now_ms())
            batch = BatchStatement(batch_type=BatchType.UNLOGGED)
            batch.add(self._q[condition], (ttl_s, *values))
            ttl = rows.packed_ttl(ttl_s)
            rows.add_rows(batch, self._q["insert_task"], (rows.row_values(task, key, ttl) for task in tasks))
            return self._execute(batch)

        for _ in range(_CONDITION_ROUNDS):
            result = attempt("raise_fence", (token, bucket, partition.shard, token))
            if result.was_applied:
                return True
            if answer_column(result, "fence") is not None:
                return False  # a newer token has written here
            # No fence yet: the first fenced write. If another token sets it first (an older
            # one, during a take-over), go round: `IF fence <= token` then decides.
            if attempt("raise_fence_first", (token, bucket, partition.shard)).was_applied:
                return True
        raise StoreError(f"the fenced write to {partition} kept racing other writers; giving up")

    def partition_fence(self, partition: Partition) -> int | None:
        row = self._execute(self._q["read_fence"].bind((from_ms(partition.minute_bucket), partition.shard))).one()
        return None if row is None else row[0]

    def _execute(self, statement: Statement) -> Any:
        try:
            return self._session.execute(statement, execution_profile=TUPLES)
        except NoHostAvailable as exc:
            raise StoreUnavailable(f"no Cassandra node could take the request: {exc}") from exc
        except DRIVER_ERRORS as exc:
            raise_if_denied(exc, self._session, "a task store request")
            raise StoreError(f"Cassandra refused or failed the request: {_describe(exc)}") from exc

    def close(self) -> None:
        if self._owns_connection:
            self._connection.close()


def recorded_shard_count(connection: CassandraConnection, keyspace: str) -> int:
    """The shard count `scheduler schema apply` recorded in `keyspace`."""
    try:
        row = connection.session.execute(f"SELECT value FROM {keyspace}.meta WHERE name = 'shard_count'").one()
    except DRIVER_ERRORS as exc:
        raise_if_denied(exc, connection.session, f"reading the shard count of keyspace {keyspace!r}")
        raise StoreError(
            f"keyspace {keyspace!r} has no scheduler schema ({_describe(exc)}); run `scheduler schema apply`"
        ) from exc
    if row is None:
        raise StoreError(f"keyspace {keyspace!r} records no shard count; run `scheduler schema apply`")
    return int(row.value)


def recorded_created_ms(connection: CassandraConnection, keyspace: str) -> int | None:
    """When `scheduler schema apply` first ran on `keyspace` (None if it did not record it)."""
    try:
        row = connection.session.execute(f"SELECT value FROM {keyspace}.meta WHERE name = 'created_ms'").one()
    except DRIVER_ERRORS as exc:
        raise_if_denied(exc, connection.session, f"reading the creation time of keyspace {keyspace!r}")
        raise StoreError(f"reading keyspace {keyspace!r}'s creation time failed: {_describe(exc)}") from exc
    return int(row.value) if row is not None else None


def recorded_retention_s(connection: CassandraConnection, keyspace: str) -> int:
    """The retention `scheduler retention set` recorded in `keyspace`, else the default."""
    try:
        row = connection.session.execute(f"SELECT value FROM {keyspace}.meta WHERE name = 'retention_s'").one()
    except DRIVER_ERRORS as exc:
        raise_if_denied(exc, connection.session, f"reading the retention of keyspace {keyspace!r}")
        raise StoreError(f"reading keyspace {keyspace!r}'s retention failed: {_describe(exc)}") from exc
    return retention.DEFAULT_RETENTION_S if row is None else int(row.value)


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _status_values(key: tuple[bytes, bytes], ttl: bytes, report: StatusReport) -> list[object]:
    """The serialised `set_status` values of `report`, on its task's home row in the
    partition whose key is `key`, with the partition's TTL `ttl`."""
    task_id, attempt, status = report.task_id, report.attempt, report.status
    error = bounded_error(report.error) or ""  # '' rather than a tombstone: see the module's docstring
    return rows.status_values(key, task_id, status_write_timestamp_us(task_id, attempt, status), ttl, status, attempt,
                              error, report.record)


def _tuple_profile(connection: CassandraConnection) -> Any:
    default = connection.cluster.profile_manager.default
    return type(default)(
        load_balancing_policy=default.load_balancing_policy,
        retry_policy=default.retry_policy,
        consistency_level=default.consistency_level,
        serial_consistency_level=default.serial_consistency_level,
        request_timeout=default.request_timeout,
        row_factory=tuple_factory,
    )


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"
