"""`CassandraLimitsStore`: the `LimitsStore` port on Cassandra (table `tenant_limits`).

One row per scope (`tenant:<name>`, `default`, `global`), each in its own partition.
The table is small (one row per tenant with limits of its own), so `read` is one
whole-table read, at the connection's consistency, every few seconds per dispatcher.
Writes are plain whole-row writes (no lightweight transactions: the last operator's
write wins, by the client's timestamp). `delete_tenant` reads the row first to answer
whether there was one; two resets at once may both answer True.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from scheduler.adapters.cassandra.connection import DRIVER_ERRORS, CassandraConnection, prepare_for_table, run_prepared
from scheduler.adapters.cassandra.refusals import raise_if_denied
from scheduler.errors import StoreError
from scheduler.fairness.limits import (
    Limits,
    ScopedRows,
    limits_from_rows,
)
from scheduler.settings import check_keyspace

if TYPE_CHECKING:
    from scheduler.adapters.cassandra.store import CassandraTaskStore

_QUERIES = {
    "read": "SELECT scope, weight, cap, rate FROM {keyspace}.tenant_limits",
    "exists": "SELECT scope FROM {keyspace}.tenant_limits WHERE scope = ?",
    "write": "INSERT INTO {keyspace}.tenant_limits (scope, weight, cap, rate, updated_at) VALUES (?, ?, ?, ?, ?)",
    "delete": "DELETE FROM {keyspace}.tenant_limits WHERE scope = ?",
}

log = logging.getLogger(__name__)


class CassandraLimitsStore(ScopedRows):
    """The distributed `LimitsStore`, on a task store's session
    (`CassandraLimitsStore.for_store`). Thread-safe (the driver's session is)."""

    def __init__(self, connection: CassandraConnection, keyspace: str) -> None:
        check_keyspace(keyspace)
        self._session = connection.session
        self.keyspace = keyspace
        self._q = prepare_for_table(self._session, _QUERIES, keyspace, "limits store", "tenant_limits")

    @classmethod
    def for_store(cls, store: CassandraTaskStore) -> CassandraLimitsStore:
        """A limits store in the task store's keyspace, on its session (closing it does
        nothing; it is unusable once the task store is closed)."""
        return cls(store.connection, store.keyspace)

    def _run(self, name: str, values: tuple[object, ...]) -> Any:
        return run_prepared(self._session, self._q, name, values, "limits store")

    def _write(self, scope: str, weight: int | None, cap: int | None, rate: float | None) -> None:
        self._run("write", (scope, weight, cap, rate, datetime.now(UTC)))

    def read(self) -> Limits:
        try:
            rows = [tuple(row) for row in self._run("read", ())]  # pages are fetched while iterating
        except DRIVER_ERRORS as exc:
            raise_if_denied(exc, self._session, "reading the limits store")
            raise StoreError(f"limits store read failed: {type(exc).__name__}: {exc}") from exc
        return limits_from_rows(rows, log)

    def _delete(self, scope: str) -> bool:
        if self._run("exists", (scope,)).one() is None:
            return False
        self._run("delete", (scope,))
        return True

    def close(self) -> None:
        """Nothing: the session is the task store's."""
