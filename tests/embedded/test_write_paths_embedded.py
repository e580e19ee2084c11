"""Every write path and every cancel path on the embedded backend (SQLite store, log and
coordinator; no servers), with a real `scheduler dispatcher` and `scheduler worker`: see
tests/write_paths.py for what is held. The same on the real servers:
tests/integration/test_write_paths_cluster.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from scheduler.adapters.embedded.queue import SqliteQueue
from scheduler.adapters.embedded.store import SqliteTaskStore
from tests.dispatchers import Fleet
from tests.workers import Workers
from tests.write_paths import check_cancels, check_write_paths


@pytest.fixture
def embedded(tmp_path: Path) -> Iterator[tuple[Fleet, Workers]]:
    db = tmp_path / "db" / "tasks.db"
    db.parent.mkdir()
    SqliteTaskStore(db).close()  # the tables, before the processes race to make them
    SqliteQueue(db.with_name("queue.db")).close()
    env = {"SCHEDULER_BACKEND": "embedded", "SCHEDULER_DB": str(db), "SCHEDULER_LEASE_TIMEOUT_S": "2"}
    fleet = Fleet(env, tmp_path)
    workers = Workers(env, tmp_path, tmp_path / "sink.db")
    try:
        yield fleet, workers
    finally:
        workers.stop_all()
        fleet.stop_all()


@pytest.mark.timeout(180)
def test_every_write_path_runs_every_task_never_early_and_within_the_bound(
    embedded: tuple[Fleet, Workers],
) -> None:
    check_write_paths(*embedded)


@pytest.mark.timeout(150)
def test_a_cancelled_task_never_starts_whoever_cancelled_it_and_wherever_it_was(
    embedded: tuple[Fleet, Workers], tmp_path: Path
) -> None:
    check_cancels(*embedded, tmp_path)
