"""One server fault on the three-node cluster, as `make chaos` runs it: a Cassandra node
killed with SIGKILL in the middle of a burst (two dispatchers, two workers, an
application still submitting), then started again on its data. Every acknowledged
task is published and handled, none early, no cursor moves backwards, and the
application's submits go on being acknowledged while the node is down.

The cluster is the three-node one of `deploy/local` (`--nodes 3`, on 127.0.1.1-3, beside
the single-node one the other tests use); the bench starts it if it is not up and then
stops it again. The other faults run in `make chaos` (figures in docs/reliability.md)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cluster import REPO

pytestmark = [pytest.mark.integration, pytest.mark.local_cluster, pytest.mark.timeout(900)]


def test_a_cassandra_node_killed_mid_burst_loses_no_acknowledged_task(tmp_path: Path) -> None:
    out = tmp_path / "chaos.json"
    bench = subprocess.Popen(
        [sys.executable, str(REPO / "bench" / "chaos.py"), "--faults", "cassandra-kill", "--tasks", "4000",
         "--spread-s", "45", "--start-cluster", "--work-dir", str(tmp_path / "work"), "--out", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    try:
        stdout, stderr = bench.communicate(timeout=780)
    except subprocess.TimeoutExpired:
        bench.send_signal(signal.SIGTERM)  # it stops its processes, and the cluster it started
        stdout, stderr = bench.communicate(timeout=100)
        pytest.fail(f"the chaos bench did not finish in time:\n{stdout}\n{stderr[-6000:]}")
    assert bench.returncode == 0, f"{stdout}\n{stderr[-6000:]}"
    (run,) = json.loads(out.read_text())["runs"]
    assert run["replication"] == "{'class': 'NetworkTopologyStrategy', 'datacenter1': 3}"
    result = run["result"]
    assert result["acknowledged"] > 4000, "the burst and the application's own submits"
    assert result["lost_unpublished"] == result["lost_unhandled"] == 0
    assert result["early_published"] == result["early_handled"] == 0
    fault = run["fault"]
    assert fault["target"] == "cassandra-2" and fault["restart_s"] > 1
    producer = run["producer"]
    assert producer["acknowledged_while_faulted"] > 0, "submits went on while a replica was down"
    assert producer["given_up"] == 0
    node = run["restarted_node"]
    assert node["asked"] > 0 and node["rows"] == node["done"] == node["asked"], \
        "the node got what it missed (rows and final statuses) from the others' hints"
    cursors = run["cursors"]
    assert cursors["reads"] > 64 * 10 and cursors["backwards"] == 0
