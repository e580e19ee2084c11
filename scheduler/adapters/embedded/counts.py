"""`SqliteCountStore`: the `CountStore` port on the embedded backend, in a file of its own
(`counts.db` beside the tasks), so that every process's writes of its counts every few
seconds never wait on, or hold up, the task store's write lock.

The tables are the Cassandra ones (`scheduler.adapters.cassandra.counts`), one column per
event of `scheduler.visibility.counts.EVENTS`. Cassandra expires old rows by TTL; here
the fold (`write_snapshot`) deletes what is past the same ages, and reads of processes
leave out reports older than `PROCESS_TTL_MS`. Synchronous=NORMAL: a power cut may lose
the last writes of counts, which the next writes replace anyway; tasks are not here.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from scheduler.adapters.embedded.sqlite import create_tables, immediate, locked_transaction, open_db
from scheduler.errors import StoreError
from scheduler.ports import LatenessRow, ProcessReport
from scheduler.visibility.counts import EVENTS, HOUR_MS, MINUTE_MS, CountRow, Pair, Values
from scheduler.visibility.histogram import LatencyHistogram
from scheduler.visibility.retention import HOUR_ROWS_KEPT_MS, MINUTE_ROWS_KEPT_MS, PROCESS_TTL_MS

_COLUMNS = ", ".join(f"{event} INTEGER NOT NULL" for event in EVENTS)
_NAMES = ", ".join(EVENTS)
_MARKS = ", ".join("?" for _ in EVENTS)

SCHEMA = f"""
CREATE TABLE IF NOT EXISTS count_hours (
    hour INTEGER NOT NULL, tenant TEXT NOT NULL, type TEXT NOT NULL, writer TEXT NOT NULL, {_COLUMNS},
    PRIMARY KEY (hour, tenant, type, writer)
);
CREATE TABLE IF NOT EXISTS count_minutes (
    hour INTEGER NOT NULL, tenant TEXT NOT NULL, minute INTEGER NOT NULL, type TEXT NOT NULL,
    writer TEXT NOT NULL, {_COLUMNS},
    PRIMARY KEY (hour, tenant, minute, type, writer)
);
CREATE TABLE IF NOT EXISTS count_snapshots (
    hour INTEGER NOT NULL, tenant TEXT NOT NULL, type TEXT NOT NULL, {_COLUMNS},
    PRIMARY KEY (hour, tenant, type)
);
CREATE TABLE IF NOT EXISTS count_snapshot_latest (
    id INTEGER PRIMARY KEY CHECK (id = 0), hour INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS processes (
    writer TEXT PRIMARY KEY, role TEXT NOT NULL, host TEXT NOT NULL, pid INTEGER NOT NULL,
    started_ms INTEGER NOT NULL, updated_ms INTEGER NOT NULL, running TEXT NOT NULL, detail TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS lateness_minutes (
    hour INTEGER NOT NULL, kind TEXT NOT NULL, minute INTEGER NOT NULL, writer TEXT NOT NULL,
    buckets TEXT NOT NULL, sum_ms INTEGER NOT NULL,
    PRIMARY KEY (hour, kind, minute, writer)
);
"""


def counts_path(tasks_db: Path) -> Path:
    """Where the embedded backend keeps its counts: beside the task store's file."""
    return tasks_db.with_name("counts.db")


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class SqliteCountStore:
    """The embedded `CountStore`. Thread-safe; processes sharing the file see one store."""

    def __init__(self, path: str | Path, *, busy_timeout_s: float = 30.0) -> None:
        self._lock = threading.Lock()
        try:
            self._db = open_db(path, busy_timeout_s=busy_timeout_s,
                               pragmas=("journal_mode=WAL", "synchronous=NORMAL"))
            with immediate(self._db) as db:
                create_tables(db, SCHEMA)
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open the count store at {path}: {exc}") from exc
        self.path = str(path)

    def _read(self, sql: str, values: tuple[object, ...]) -> list[tuple[Any, ...]]:
        with self._lock:
            try:
                return self._db.execute(sql, values).fetchall()
            except sqlite3.Error as exc:
                raise StoreError(f"count store read failed: {exc}") from exc

    def write_counts(self, hours: Sequence[CountRow], minutes: Sequence[CountRow]) -> None:
        with locked_transaction(self._lock, self._db, "count store write") as db:
            db.executemany(
                f"INSERT OR REPLACE INTO count_hours (hour, tenant, type, writer, {_NAMES}) "
                f"VALUES (?, ?, ?, ?, {_MARKS})",
                [(r.period, r.tenant, r.type, r.writer, *r.values) for r in hours])
            db.executemany(
                f"INSERT OR REPLACE INTO count_minutes (hour, tenant, minute, type, writer, {_NAMES}) "
                f"VALUES (?, ?, ?, ?, ?, {_MARKS})",
                [(r.period * MINUTE_MS // HOUR_MS, r.tenant, r.period, r.type, r.writer, *r.values) for r in minutes])

    def read_hours(self, hours: Sequence[int]) -> list[CountRow]:
        if not hours:
            return []
        marks = ", ".join("?" for _ in hours)
        rows = self._read(f"SELECT hour, tenant, type, writer, {_NAMES} FROM count_hours WHERE hour IN ({marks})",
                          tuple(hours))
        return [CountRow(int(r[0]), str(r[1]), str(r[2]), str(r[3]), tuple(int(v) for v in r[4:]))
                for r in rows]

    def read_minutes(self, first_minute: int, last_minute: int, tenant: str) -> list[CountRow]:
        rows = self._read(
            f"SELECT minute, tenant, type, writer, {_NAMES} FROM count_minutes "
            "WHERE hour BETWEEN ? AND ? AND tenant = ? AND minute BETWEEN ? AND ?",
            (first_minute * MINUTE_MS // HOUR_MS, last_minute * MINUTE_MS // HOUR_MS, tenant, first_minute,
             last_minute))
        return [CountRow(int(r[0]), str(r[1]), str(r[2]), str(r[3]), tuple(int(v) for v in r[4:]))
                for r in rows]

    def start_snapshots(self, hour: int) -> None:
        with locked_transaction(self._lock, self._db, "count store write") as db:
            db.execute("INSERT OR IGNORE INTO count_snapshot_latest (id, hour) VALUES (0, ?)", (hour,))

    def read_snapshot(self) -> tuple[int, dict[Pair, Values]] | None:
        latest = self._read("SELECT hour FROM count_snapshot_latest WHERE id = 0", ())
        if not latest:
            return None
        hour = int(latest[0][0])
        rows = self._read(f"SELECT tenant, type, {_NAMES} FROM count_snapshots WHERE hour = ?", (hour,))
        return hour, {(str(r[0]), str(r[1])): tuple(int(v) for v in r[2:]) for r in rows}

    def write_snapshot(self, hour: int, totals: Mapping[Pair, Values], drop: int | None) -> None:
        with locked_transaction(self._lock, self._db, "count store write") as db:
            db.executemany(
                f"INSERT OR REPLACE INTO count_snapshots (hour, tenant, type, {_NAMES}) VALUES (?, ?, ?, {_MARKS})",
                [(hour, tenant, type_, *values) for (tenant, type_), values in totals.items()])
            db.execute("INSERT OR REPLACE INTO count_snapshot_latest (id, hour) VALUES (0, ?)", (hour,))
            if drop is not None and drop != hour:
                db.execute("DELETE FROM count_snapshots WHERE hour = ?", (drop,))
            # What Cassandra's TTLs would have expired by now.
            now = _now_ms()
            db.execute("DELETE FROM count_hours WHERE hour < ?", ((now - HOUR_ROWS_KEPT_MS) // HOUR_MS,))
            db.execute("DELETE FROM count_minutes WHERE hour < ?", ((now - MINUTE_ROWS_KEPT_MS) // HOUR_MS,))
            db.execute("DELETE FROM lateness_minutes WHERE hour < ?", ((now - MINUTE_ROWS_KEPT_MS) // HOUR_MS,))

    def write_process(self, report: ProcessReport) -> None:
        running = json.dumps([[t, k, n] for (t, k), n in report.running.items()])
        with locked_transaction(self._lock, self._db, "count store write") as db:
            db.execute(
                "INSERT OR REPLACE INTO processes (writer, role, host, pid, started_ms, updated_ms, running, detail) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (report.writer, report.role, report.host, report.pid, report.started_ms, report.updated_ms, running,
                 json.dumps(dict(report.detail))))
            db.execute("DELETE FROM processes WHERE updated_ms < ?", (_now_ms() - PROCESS_TTL_MS,))

    def read_processes(self) -> list[ProcessReport]:
        rows = self._read(
            "SELECT writer, role, host, pid, started_ms, updated_ms, running, detail FROM processes "
            "WHERE updated_ms >= ? ORDER BY role, writer", (_now_ms() - PROCESS_TTL_MS,))
        return [ProcessReport(str(r[0]), str(r[1]), str(r[2]), int(r[3]), int(r[4]), int(r[5]),
                              {(t, k): n for t, k, n in json.loads(str(r[6]))}, json.loads(str(r[7])))
                for r in rows]

    def write_lateness(self, rows: Sequence[LatenessRow]) -> None:
        with locked_transaction(self._lock, self._db, "count store write") as db:
            db.executemany(
                "INSERT OR REPLACE INTO lateness_minutes (hour, kind, minute, writer, buckets, sum_ms) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                [(r.minute * MINUTE_MS // HOUR_MS, r.kind, r.minute, r.writer, json.dumps(r.histogram.counts),
                  r.histogram.sum_ms) for r in rows])

    def read_lateness(self, kind: str, first_minute: int, last_minute: int) -> list[LatenessRow]:
        rows = self._read(
            "SELECT minute, writer, buckets, sum_ms FROM lateness_minutes "
            "WHERE hour BETWEEN ? AND ? AND kind = ? AND minute BETWEEN ? AND ?",
            (first_minute * MINUTE_MS // HOUR_MS, last_minute * MINUTE_MS // HOUR_MS, kind, first_minute,
             last_minute))
        return [LatenessRow(int(r[0]), kind, str(r[1]), LatencyHistogram.stored(json.loads(str(r[2])), int(r[3])))
                for r in rows]

    def close(self) -> None:
        with self._lock:
            self._db.close()
