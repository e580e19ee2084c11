"""The local cluster as the tests found it: all three servers up and answering, and a
second `start` changes nothing."""

from __future__ import annotations

import subprocess

import pytest

from tests.integration.conftest import CLUSTER_COMMAND, SERVERS, Cluster, local_status


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
