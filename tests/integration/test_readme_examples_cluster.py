"""The README's "Submitting tasks from Python" and "Workers" examples, run as a user
runs them on the real Cassandra, Kafka and ZooKeeper, in a keyspace, topics and
ZooKeeper root of the test's own (the `deployment` fixture): the worker module as
written under `scheduler worker`, the submit example as a script with only
`SCHEDULER_*` set, a `scheduler dispatcher` beside them. Every task it submits is
handed off through Kafka, fires on time and ends done."""

from __future__ import annotations

from pathlib import Path

import pytest

from scheduler.adapters.cassandra.connection import CassandraConnection
from tests.dispatchers import Deployment
from tests.readme import check_readme_examples, check_workflow_example


@pytest.mark.timeout(120)
def test_the_readme_examples_run_as_written(deployment: Deployment, cassandra: CassandraConnection,
                                            tmp_path: Path) -> None:
    keyspace = deployment.cassandra.keyspace

    def count_stored() -> int:
        rows = cassandra.session.execute(f"SELECT task_id FROM {keyspace}.tasks_by_bucket")
        return sum(1 for row in rows if row.task_id is not None)

    submitted = check_readme_examples(deployment.fleet.env, tmp_path, deployment.fleet, count_stored)
    assert len(submitted) >= 3


@pytest.mark.timeout(180)
def test_the_readme_workflow_example_runs_as_written(deployment: Deployment, tmp_path: Path) -> None:
    check_workflow_example(deployment.fleet.env, tmp_path, deployment.fleet)
