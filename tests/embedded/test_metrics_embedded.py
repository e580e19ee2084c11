"""The metrics endpoints of real `scheduler dispatcher` and `scheduler worker` processes on
the embedded backend (SQLite files, no servers), scraped over HTTP: see
`tests.metrics.check_end_to_end`. The same on the real servers:
tests/integration/test_metrics_cluster.py."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from scheduler.adapters.embedded.queue import SqliteQueue
from scheduler.adapters.embedded.store import SqliteTaskStore
from tests.dispatchers import Fleet
from tests.metrics import check_end_to_end
from tests.unit.test_observability import DOCS, referenced_metrics
from tests.workers import Workers


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
def test_what_the_endpoints_say_adds_up_to_every_task_fired_once_and_handled_once(
    embedded: tuple[Fleet, Workers],
) -> None:
    result = check_end_to_end(*embedded, tasks=600)
    assert sum(s.value("scheduler_dispatcher_shards_held") for s in result.dispatchers) == 64
    exported = result.dispatchers[0].exportable() | result.worker.exportable()
    # What deploy/observability's rules and dashboard query is what the processes export,
    queried = referenced_metrics()
    assert queried - exported == set()
    # and docs/metrics.md lists every family of ours they export, and no other.
    ours = {name for name in result.dispatchers[0].names() | result.worker.names() if name.startswith("scheduler_")}
    documented = set(re.findall(r"`(scheduler_(?:dispatcher|worker)_[a-z0-9_]+)`", DOCS.read_text()))
    assert {re.sub(r"_total$", "", name) for name in documented} == ours
