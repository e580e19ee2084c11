"""Every write path and every cancel path on the real Cassandra, Kafka and ZooKeeper, in
a keyspace, topics and ZooKeeper root of the test's own (the `deployment` fixture), with
a real `scheduler dispatcher` and `scheduler worker`: see tests/write_paths.py for what
is held. The same on the embedded backend: tests/embedded/test_write_paths_embedded.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.dispatchers import Deployment
from tests.workers import Workers
from tests.write_paths import check_cancels, check_write_paths


@pytest.mark.timeout(180)
def test_every_write_path_runs_every_task_never_early_and_within_the_bound(
    deployment: Deployment, workers: Workers
) -> None:
    check_write_paths(deployment.fleet, workers)


@pytest.mark.timeout(150)
def test_a_cancelled_task_never_starts_whoever_cancelled_it_and_wherever_it_was(
    deployment: Deployment, workers: Workers, tmp_path: Path
) -> None:
    check_cancels(deployment.fleet, workers, tmp_path)
