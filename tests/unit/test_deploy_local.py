"""deploy/local/cluster.py's safety rules, checked without starting a server: a taken
port fails before anything is launched, and a pid file that does not name our server
never gets anything signalled."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

CLUSTER_PY = Path(__file__).resolve().parents[2] / "deploy" / "local" / "cluster.py"


def cluster_py(cluster_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("SCHEDULER_LOCAL_")}
    env["SCHEDULER_CLUSTER_DIR"] = str(cluster_dir)
    return subprocess.run([sys.executable, str(CLUSTER_PY), *args], capture_output=True, text=True, env=env, timeout=60)


@pytest.fixture
def listener() -> Iterator[int]:
    """A port on loopback held by this test process."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def test_a_taken_port_fails_at_once_naming_the_port_the_holder_and_the_fix(tmp_path: Path, listener: int) -> None:
    result = cluster_py(tmp_path, "start", "--only", "zookeeper", "--zookeeper-port", str(listener))
    assert result.returncode == 4, result.stderr
    assert f"port {listener} on 127.0.0.1, needed by zookeeper (client port), is in use by pid {os.getpid()}" in result.stderr
    assert "SCHEDULER_LOCAL_ZOOKEEPER_PORT=<port> or --zookeeper-port <port>" in result.stderr
    assert not (tmp_path / "zookeeper" / "pid.json").exists()
    assert not (tmp_path / "lib").exists(), "nothing is fetched or launched before the ports are checked"


def test_one_port_configured_for_two_servers_is_refused(tmp_path: Path) -> None:
    result = cluster_py(tmp_path, "start", "--kafka-port", "39555", "--zookeeper-port", "39555")
    assert result.returncode == 4
    assert "port 39555 is configured for both" in result.stderr


def test_stop_never_signals_a_pid_that_is_not_our_server(tmp_path: Path) -> None:
    decoy = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        pid_file = tmp_path / "zookeeper" / "pid.json"
        pid_file.parent.mkdir(parents=True)
        pid_file.write_text(json.dumps({"pid": decoy.pid, "host": "127.0.0.1", "ports": {"client": 2181}, "started_at": 0}))
        result = cluster_py(tmp_path, "stop", "--only", "zookeeper")
        assert result.returncode == 0, result.stderr
        assert "not running (removed a stale pid file)" in result.stdout
        assert decoy.poll() is None, "the decoy process was signalled"
        assert not pid_file.exists()
    finally:
        decoy.kill()
        decoy.wait()


def test_status_of_a_cluster_that_never_ran_is_down_with_exit_3(tmp_path: Path) -> None:
    result = cluster_py(tmp_path, "status", "--json")
    assert result.returncode == 3
    report = json.loads(result.stdout)
    assert set(report) == {"cassandra", "kafka", "zookeeper"}
    assert {entry["state"] for entry in report.values()} == {"down"}
    assert report["cassandra"]["ports"] == {"native": 9042, "storage": 7000}


def test_bad_arguments_are_usage_errors(tmp_path: Path) -> None:
    assert cluster_py(tmp_path, "start", "--only", "redis").returncode == 2
    assert cluster_py(tmp_path, "start", "--kafka-port", "70000").returncode == 2
