"""Workflows on the real Cassandra, Kafka and ZooKeeper, against real `scheduler
dispatcher` and `scheduler worker` processes (scenarios in tests/workflows.py; the same
on the embedded backend in tests/embedded/test_workflows_embedded.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import workflows
from tests.dispatchers import Deployment
from tests.workers import Workers

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def test_results_day_runs_render_send_report_in_order(deployment: Deployment, workers: Workers,
                                                      tmp_path: Path) -> None:
    workflows.results_day_runs_through(deployment.fleet.env, deployment.fleet, workers, tmp_path)


def test_a_kill_between_a_steps_end_and_its_successor_creates_one_successor(
        deployment: Deployment, workers: Workers, tmp_path: Path) -> None:
    workflows.kill_between_a_steps_end_and_its_successor(deployment.fleet.env, deployment.fleet, workers, tmp_path)


def test_a_step_delivered_twice_creates_one_successor(deployment: Deployment, workers: Workers) -> None:
    workflows.a_step_delivered_twice_creates_one_successor(deployment.fleet.env, deployment.fleet, workers)


def test_a_thousand_wide_join_fires_once_under_redeliveries(deployment: Deployment, workers: Workers,
                                                            tmp_path: Path) -> None:
    workflows.a_wide_join_fires_once_under_redeliveries(deployment.fleet.env, deployment.fleet, workers, tmp_path)


def test_a_dead_step_fails_the_workflow_and_a_replay_reopens_it(deployment: Deployment, workers: Workers,
                                                                tmp_path: Path) -> None:
    workflows.a_dead_step_fails_the_workflow_and_a_replay_reopens_it(deployment.fleet.env, deployment.fleet,
                                                                     workers, tmp_path)


def test_a_workflow_cancelled_half_way_starts_nothing_more(deployment: Deployment, workers: Workers,
                                                           tmp_path: Path) -> None:
    workflows.a_workflow_cancelled_half_way_starts_nothing_more(deployment.fleet.env, deployment.fleet, workers,
                                                                tmp_path)
