"""A running dispatcher rides out servers that go away: the Kafka broker killed with
SIGKILL and restarted, and the Cassandra node killed and restarted. Nothing is lost;
what fell due meanwhile fires once the server is back (Kafka) or on time from memory
(Cassandra: loaded tasks do not need the store to fire)."""

from __future__ import annotations

import os
import signal
import subprocess

import pytest

from scheduler.adapters.cassandra.connection import CassandraConnection
from tests.cluster import CLUSTER_COMMAND, Cluster, answers, local_status
from tests.dispatchers import Deployment, by_id, submit_spread
from tests.support import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.local_cluster, pytest.mark.timeout(300)]


def kill_server(name: str) -> None:
    pid = local_status()[name]["pid"]
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: local_status()[name]["state"] == "down", timeout_s=30, what=f"{name} down")


def restart_servers() -> None:
    started = subprocess.run([*CLUSTER_COMMAND, "start"], capture_output=True, text=True, timeout=300)
    assert started.returncode == 0, started.stdout + started.stderr


def test_a_kafka_broker_killed_and_restarted_loses_no_task(deployment: Deployment, cluster: Cluster) -> None:
    assert cluster.local
    fleet = deployment.fleet
    dispatcher = fleet.start("a")
    fleet.wait_for_split({"a": 64}, timeout_s=60)
    now = deployment.now_ms()
    expected = submit_spread(deployment, 300, now + 3_000, now + 20_000)
    wait_until(lambda: deployment.now_ms() > now + 6_000, timeout_s=30, what="some tasks to fire")
    try:
        kill_server("kafka")
        down_at = deployment.now_ms()
        wait_until(lambda: deployment.now_ms() > down_at + 5_000, timeout_s=30, what="an outage of 5 s")
    finally:
        restart_servers()
    up_at = deployment.now_ms()

    published = deployment.ready.wait_for(set(expected), timeout_s=120)
    assert dispatcher.alive()
    first = {task_id: min(m.at_ms for m in messages) for task_id, messages in by_id(published)}
    assert all(first[task_id] >= run_at for task_id, run_at in expected.items())  # never early
    due_in_outage = [task_id for task_id, run_at in expected.items() if down_at + 1_000 < run_at < up_at]
    assert due_in_outage, "no task fell due during the outage"
    # Whether a flush timed out (publish_failures) depends on how fast the broker came
    # back; either way the producer's buffer or the retried batch carried them through.


def test_a_cassandra_node_killed_does_not_stop_loaded_tasks_from_firing(
    deployment: Deployment, cluster: Cluster, cassandra: CassandraConnection
) -> None:
    assert cluster.local
    fleet = deployment.fleet
    dispatcher = fleet.start("a")
    fleet.wait_for_split({"a": 64}, timeout_s=60)
    now = deployment.now_ms()
    expected = submit_spread(deployment, 200, now + 8_000, now + 16_000)
    wait_until(lambda: dispatcher.stats().get("waiting", 0) >= 200, timeout_s=30, what="the tasks to be loaded")
    try:
        kill_server("cassandra")
        published = deployment.ready.wait_for(set(expected), timeout_s=60)  # with the store down
    finally:
        restart_servers()
    first = {task_id: min(m.at_ms for m in messages) for task_id, messages in by_id(published)}
    lateness = [first[task_id] - run_at for task_id, run_at in expected.items()]
    assert min(lateness) >= 0
    assert max(lateness) <= 2_500  # the slice re-count cannot answer: each slice waits out its grace, no more
    assert dispatcher.alive()
    before = dispatcher.stats()["stats"]["advances"]
    wait_until(lambda: dispatcher.stats()["stats"]["advances"] > before, timeout_s=120,
               what="cursor advances to resume once Cassandra is back")
    wait_until(lambda: answers(cassandra), timeout_s=120, what="the test session's own connection to reconnect")
