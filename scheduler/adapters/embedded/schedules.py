"""`SqliteScheduleStore`: the `ScheduleStore` port on the embedded backend, tables
`schedules` and `schedule_fences` in the task store's SQLite file.

Each write is one `BEGIN IMMEDIATE` transaction, so its read and its write are one step
for every thread and process using the file: the same conditions as the Cassandra
adapter's lightweight transactions (`scheduler.adapters.cassandra.schedules`), held to
the same contract suite. `schedule_fences` holds each shard's fence, the highest token
that has advanced one of its schedules. A file made before a column of `ADDED_COLUMNS`
gets it when it is opened.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import uuid
from collections.abc import Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from scheduler.adapters.embedded.sqlite import locked_transaction, open_store_file
from scheduler.errors import StoreError
from scheduler.model import DEFAULT_SHARD_COUNT, Priority, check_shard_count
from scheduler.ports import AdvanceOutcome
from scheduler.recurring.schedule import MisfirePolicy, Schedule, TaskTemplate, readable, schedule_shard

SCHEMA = """
CREATE TABLE IF NOT EXISTS schedules (
    shard        INTEGER NOT NULL,
    schedule_id  BLOB    NOT NULL,
    tenant       TEXT    NOT NULL,
    name         TEXT    NOT NULL,
    cron         TEXT    NOT NULL,
    zone         TEXT    NOT NULL,
    type         TEXT    NOT NULL,
    payload      BLOB    NOT NULL,   -- msgpack
    priority     INTEGER NOT NULL,   -- 0 high, 1 normal, 2 low
    max_attempts INTEGER NOT NULL,
    misfire      TEXT    NOT NULL,   -- once, all, skip
    grace_s      INTEGER NOT NULL,
    jitter_s     INTEGER NOT NULL,
    next_slot_ms INTEGER NOT NULL,   -- the first slot whose run has not been created
    paused       INTEGER NOT NULL,
    created_ms   INTEGER NOT NULL,
    skipped      INTEGER NOT NULL DEFAULT 0,  -- slots left without a run (past the retention, or refused)
    last_skipped_ms INTEGER,                  -- the latest of them
    PRIMARY KEY (shard, schedule_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS schedule_fences (
    shard INTEGER PRIMARY KEY,
    fence INTEGER NOT NULL
);
"""

_COLUMNS = ("tenant, name, cron, zone, type, payload, priority, max_attempts, misfire, grace_s, jitter_s, "
            "next_slot_ms, paused, created_ms, skipped, last_skipped_ms")

ADDED_COLUMNS = (("schedules", "skipped", "INTEGER NOT NULL DEFAULT 0"), ("schedules", "last_skipped_ms", "INTEGER"))
"""Columns added after files were made without them: `(table, column, definition)`."""

log = logging.getLogger(__name__)


class SqliteScheduleStore:
    """The embedded `ScheduleStore`, in the SQLite file at `path` (usually the task
    store's). Thread-safe; processes sharing the file see one store."""

    def __init__(self, path: str | Path, *, shard_count: int = DEFAULT_SHARD_COUNT, busy_timeout_s: float = 30.0) -> None:
        self._shard_count = check_shard_count(shard_count)
        self._lock = threading.Lock()
        self._db = open_store_file(path, SCHEMA, "schedule store", busy_timeout_s=busy_timeout_s,
                                   added_columns=ADDED_COLUMNS)
        self.path = str(path)

    @property
    def shard_count(self) -> int:
        return self._shard_count

    def _transaction(self) -> AbstractContextManager[sqlite3.Connection]:
        return locked_transaction(self._lock, self._db, "schedule store")

    def _read(self, sql: str, parameters: Sequence[object]) -> list[Any]:
        with self._lock:
            try:
                return self._db.execute(sql, parameters).fetchall()
            except sqlite3.Error as exc:
                raise StoreError(f"schedule store failed: {exc}") from exc

    def _key(self, schedule_id: uuid.UUID) -> tuple[int, bytes]:
        return schedule_shard(schedule_id, self._shard_count), schedule_id.bytes

    def create(self, schedule: Schedule) -> bool:
        template = schedule.template
        with self._transaction() as db:
            cursor = db.execute(
                f"INSERT OR IGNORE INTO schedules (shard, schedule_id, {_COLUMNS}) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (*self._key(schedule.id), schedule.tenant, schedule.name, schedule.cron, schedule.zone,
                 template.type, template.payload, template.priority.code, template.max_attempts,
                 schedule.misfire.value, schedule.grace_s, schedule.jitter_s, schedule.next_slot_ms,
                 int(schedule.paused), schedule.created_ms, schedule.skipped, schedule.last_skipped_ms),
            )
            return cursor.rowcount == 1

    def get(self, schedule_id: uuid.UUID) -> Schedule | None:
        rows = self._read(f"SELECT {_COLUMNS} FROM schedules WHERE shard = ? AND schedule_id = ?",
                          self._key(schedule_id))
        return _schedule(rows[0]) if rows else None

    def list_shard(self, shard: int) -> list[Schedule]:
        rows = self._read(f"SELECT {_COLUMNS} FROM schedules WHERE shard = ? ORDER BY schedule_id", (shard,))
        return readable(rows, _schedule, log)

    def list_all(self, tenant: str | None = None) -> list[Schedule]:
        if tenant is None:
            rows = self._read(f"SELECT {_COLUMNS} FROM schedules", ())
        else:
            rows = self._read(f"SELECT {_COLUMNS} FROM schedules WHERE tenant = ?", (tenant,))
        return sorted(readable(rows, _schedule, log), key=lambda s: (s.tenant, s.name))

    def advance(self, schedule: Schedule, next_slot_ms: int, token: int, *, skipped: int = 0,
                last_skipped_ms: int | None = None) -> AdvanceOutcome:
        shard, key = self._key(schedule.id)
        with self._transaction() as db:
            fence_row = db.execute("SELECT fence FROM schedule_fences WHERE shard = ?", (shard,)).fetchone()
            if fence_row is not None and fence_row[0] > token:
                return AdvanceOutcome.FENCED
            cursor = db.execute(
                "UPDATE schedules SET next_slot_ms = ?, skipped = skipped + ?, "
                "last_skipped_ms = coalesce(?, last_skipped_ms) WHERE shard = ? AND schedule_id = ? "
                "AND next_slot_ms = ? AND paused = 0 AND created_ms = ?",  # created_ms: not one deleted and added again
                (next_slot_ms, skipped, last_skipped_ms if skipped else None, shard, key, schedule.next_slot_ms,
                 schedule.created_ms),
            )
            if cursor.rowcount != 1:
                return AdvanceOutcome.CHANGED
            db.execute("INSERT INTO schedule_fences (shard, fence) VALUES (?, ?) "
                       "ON CONFLICT (shard) DO UPDATE SET fence = excluded.fence", (shard, token))
            return AdvanceOutcome.APPLIED

    def pause(self, schedule_id: uuid.UUID) -> bool:
        with self._transaction() as db:
            cursor = db.execute("UPDATE schedules SET paused = 1 WHERE shard = ? AND schedule_id = ? AND paused = 0",
                                self._key(schedule_id))
            return cursor.rowcount == 1

    def resume(self, schedule_id: uuid.UUID, next_slot_ms: int) -> bool:
        with self._transaction() as db:
            cursor = db.execute(
                "UPDATE schedules SET paused = 0, next_slot_ms = ? WHERE shard = ? AND schedule_id = ? AND paused = 1",
                (next_slot_ms, *self._key(schedule_id)),
            )
            return cursor.rowcount == 1

    def delete(self, schedule_id: uuid.UUID) -> bool:
        with self._transaction() as db:
            cursor = db.execute("DELETE FROM schedules WHERE shard = ? AND schedule_id = ?", self._key(schedule_id))
            return cursor.rowcount == 1

    def close(self) -> None:
        with self._lock:
            self._db.close()


def _schedule(row: Sequence[Any]) -> Schedule:
    (tenant, name, cron, zone, type_, payload, priority, max_attempts, misfire, grace_s, jitter_s, next_slot_ms,
     paused, created_ms, skipped, last_skipped_ms) = row
    return Schedule(
        tenant=tenant, name=name, cron=cron, zone=zone,
        template=TaskTemplate(type_, bytes(payload), Priority.from_code(priority), max_attempts),
        misfire=MisfirePolicy(misfire), grace_s=grace_s, jitter_s=jitter_s, next_slot_ms=next_slot_ms,
        created_ms=created_ms, paused=bool(paused), skipped=skipped, last_skipped_ms=last_skipped_ms,
    )

