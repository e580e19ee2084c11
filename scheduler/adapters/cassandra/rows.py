"""Task rows for `insert_task`, status rows for `set_status`, and the id lists of
`read_tasks`, serialised here instead of by the driver's binding; and the task rows read
back, made into `StoredTask`s (`stored_task`, `home_row`) or, when they cannot be read,
`BadRow`s (`bad_row`).

Why: on the submit path the driver's `PreparedStatement.bind` costs ~10 µs per row
(a type lookup, a `ColDesc` tuple and a serialiser call per value), more than all the
SDK's own work per task; `bench/ingest.py` profiles it. The row's twelve values have
fixed types, so they are packed here with precompiled `struct`s in ~2 µs and added to
the batch as already-bound values, exactly the bytes the driver would send. The same
holds for status reports, written by a worker's settler thread one per task: the
driver's binding of `set_status` (with the `datetime` and `UUID` values it wants, which
it converts straight back) was most of `record_status`'s time.

The layouts are checked against the prepared statements' own metadata when the store
opens (`check_insert_columns`, `check_status_columns`): a change to `queries.cql` or
the table that this file does not follow is an error at start, never a wrong row.

`BatchStatement` has no public method to add already-serialised values, so
`add_rows` uses `_add_statement_and_params`, the method its public `add` calls, and
falls back to a `BoundStatement` per row where a driver lacks it; the driver's major
version is bounded in `pyproject.toml`, and tests compare the packed rows with the
driver's own binding byte for byte.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Iterable, Sequence
from datetime import datetime, timezone
from typing import Any

from cassandra.query import UNSET_VALUE, BatchStatement, BatchType, BoundStatement, PreparedStatement

from scheduler.errors import StoreError
from scheduler.model import Partition, Priority, Task, TaskId, to_ms
from scheduler.ports import BadRow, HomeStatus, StoredTask, TaskStatus

INSERT_COLUMNS = (
    ("minute_bucket", "timestamp"),
    ("shard", "smallint"),
    ("run_at", "timestamp"),
    ("task_id", "uuid"),
    ("tenant", "varchar"),
    ("type", "varchar"),
    ("priority", "tinyint"),
    ("payload", "blob"),
    ("attempt", "int"),
    ("max_attempts", "int"),
    ("idempotency_key", "varchar"),
    ("cost", "int"),
    ("[ttl]", "int"),  # USING TTL ?, in s: the partition's (scheduler.retention.ttl_s)
)
"""The bound columns of `insert_task`, in order, with the CQL type each is packed as
(the driver names `text` by its alias `varchar`)."""

STATUS_COLUMNS = (
    ("[timestamp]", "bigint"),  # USING TIMESTAMP ?, in µs
    ("[ttl]", "int"),  # AND TTL ?, in s
    ("status", "varchar"),
    ("status_attempt", "int"),
    ("last_error", "varchar"),
    ("key(history)", "int"),
    ("value(history)", "varchar"),
    ("minute_bucket", "timestamp"),
    ("shard", "smallint"),
    ("run_at", "timestamp"),
    ("task_id", "uuid"),
)
"""The bound values of `set_status`, in order, as `check_insert_columns` names them."""

_INT64 = struct.Struct(">q").pack
_INT32 = struct.Struct(">i").pack
_INT16 = struct.Struct(">h").pack
_TINY = [struct.pack(">b", code) for code in range(3)]
_STATUS_TEXT = {status.value: status.value.encode() for status in TaskStatus}
"""The serialised `status` column, by the status's value (a str key: an enum member's
own hash is a Python-level call)."""
_CLUSTERING_KEY = struct.Struct(">iiqi16s").pack
"""One element of a `list<frozen<tuple<timestamp, uuid>>>`: the element's length (32),
then each field as length and bytes (8 for the timestamp, 16 for the uuid)."""


def check_insert_columns(insert: PreparedStatement) -> None:
    """Refuse to run if the prepared insert's columns are not the ones packed here."""
    _check_columns("insert_task", insert, INSERT_COLUMNS)


def check_status_columns(set_status: PreparedStatement) -> None:
    """Refuse to run if the prepared `set_status`'s bound values are not the ones packed here."""
    _check_columns("set_status", set_status, STATUS_COLUMNS)


def _check_columns(name: str, statement: PreparedStatement, packed: tuple[tuple[str, str], ...]) -> None:
    found = tuple((column.name, column.type.typename) for column in statement.column_metadata)
    if found != packed:
        raise StoreError(f"{name} binds {found}, but rows.py packs {packed}; update rows.py")


def partition_key(bucket_ms: int, shard: int) -> tuple[bytes, bytes]:
    """The serialised partition key components `(minute_bucket, shard)`."""
    return _INT64(bucket_ms), _INT16(shard)


def row_values(task: Task, key: tuple[bytes, bytes], ttl: bytes) -> list[object]:
    """The serialised values of `task`'s row in the partition whose key is `key`, written
    with the TTL `ttl` (`packed_ttl`: the partition's, the same for all its rows).

    A task without an idempotency key leaves that column unset rather than null: a
    bound null is a tombstone per row, which the dispatcher's reads would wade through.
    The cost is always written, 1 included, so a task written again with a new cost
    never keeps its old one.
    """
    idempotency_key = task.idempotency_key
    return [
        key[0], key[1], _INT64(task.run_at_ms), task.id.bytes, task.tenant.encode(), task.type.encode(),
        _TINY[task.priority.code], task.payload, _INT32(task.attempt), _INT32(task.max_attempts),
        idempotency_key.encode() if idempotency_key is not None else UNSET_VALUE, _INT32(task.cost), ttl,
    ]


def packed_ttl(seconds: int) -> bytes:
    """A TTL as bound: seconds, 0 for none."""
    return _INT32(seconds)


def status_values(
    key: tuple[bytes, bytes], task_id: TaskId, write_timestamp_us: int, ttl: bytes, status: TaskStatus, attempt: int,
    error: str, record: str | None = None,
) -> list[object]:
    """The serialised values of `set_status` on `task_id`'s home row, in the partition
    whose key is `key`: the write timestamp and TTL, the status, its attempt and its
    error text (the caller's choices: see `store.status_write_timestamp_us`,
    `packed_ttl` and `bounded_error`), and the attempt's history record, unset when
    there is none."""
    packed_attempt = _INT32(attempt)
    return [
        _INT64(write_timestamp_us), ttl, _STATUS_TEXT[status._value_], packed_attempt, error.encode(),
        packed_attempt, UNSET_VALUE if record is None else record.encode(),
        key[0], key[1], _INT64(task_id.run_at_ms), task_id.value.to_bytes(16),
    ]


def insert_batch(
    insert: PreparedStatement, keyspace: str, key: tuple[bytes, bytes], tasks: Sequence[Task], ttl: bytes, *,
    unlogged: bool = True,
) -> BatchStatement:
    """One single-partition batch inserting `tasks` with the TTL `ttl`, routed to the
    partition's replicas."""
    batch = partition_batch(keyspace, key, unlogged=unlogged)
    add_rows(batch, insert, (row_values(task, key, ttl) for task in tasks))
    return batch


def partition_batch(keyspace: str, key: tuple[bytes, ...], *, unlogged: bool = True) -> BatchStatement:
    """An empty batch for the partition whose key is `key`, routed to its replicas (what
    the driver's `add` would take from the first bound statement)."""
    batch = BatchStatement(batch_type=BatchType.UNLOGGED if unlogged else BatchType.LOGGED)
    batch.routing_key = list(key)
    batch.keyspace = keyspace
    return batch


def add_rows(batch: BatchStatement, statement: PreparedStatement, rows: Iterable[list[object]]) -> None:
    """Append already-serialised rows (value lists) of `statement` to `batch`."""
    add = getattr(batch, "_add_statement_and_params", None)
    if add is None:  # a driver without it: the public way, a BoundStatement per row
        for values in rows:
            bound = BoundStatement(statement)
            bound.values = values
            batch.add(bound)
        return
    query_id = statement.query_id
    for values in rows:
        add(True, query_id, values)


def clustering_keys(task_ids: Sequence[TaskId]) -> bytes:
    """The serialised `(run_at, task_id) IN ?` value of `read_tasks` for the home rows
    of `task_ids`: a list of `(id.run_at_ms, id)` tuples, as the driver would bind it
    (~0.2 µs an id instead of the ~5 of the driver's binding)."""
    return _INT32(len(task_ids)) + b"".join(
        [_CLUSTERING_KEY(32, 8, task_id.run_at_ms, 16, task_id.value.to_bytes(16)) for task_id in task_ids]
    )


def as_utc(moment: datetime) -> datetime:
    """`moment` as an aware UTC time: the driver reads timestamps as naive UTC datetimes."""
    return moment.replace(tzinfo=timezone.utc) if moment.tzinfo is None else moment


def stored_task(row: Sequence[Any]) -> StoredTask:
    """A row of `read_range` or `read_task` as a `StoredTask` (a row written before the
    cost column existed reads as cost 1); raises what a row that is not a task makes it raise."""
    (run_at, task_uuid, tenant, type_, priority, payload, attempt, max_attempts, key, status, status_attempt,
     error, cost) = row
    task = Task(
        id=TaskId.from_uuid(task_uuid), tenant=tenant, type=type_, payload=payload,
        run_at_ms=to_ms(as_utc(run_at)), priority=Priority.from_code(priority), attempt=attempt,
        max_attempts=max_attempts, idempotency_key=key, cost=1 if cost is None else cost,
    )
    return StoredTask(
        task, TaskStatus(status) if status else TaskStatus.SCHEDULED, status_attempt or 0, error or None
    )


def bad_row(partition: Partition, row: Sequence[Any], error: Exception) -> BadRow:
    """A row `stored_task` could not read, with its columns as plain values."""
    names = ("run_at", "task_id", "tenant", "type", "priority", "payload", "attempt", "max_attempts",
             "idempotency_key", "status", "status_attempt", "last_error", "cost")
    fields: dict[str, object] = {}
    for name, value in zip(names, row, strict=True):
        if isinstance(value, datetime):
            value = to_ms(as_utc(value))
        elif isinstance(value, uuid.UUID):
            value = value.bytes
        fields[name] = value
    run_at = fields["run_at"]
    task_id = fields["task_id"]
    return BadRow(partition, run_at if isinstance(run_at, int) else 0,
                  task_id if isinstance(task_id, bytes) else bytes(16), fields, f"{type(error).__name__}: {error}")


_STATUSES: dict[str | None, TaskStatus] = {status.value: status for status in TaskStatus}
_STATUSES.update({None: TaskStatus.SCHEDULED, "": TaskStatus.SCHEDULED})


def home_status(row: Sequence[Any]) -> HomeStatus:
    """A `read_statuses` row: (id, attempt, status, status_attempt)."""
    return HomeStatus(_STATUSES[row[2]], row[3] or 0)


def home_row(task_id: TaskId, row: Sequence[Any]) -> StoredTask:
    """A `read_tasks` row of `task_id`'s home row, on `get_many`'s hot path: the id and
    `run_at` are the caller's, and the fields, checked when the task was inserted, are
    not checked again (about half the cost of building a row)."""
    _, tenant, type_, priority, payload, attempt, max_attempts, key, status, status_attempt, error, cost = row
    task = Task.unchecked(
        task_id, tenant, type_, payload, task_id.run_at_ms, Priority.from_code(priority), attempt, max_attempts, key,
        1 if cost is None else cost,
    )
    return StoredTask(task, _STATUSES[status], status_attempt or 0, error or None)
