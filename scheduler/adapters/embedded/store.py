"""`SqliteTaskStore`: the task store of the embedded backend, one SQLite file in WAL mode.

It keeps the `TaskStore` contract (`scheduler.ports`) on one machine, fencing included,
so the dispatcher and workers run on it unchanged. Rows are keyed like the Cassandra
table, `(minute_bucket, shard, run_at, task_id)`, in a WITHOUT ROWID table, so a
partition read is one index range scan in `run_at` order.

Durability: a write returns after its transaction committed with `synchronous=FULL`,
i.e. after the WAL was fsynced (`synchronous="NORMAL"` trades the last commits on power
loss, not on a process crash, for speed). Several processes may open the same file:
SQLite serialises writers, and each write waits up to `busy_timeout_s` for its turn.
Within a process one connection is shared under a lock.

Status reports carry an error (`last_error`), set in the same conditional update as
the status, so it is replaced exactly when the status is; errors are cut to
`MAX_ERROR_CHARS` (`bounded_error`, the same rule as the Cassandra store's). A file made
before that column existed gets it when it is opened (`ALTER TABLE ... ADD COLUMN`), and
so do files made before tasks had a `cost` or a `history`; rows without a cost read as
cost 1, rows without a history have no records.

Retention (`scheduler.retention`): the `meta` row `retention_s`, recorded when the file
is made (files made before it read as the default, and get it recorded when opened).
A partition past it is deleted by `purge_expired`, a bounded number of rows a call,
walking the primary key from its first column (`minute_bucket`): no index of its own,
and no live row is read, but for the rows a later write keeps longer (`kept_until`, the
latest end a write gave the row, as each Cassandra cell keeps its TTL: a late write, a
late report, a cancel). The purge goes by the retention recorded when it runs and by
each row's `kept_until`, so a shorter retention applies to rows written after it and a
longer one to every row. It never reaches a partition a shard has not fired through.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from scheduler import cancels, retention
from scheduler.adapters.embedded.sqlite import create_tables, immediate, open_db
from scheduler.errors import ConfigError, SchemaConflict, StoreError
from scheduler.model import (
    BUCKET_MS,
    DEFAULT_SHARD_COUNT,
    Partition,
    Priority,
    Task,
    TaskId,
    check_in_partition,
    check_shard_count,
    minute_bucket,
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
from scheduler.ports.tasks import FINAL_SLOT
from scheduler.retention import DEFAULT_RETENTION_S, check_retention

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS tasks (
    minute_bucket   INTEGER NOT NULL,
    shard           INTEGER NOT NULL,
    run_at          INTEGER NOT NULL,
    task_id         BLOB    NOT NULL,
    tenant          TEXT    NOT NULL,
    type            TEXT    NOT NULL,
    priority        INTEGER NOT NULL,
    payload         BLOB    NOT NULL,
    attempt         INTEGER NOT NULL,
    max_attempts    INTEGER NOT NULL,
    idempotency_key TEXT,
    status          TEXT,
    status_attempt  INTEGER,
    status_rank     INTEGER,
    last_error      TEXT,
    cost            INTEGER,
    history         TEXT,           -- {"<attempt>": "<record>"}: scheduler.visibility.history
    kept_until      INTEGER,        -- ms: the latest end a write gave the row (scheduler.retention)
    PRIMARY KEY (minute_bucket, shard, run_at, task_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS partition_fences (
    minute_bucket INTEGER NOT NULL,
    shard         INTEGER NOT NULL,
    fence         INTEGER NOT NULL,
    PRIMARY KEY (minute_bucket, shard)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS shards (
    shard         INTEGER PRIMARY KEY,
    owner         TEXT,
    lease_token   INTEGER,
    fired_through INTEGER,
    baselines     TEXT
);
CREATE TABLE IF NOT EXISTS cancel_marks (
    shard INTEGER PRIMARY KEY,
    at    INTEGER NOT NULL,
    n     INTEGER NOT NULL
);
"""

PRAGMAS = ("journal_mode=WAL", "cache_size=-32768")
"""WAL lets readers run beside the writer; a 32 MiB page cache (the default is 2 MiB)
keeps the B-tree pages of a minute's 64 partitions in memory while a burst is written,
which bench/ingest.py measured at 1.4x the inserts per second."""

_COLUMNS = "run_at, task_id, tenant, type, priority, payload, attempt, max_attempts, idempotency_key, " \
           "status, status_attempt, last_error, cost"
_COLUMN_NAMES = tuple(name.strip() for name in _COLUMNS.split(","))

ADDED_COLUMNS = (("tasks", "last_error", "TEXT"), ("tasks", "cost", "INTEGER"), ("shards", "baselines", "TEXT"),
                 ("tasks", "history", "TEXT"), ("tasks", "kept_until", "INTEGER"))
"""Columns added to a table after files were made without them: `(table, column, type)`."""

GET_MANY_CHUNK = 200
"""Ids per `get_many` query (4 parameters each, well under SQLite's 32,766)."""

MAX_ERROR_CHARS = 2000
"""Longest error text kept with a status (see `bounded_error`)."""

_UPSERT = """
INSERT INTO tasks (minute_bucket, shard, run_at, task_id, tenant, type, priority, payload, attempt,
                   max_attempts, idempotency_key, cost, kept_until)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT DO UPDATE SET tenant = excluded.tenant, type = excluded.type, priority = excluded.priority,
    payload = excluded.payload, attempt = excluded.attempt, max_attempts = excluded.max_attempts,
    idempotency_key = COALESCE(excluded.idempotency_key, idempotency_key), cost = excluded.cost,
    kept_until = max(COALESCE(kept_until, 0), COALESCE(excluded.kept_until, 0))
"""

_HOME_ROW = "minute_bucket = ? AND shard = ? AND run_at = ? AND task_id = ?"
"""The predicate that picks one row by its primary key (see `_locate`)."""

_STATUS_UPDATE = f"""
UPDATE tasks SET status = ?, status_attempt = ?, status_rank = ?, last_error = ?,
    kept_until = max(COALESCE(kept_until, 0), ?)
WHERE {_HOME_ROW}
  AND (status_attempt IS NULL
       OR (CASE WHEN status_rank >= {TaskStatus.CANCELLED.rank} THEN {FINAL_SLOT} ELSE status_attempt END) * 8
          + status_rank <= ?)
"""
"""A report replaces the row's status only if its `report_order` is at least the
stored one's, computed here from the stored attempt and rank (the finished states, of
rank `cancelled` and up, stand above every attempt)."""

_PURGE_TASKS = """
DELETE FROM tasks WHERE (minute_bucket, shard, run_at, task_id) IN (
    SELECT minute_bucket, shard, run_at, task_id FROM tasks
    WHERE minute_bucket <= ? AND (kept_until IS NULL OR kept_until <= ?)
    ORDER BY minute_bucket, shard, run_at, task_id LIMIT ?)
"""
"""The oldest expired rows, up to a limit: the subquery walks the primary key from its
start and stops at the limit or at the first live bucket, passing the rows of expired
partitions that a later write keeps longer (a late write, a late report, a cancel);
each row goes by its key."""

_RETENTION = "SELECT value FROM meta WHERE name = 'retention_s'"

_PURGE_FENCES = """
DELETE FROM partition_fences WHERE (minute_bucket, shard) IN (
    SELECT minute_bucket, shard FROM partition_fences WHERE minute_bucket <= ?
    ORDER BY minute_bucket, shard LIMIT ?)
"""

Row = tuple[int, bytes, str, str, int, bytes, int, int, str | None, str | None, int | None, str | None, int | None]


def bounded_error(error: str | None) -> str | None:
    """`error` cut to at most `MAX_ERROR_CHARS` characters, the cut marked with how much
    was left out. The store bounds what it keeps whoever reports: a traceback or a
    response body can be any size, and every read of the task carries it. (The same
    rule as `scheduler.adapters.cassandra.store.bounded_error`, which this module cannot
    import without the Cassandra driver.)"""
    if error is None or len(error) <= MAX_ERROR_CHARS:
        return error
    marker = f"... [{len(error)} characters, cut]"
    return error[:MAX_ERROR_CHARS - len(marker)] + marker


class SqliteTaskStore:
    """The embedded `TaskStore`. `path` may be `":memory:"` for a private, throw-away store."""

    def __init__(
        self,
        path: str | Path,
        *,
        shard_count: int = DEFAULT_SHARD_COUNT,
        synchronous: str = "FULL",
        busy_timeout_s: float = 30.0,
        clock_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
    ) -> None:
        """`clock_ms` is the clock a write's retention counts from (`scheduler.retention`)."""
        check_shard_count(shard_count)
        self._clock_ms = clock_ms
        if synchronous not in ("FULL", "NORMAL"):
            raise ValueError(f"synchronous must be FULL or NORMAL, got {synchronous!r}")
        self._lock = threading.Lock()
        try:
            self._db = open_db(path, busy_timeout_s=busy_timeout_s, pragmas=(*PRAGMAS, f"synchronous={synchronous}"))
            with self._transaction() as db:
                create_tables(db, SCHEMA)
                add_missing_columns(db)
                db.execute("INSERT OR IGNORE INTO meta VALUES ('shard_count', ?)", (str(shard_count),))
                db.execute("INSERT OR IGNORE INTO meta VALUES ('created_ms', ?)", (str(time.time_ns() // 1_000_000),))
                db.execute("INSERT OR IGNORE INTO meta VALUES ('retention_s', ?)", (str(DEFAULT_RETENTION_S),))
                (recorded,) = db.execute("SELECT value FROM meta WHERE name = 'shard_count'").fetchone()
                (created,) = db.execute("SELECT value FROM meta WHERE name = 'created_ms'").fetchone()
                retention_row = db.execute(_RETENTION).fetchone()
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open the embedded store at {path}: {exc}") from exc
        if int(recorded) != shard_count:
            self._db.close()
            raise SchemaConflict(
                f"the embedded store at {path} was created with {recorded} shards, not {shard_count}; "
                "every task's partition depends on the count, so it cannot change"
            )
        try:
            recorded_retention = _recorded_retention(retention_row, path)
        except ConfigError:
            self._db.close()
            raise
        self._shard_count = shard_count
        self._created_ms = int(created)
        self._retention_s = recorded_retention
        self.path = str(path)

    @property
    def shard_count(self) -> int:
        return self._shard_count

    @property
    def created_ms(self) -> int | None:
        return self._created_ms

    @property
    def retention_s(self) -> int:
        """As recorded when the store was opened, or last set or purged by this store."""
        return self._retention_s

    def set_retention(self, seconds: int) -> None:
        """Record `seconds` as the retention (`ConfigError` if it is not one, and nothing
        changes). It applies at once to every row stored, here and in every process
        purging this file: see the module docstring."""
        check_retention(seconds)
        with self._transaction() as db:
            db.execute("INSERT INTO meta VALUES ('retention_s', ?) ON CONFLICT (name) DO UPDATE SET value = "
                       "excluded.value", (str(seconds),))
        self._retention_s = seconds

    def purge_expired(self, now_ms: int, limit: int) -> int:
        """Delete up to `limit` rows of the partitions past their retention at `now_ms`
        (`retention.expires_ms(minute_bucket, retention) <= now_ms`), oldest first, and,
        once no expired task row is left, up to the rest of `limit` of those partitions'
        fence rows; return how many rows went. One short transaction: it shares the
        file's one writer with ingest and status reports.

        The retention is read from the file in the same transaction, so a purge follows
        a retention set by another process since this store was opened. Cancelled,
        finished or not, every row of an expired partition goes (`scheduler.retention`),
        except rows a later write keeps longer and partitions a shard has not yet fired
        through: a machine switched off for longer than the retention loses nothing."""
        if limit < 1:
            raise ValueError(f"limit must be positive, got {limit}")
        with self._transaction() as db:
            recorded_retention = _recorded_retention(db.execute(_RETENTION).fetchone(), self.path)
            # expires_ms(bucket, retention) <= now_ms, solved for the bucket: a bound on
            # the key's first column, so the walk never reaches a live row.
            last_bucket = now_ms - BUCKET_MS - recorded_retention * 1000
            fired = _fired_through_all(db, self._shard_count)
            if fired is not None:  # never a partition a shard has not fired through: an outage
                last_bucket = min(last_bucket, fired - BUCKET_MS + 1)  # longer than the retention loses nothing
            removed = db.execute(_PURGE_TASKS, (last_bucket, now_ms, limit)).rowcount
            if removed < limit:  # no expired task row is left: their partitions' fences can go
                removed += db.execute(_PURGE_FENCES, (last_bucket, limit - removed)).rowcount
        self._retention_s = recorded_retention
        return removed

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """One write transaction, taken at once (BEGIN IMMEDIATE) so that a
        read-then-write inside it cannot interleave with another process's write."""
        with self._lock:
            try:
                with immediate(self._db) as transaction:
                    yield transaction
            except sqlite3.Error as exc:
                raise StoreError(f"embedded store failed: {exc}") from exc

    def _read(self, sql: str, parameters: Sequence[object]) -> list[Any]:
        with self._lock:
            try:
                return self._db.execute(sql, parameters).fetchall()
            except sqlite3.Error as exc:
                raise StoreError(f"embedded store failed: {exc}") from exc

    def _row_values(self, task: Task, now_ms: int) -> tuple[object, ...]:
        bucket = minute_bucket(task.run_at_ms)
        return (
            bucket, task.id.shard(self._shard_count), task.run_at_ms, task.id.bytes,
            task.tenant, task.type, task.priority.code, task.payload, task.attempt, task.max_attempts,
            task.idempotency_key, task.cost, self._kept_until(bucket, now_ms),
        )

    def _kept_until(self, bucket_ms: int, now_ms: int, floor_s: int = 0) -> int:
        """The end a write at `now_ms` into the partition of `bucket_ms` gives its row."""
        return retention.kept_until_ms(bucket_ms, self._retention_s, now_ms, floor_s=floor_s)

    def insert(self, tasks: Sequence[Task]) -> list[InsertFailure]:
        now_ms = self._clock_ms()
        rows = [self._row_values(task, now_ms) for task in tasks]
        try:
            with self._transaction() as db:
                db.executemany(_UPSERT, rows)
        except StoreError as exc:
            return [InsertFailure(tasks, str(exc))]
        return []

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
        last: tuple[int, bytes] | None = None
        low = -1 if after_ms is None else after_ms
        high = (1 << 62) if through_ms is None else through_ms
        while True:
            parameters: list[object]
            if last is None:
                where, parameters = "run_at > ?", [low]
            else:
                where, parameters = "(run_at, task_id) > (?, ?)", [last[0], last[1]]
            rows = self._read(
                f"SELECT {_COLUMNS} FROM tasks WHERE minute_bucket = ? AND shard = ? AND {where} AND run_at <= ? "
                "ORDER BY run_at, task_id LIMIT ?",
                [partition.minute_bucket, partition.shard, *parameters, high, page_size],
            )
            for row in rows:
                try:
                    stored = _stored_task(row)
                except ROW_ERRORS as exc:
                    run_at, id_bytes = row[0], row[1]
                    hand_over(BadRow(partition, run_at if isinstance(run_at, int) else 0,
                                     id_bytes if isinstance(id_bytes, bytes) and len(id_bytes) == 16 else bytes(16),
                                     dict(zip(_COLUMN_NAMES, row, strict=True)), f"{type(exc).__name__}: {exc}"),
                              on_bad_row)
                    continue
                yield stored
            if len(rows) < page_size:
                return
            last = (rows[-1][0], rows[-1][1])

    def count_partition(self, partition: Partition, *, after_ms: int, through_ms: int) -> int:
        rows = self._read(
            "SELECT count(*) FROM tasks WHERE minute_bucket = ? AND shard = ? AND run_at > ? AND run_at <= ?",
            [partition.minute_bucket, partition.shard, after_ms, through_ms],
        )
        return int(rows[0][0])

    def count_buckets(self, shard: int, buckets: Sequence[int], through_ms: int,
                      after_ms: int | None = None) -> dict[int, int]:
        if not buckets:
            return {}
        marks = ", ".join("?" * len(buckets))
        rows = self._read(
            f"SELECT minute_bucket, count(*) FROM tasks WHERE minute_bucket IN ({marks}) AND shard = ? "
            "AND run_at > ? AND run_at <= ? GROUP BY minute_bucket",
            [*buckets, shard, -1 if after_ms is None else after_ms, through_ms],
        )
        return {int(bucket): int(count) for bucket, count in rows if count}

    def _locate(self, task_id: TaskId) -> tuple[int, int, int, bytes]:
        """The primary key of the task's home row."""
        run_at = task_id.run_at_ms
        return (minute_bucket(run_at), task_id.shard(self._shard_count), run_at, task_id.bytes)

    def get(self, task_id: TaskId) -> StoredTask | None:
        rows = self._read(
            f"SELECT {_COLUMNS} FROM tasks WHERE {_HOME_ROW}",
            self._locate(task_id),
        )
        return _stored_task(rows[0]) if rows else None

    def attempts(self, task_id: TaskId) -> dict[int, str]:
        rows = self._read(f"SELECT history FROM tasks WHERE {_HOME_ROW}", self._locate(task_id))
        if not rows or rows[0][0] is None:
            return {}
        return {int(attempt): str(text) for attempt, text in json.loads(rows[0][0]).items()}

    def get_many(self, task_ids: Sequence[TaskId]) -> dict[TaskId, StoredTask]:
        wanted = {task_id.bytes: task_id for task_id in task_ids}
        found: dict[TaskId, StoredTask] = {}
        for row in self._home_rows(_COLUMNS, wanted.values()):
            task_id = wanted[row[1]]
            found[task_id] = _home_row(task_id, row)
        return found

    def statuses(self, task_ids: Sequence[TaskId]) -> dict[TaskId, HomeStatus]:
        wanted = {task_id.bytes: task_id for task_id in task_ids}
        return {wanted[id_bytes]: HomeStatus(_STATUSES[status], status_attempt or 0)
                for id_bytes, status, status_attempt in self._home_rows("task_id, status, status_attempt",
                                                                        wanted.values())}

    def _home_rows(self, columns: str, task_ids: Iterable[TaskId]) -> Iterator[Any]:
        """`columns` of the home rows of `task_ids` (without repeats) that exist,
        `GET_MANY_CHUNK` ids a query."""
        unique = list(task_ids)
        for start in range(0, len(unique), GET_MANY_CHUNK):
            chunk = unique[start:start + GET_MANY_CHUNK]
            # A join on the ids' primary keys: one primary-key lookup per id, in one query.
            keys = ", ".join(["(?, ?, ?, ?)"] * len(chunk))
            yield from self._read(
                f"WITH wanted (b, s, r, i) AS (VALUES {keys}) "
                f"SELECT {columns} FROM wanted CROSS JOIN tasks "
                "ON minute_bucket = b AND shard = s AND run_at = r AND task_id = i",
                [value for task_id in chunk for value in self._locate(task_id)],
            )

    def cancel(self, task_id: TaskId, tenant: str) -> CancelOutcome:
        key = self._locate(task_id)
        now = self._clock_ms()
        with self._transaction() as db:
            row = db.execute(f"SELECT {_COLUMNS} FROM tasks WHERE {_HOME_ROW}", key).fetchone()
            found = None if row is None else _stored_task(row)
            refusal = refusal_to_cancel(found, tenant)
            if refusal not in (None, CancelOutcome.ALREADY_CANCELLED):
                return refusal
            if refusal is None:
                assert found is not None  # a missing task is refused above
                attempt = found.latest_attempt
                # Kept past any retry the cancel stops (scheduler.retention.cancel_kept_s).
                kept = self._kept_until(key[0], now, retention.cancel_kept_s(self._retention_s))
                db.execute(_STATUS_UPDATE, (TaskStatus.CANCELLED.value, attempt, TaskStatus.CANCELLED.rank, None, kept,
                                            *key, report_order(attempt, TaskStatus.CANCELLED)))
            if cancels.may_be_in_flight(task_id.run_at_ms, now):  # in the same transaction as the status
                db.execute("INSERT INTO cancel_marks VALUES (?, ?, 1) ON CONFLICT (shard) DO UPDATE "
                           "SET at = max(at, excluded.at), n = n + 1", (task_id.shard(self._shard_count), now))
        return refusal or CancelOutcome.CANCELLED

    def read_cancel_marks(self) -> CancelMarks:
        rows = self._read("SELECT shard, at, n FROM cancel_marks", ())
        return CancelMarks({int(shard): int(at) for shard, at, _ in rows}, {int(shard): int(n) for shard, _, n in rows})

    def record_status(self, reports: Sequence[StatusReport]) -> None:
        now_ms = self._clock_ms()
        rows = []
        for report in reports:
            key = self._locate(report.task_id)
            rows.append((report.status.value, report.attempt, report.status.rank, bounded_error(report.error),
                         self._kept_until(key[0], now_ms), *key, report_order(report.attempt, report.status)))
        records = [(f'$."{report.attempt}"', report.record, *self._locate(report.task_id))
                   for report in reports if report.record is not None]
        with self._transaction() as db:
            db.executemany(_STATUS_UPDATE, rows)
            if records:  # each attempt's own entry: written whatever the status's order
                db.executemany(f"UPDATE tasks SET history = json_set(coalesce(history, '{{}}'), ?, ?) "
                               f"WHERE {_HOME_ROW}", records)

    def take_shard(self, shard: int, owner: str, token: int) -> bool:
        with self._transaction() as db:
            cursor = db.execute(
                "INSERT INTO shards (shard, owner, lease_token) VALUES (?, ?, ?) "
                "ON CONFLICT (shard) DO UPDATE SET owner = excluded.owner, lease_token = excluded.lease_token "
                "WHERE lease_token IS NULL OR lease_token <= excluded.lease_token",
                (shard, owner, token),
            )
            return cursor.rowcount == 1

    def read_shard(self, shard: int) -> ShardState:
        rows = self._read("SELECT owner, lease_token, fired_through, baselines FROM shards WHERE shard = ?", (shard,))
        if not rows:
            return ShardState(shard, None, None, None)
        owner, token, fired_through, baselines = rows[0]
        return ShardState(shard, owner, token, fired_through,
                          None if baselines is None else {int(b): int(n) for b, n in json.loads(baselines).items()})

    def advance_shard(self, shard: int, token: int, fired_through_ms: int,
                      baselines: Mapping[int, int] | None = None) -> bool:
        with self._transaction() as db:
            cursor = db.execute(
                "UPDATE shards SET fired_through = ?, baselines = coalesce(?, baselines) WHERE shard = ? "
                "AND lease_token = ? AND (fired_through IS NULL OR fired_through <= ?)",
                (fired_through_ms, None if baselines is None else json.dumps({str(b): n for b, n in baselines.items()}),
                 shard, token, fired_through_ms),
            )
            return cursor.rowcount == 1

    def write_fenced(self, partition: Partition, token: int, tasks: Sequence[Task]) -> bool:
        check_in_partition(tasks, partition, self._shard_count)
        with self._transaction() as db:
            cursor = db.execute(
                "INSERT INTO partition_fences VALUES (?, ?, ?) ON CONFLICT DO UPDATE SET fence = excluded.fence "
                "WHERE fence <= excluded.fence",
                (partition.minute_bucket, partition.shard, token),
            )
            if cursor.rowcount != 1:
                return False
            now_ms = self._clock_ms()
            db.executemany(_UPSERT, [self._row_values(task, now_ms) for task in tasks])
            return True

    def partition_fence(self, partition: Partition) -> int | None:
        rows = self._read(
            "SELECT fence FROM partition_fences WHERE minute_bucket = ? AND shard = ?",
            (partition.minute_bucket, partition.shard),
        )
        return rows[0][0] if rows else None

    def count(self) -> int:
        """How many task rows the store holds (a full scan: for tools and tests)."""
        ((count,),) = self._read("SELECT COUNT(*) FROM tasks", ())
        return int(count)

    def close(self) -> None:
        with self._lock:
            self._db.close()


def open_raw_task_file(path: str | Path) -> sqlite3.Connection:
    """A connection to the task store file at `path` with the store's own settings
    (`PRAGMAS`, synchronous=FULL) and tables, in autocommit mode, to write rows with
    `write_task_rows` and no store in between, e.g. for `bench/ingest.py`'s raw ceiling:
    what the file takes. The store's meta rows (shard count, creation time) are not
    written. Raises `sqlite3.Error`."""
    db = open_db(path, busy_timeout_s=30.0, pragmas=(*PRAGMAS, "synchronous=FULL"))
    with immediate(db) as opened:
        create_tables(opened, SCHEMA)
    return db


def write_task_rows(db: sqlite3.Connection, rows: Iterable[Sequence[object]]) -> None:
    """Write task rows as `SqliteTaskStore.insert` does, inside the caller's transaction:
    an upsert that keeps a row's status. A row, in order: minute_bucket, shard, run_at
    (ms), task_id (16 bytes), tenant, type, priority code, payload (msgpack bytes),
    attempt, max_attempts, idempotency_key (or None), cost and kept_until (ms, or None:
    the end of its minute plus the retention)."""
    db.executemany(_UPSERT, rows)


def add_missing_columns(db: sqlite3.Connection) -> None:
    """Add the `ADDED_COLUMNS` a file made before them lacks (inside the opening
    transaction, so two processes opening an old file at once add each column once)."""
    for table, column, type_ in ADDED_COLUMNS:
        present = {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
        if column not in present:
            db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {type_}")


def _fired_through_all(db: sqlite3.Connection, shard_count: int) -> int | None:
    """How far every shard has fired (the lowest cursor; one far in the past while any
    shard has none yet), or None if no shard was ever taken: a store no dispatcher has
    run on, whose purge only its tests call."""
    taken, fired, lowest = db.execute("SELECT count(*), count(fired_through), min(fired_through) FROM shards").fetchone()
    if not taken:
        return None
    return int(lowest) if fired == shard_count else -(1 << 62)


def _recorded_retention(row: tuple[str] | None, path: str | Path) -> int:
    """The retention recorded in the file, as `_RETENTION` read it (the default if none
    is); `ConfigError` if what is recorded is not a retention (written by hand)."""
    if row is None:
        return DEFAULT_RETENTION_S
    try:
        return check_retention(int(row[0]))
    except (ValueError, ConfigError) as exc:
        raise ConfigError(f"the embedded store at {path} records a retention it cannot use, {row[0]!r}: {exc}; "
                          "set one with `scheduler retention set`") from exc


_STATUSES: dict[str | None, TaskStatus] = {status.value: status for status in TaskStatus}
_STATUSES[None] = TaskStatus.SCHEDULED


def _home_row(task_id: TaskId, row: Row) -> StoredTask:
    """A row of `task_id`'s home row, on `get_many`'s hot path: the id is the caller's,
    and the fields, checked when the task was inserted, are not checked again."""
    _, _, tenant, type_, priority, payload, attempt, max_attempts, key, status, status_attempt, error, cost = row
    task = Task.unchecked(
        task_id, tenant, type_, payload, task_id.run_at_ms, Priority.from_code(priority), attempt, max_attempts, key,
        1 if cost is None else cost,
    )
    return StoredTask(task, _STATUSES[status], status_attempt or 0, error)


def _stored_task(row: Row) -> StoredTask:
    (run_at, id_bytes, tenant, type_, priority, payload, attempt, max_attempts, key, status, status_attempt,
     error, cost) = row
    task = Task(
        id=TaskId.from_bytes(id_bytes), tenant=tenant, type=type_, payload=payload, run_at_ms=run_at,
        priority=Priority.from_code(priority), attempt=attempt, max_attempts=max_attempts, idempotency_key=key,
        cost=1 if cost is None else cost,
    )
    return StoredTask(task, TaskStatus(status) if status else TaskStatus.SCHEDULED, status_attempt or 0, error)
