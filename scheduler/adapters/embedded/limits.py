"""`SqliteLimitsStore`: the `LimitsStore` port on the embedded backend, table
`tenant_limits` in the task store's SQLite file.

The rows are the Cassandra table's (`scheduler.adapters.cassandra.limits`): one per
scope (`tenant:<name>`, `default`, `global`), read and checked by the same
`limits_from_rows`, held to the same contract suite. Each write is one `BEGIN
IMMEDIATE` transaction.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from contextlib import AbstractContextManager
from pathlib import Path

from scheduler.adapters.embedded.sqlite import locked_transaction, open_store_file
from scheduler.errors import StoreError
from scheduler.fairness.limits import (
    Limits,
    ScopedRows,
    limits_from_rows,
)

SCHEMA = """
CREATE TABLE IF NOT EXISTS tenant_limits (
    scope      TEXT PRIMARY KEY,   -- tenant:<name>, default, or global (only rate)
    weight     INTEGER,
    cap        INTEGER,            -- running tasks (null: no cap)
    rate       REAL,               -- cost units a second (null: no rate)
    updated_ms INTEGER NOT NULL
);
"""

log = logging.getLogger(__name__)


class SqliteLimitsStore(ScopedRows):
    """The embedded `LimitsStore`, in the SQLite file at `path` (usually the task
    store's). Thread-safe; processes sharing the file see one store."""

    def __init__(self, path: str | Path, *, busy_timeout_s: float = 30.0) -> None:
        self._lock = threading.Lock()
        self._db = open_store_file(path, SCHEMA, "limits store", busy_timeout_s=busy_timeout_s)
        self.path = str(path)

    def _transaction(self) -> AbstractContextManager[sqlite3.Connection]:
        return locked_transaction(self._lock, self._db, "limits store")

    def _write(self, scope: str, weight: int | None, cap: int | None, rate: float | None) -> None:
        with self._transaction() as db:
            db.execute(
                "INSERT INTO tenant_limits (scope, weight, cap, rate, updated_ms) VALUES (?, ?, ?, ?, ?) "
                "ON CONFLICT (scope) DO UPDATE SET weight = excluded.weight, cap = excluded.cap, "
                "rate = excluded.rate, updated_ms = excluded.updated_ms",
                (scope, weight, cap, rate, time.time_ns() // 1_000_000),
            )

    def _delete(self, scope: str) -> bool:
        with self._transaction() as db:
            return db.execute("DELETE FROM tenant_limits WHERE scope = ?", (scope,)).rowcount == 1

    def read(self) -> Limits:
        with self._lock:
            try:
                rows = self._db.execute("SELECT scope, weight, cap, rate FROM tenant_limits ORDER BY scope").fetchall()
            except sqlite3.Error as exc:
                raise StoreError(f"limits store read failed: {exc}") from exc
        return limits_from_rows(rows, log)

    def close(self) -> None:
        with self._lock:
            self._db.close()
