"""The `store` fixture: each contract test runs once per `TaskStore` adapter, the
embedded SQLite store and the Cassandra store on the real server (fresh keyspace)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from scheduler.adapters.embedded.store import SqliteTaskStore
from scheduler.ports import TaskStore


@pytest.fixture(params=["sqlite", pytest.param("cassandra", marks=pytest.mark.integration)])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[TaskStore]:
    opened: TaskStore
    if request.param == "sqlite":
        opened = SqliteTaskStore(tmp_path / "tasks.db")
    else:
        from scheduler.adapters.cassandra.store import CassandraTaskStore

        opened = CassandraTaskStore.open(request.getfixturevalue("keyspace"))
    try:
        yield opened
    finally:
        opened.close()
