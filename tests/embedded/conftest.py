"""`embedded`: a deployment on the embedded backend in the test's directory, its store
and log files made before any process starts (so the processes do not race to make
their tables), with a dispatcher fleet and a worker fleet, stopped after the test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from scheduler.adapters.embedded.queue import SqliteQueue
from scheduler.adapters.embedded.store import SqliteTaskStore
from tests.dispatchers import Fleet
from tests.workers import Workers


@pytest.fixture
def embedded(tmp_path: Path) -> Iterator[tuple[Fleet, Workers]]:
    db = tmp_path / "db" / "tasks.db"
    db.parent.mkdir()
    SqliteTaskStore(db).close()
    SqliteQueue(db.with_name("queue.db")).close()
    env = {"SCHEDULER_BACKEND": "embedded", "SCHEDULER_DB": str(db), "SCHEDULER_LEASE_TIMEOUT_S": "2"}
    fleet = Fleet(env, tmp_path)
    workers = Workers(env, tmp_path, tmp_path / "sink.db")
    try:
        yield fleet, workers
    finally:
        workers.stop_all()
        fleet.stop_all()
