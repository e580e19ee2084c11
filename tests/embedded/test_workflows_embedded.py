"""Workflows on the embedded backend, against real `scheduler dispatcher` and
`scheduler worker` processes (scenarios in tests/workflows.py; the same on the real
servers in tests/integration/test_workflows_cluster.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import workflows
from tests.dispatchers import Fleet
from tests.workers import Workers

pytestmark = pytest.mark.timeout(240)


def test_results_day_runs_render_send_report_in_order(embedded: tuple[Fleet, Workers], tmp_path: Path) -> None:
    workflows.results_day_runs_through(embedded[0].env, embedded[0], embedded[1], tmp_path)


def test_a_kill_between_a_steps_end_and_its_successor_creates_one_successor(
        embedded: tuple[Fleet, Workers], tmp_path: Path) -> None:
    workflows.kill_between_a_steps_end_and_its_successor(embedded[0].env, embedded[0], embedded[1], tmp_path)


def test_a_step_delivered_twice_creates_one_successor(embedded: tuple[Fleet, Workers]) -> None:
    workflows.a_step_delivered_twice_creates_one_successor(embedded[0].env, embedded[0], embedded[1])


def test_a_thousand_wide_join_fires_once_under_redeliveries(embedded: tuple[Fleet, Workers], tmp_path: Path) -> None:
    workflows.a_wide_join_fires_once_under_redeliveries(embedded[0].env, embedded[0], embedded[1], tmp_path)


def test_a_dead_step_fails_the_workflow_and_a_replay_reopens_it(embedded: tuple[Fleet, Workers],
                                                                tmp_path: Path) -> None:
    workflows.a_dead_step_fails_the_workflow_and_a_replay_reopens_it(embedded[0].env, embedded[0], embedded[1],
                                                                     tmp_path)


def test_a_workflow_cancelled_half_way_starts_nothing_more(embedded: tuple[Fleet, Workers], tmp_path: Path) -> None:
    workflows.a_workflow_cancelled_half_way_starts_nothing_more(embedded[0].env, embedded[0], embedded[1], tmp_path)
