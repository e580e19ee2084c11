"""The local cluster as the tests found it: all three servers up and answering, a
second `start` changes nothing, and a server killed with SIGKILL is seen as down and
brought back by `start`."""

from __future__ import annotations

import os
import re
import signal
import subprocess

import pytest

from tests.cluster import CLUSTER_COMMAND, SERVERS, Cluster, local_status
from tests.support import wait_until, zookeeper_session

pytestmark = pytest.mark.local_cluster


@pytest.fixture
def local(cluster: Cluster) -> Cluster:
    assert cluster.local, "tests marked local_cluster are deselected when SCHEDULER_* names a cluster"
    return cluster


def test_status_reports_every_server_up_with_its_memory(local: Cluster) -> None:
    status = local_status()
    for server in SERVERS:
        assert status[server]["state"] == "up", status[server]
        assert isinstance(status[server]["pid"], int)
        assert status[server]["rss_mb"] > 10
    assert status["cassandra"]["port"] == local.cassandra.port


def test_start_again_is_harmless(local: Cluster) -> None:
    before = {server: entry["pid"] for server, entry in local_status().items()}
    result = subprocess.run([*CLUSTER_COMMAND, "start"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("already running") >= 3
    assert {server: entry["pid"] for server, entry in local_status().items()} == before


def test_a_server_killed_with_sigkill_shows_down_and_start_brings_it_back(local: Cluster) -> None:
    killed = local_status()["zookeeper"]["pid"]
    os.kill(killed, signal.SIGKILL)
    wait_until(lambda: local_status()["zookeeper"]["state"] == "down", timeout_s=15, what="zookeeper to show down")
    result = subprocess.run([*CLUSTER_COMMAND, "start"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert re.search(r"^zookeeper +started", result.stdout, re.MULTILINE), result.stdout
    restarted = local_status()["zookeeper"]
    assert restarted["state"] == "up"
    assert restarted["pid"] != killed
    with zookeeper_session(local.zookeeper.hosts) as client:
        assert client.get("/")[1] is not None
