"""The README's "Submitting tasks from Python" and "Workers" examples, run as a user
runs them on the embedded backend (no servers): the worker module as written under
`scheduler worker`, the submit example as a script with only `SCHEDULER_*` set, a
`scheduler dispatcher` beside them. Every task it submits, some due a few seconds after
the submit and one due at once, is handed off, fires on time and ends done. The same
on the real servers: tests/integration/test_readme_examples_cluster.py."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import pytest

from scheduler.adapters.embedded.store import SqliteTaskStore
from tests.dispatchers import Fleet
from tests.readme import check_readme_examples, check_retention_commands, check_workflow_example


@pytest.fixture
def dispatchers(tmp_path: Path) -> Iterator[Fleet]:
    fleet = Fleet({"SCHEDULER_BACKEND": "embedded", "SCHEDULER_DB": str(tmp_path / "db" / "tasks.db"),
                   "SCHEDULER_LEASE_TIMEOUT_S": "2"}, tmp_path)
    try:
        yield fleet
    finally:
        fleet.stop_all()


def count_stored(db: Path) -> int:
    store = SqliteTaskStore(db)
    try:
        return store.count()
    finally:
        store.close()


@pytest.mark.timeout(90)
def test_the_readme_examples_run_as_written(tmp_path: Path, dispatchers: Fleet) -> None:
    db = Path(dispatchers.env["SCHEDULER_DB"])
    submitted = check_readme_examples(dispatchers.env, tmp_path, dispatchers, lambda: count_stored(db))
    assert len(submitted) >= 3


@pytest.mark.timeout(150)
def test_the_readme_workflow_example_runs_as_written(tmp_path: Path, dispatchers: Fleet) -> None:
    check_workflow_example(dispatchers.env, tmp_path, dispatchers)


def test_the_readmes_retention_commands_run_as_written(tmp_path: Path) -> None:
    db = tmp_path / "db" / "tasks.db"
    check_retention_commands({**os.environ, "SCHEDULER_BACKEND": "embedded", "SCHEDULER_DB": str(db)})
    with closing(SqliteTaskStore(db)) as store:
        assert store.retention_s == 3 * 86_400
