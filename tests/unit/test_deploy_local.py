"""deploy/local/cluster.py's safety rules, checked without starting a server: a taken
port fails before anything is launched, and a pid file that does not name our server
never gets anything signalled."""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

CLUSTER_PY = Path(__file__).resolve().parents[2] / "deploy" / "local" / "cluster.py"


def cluster_py(cluster_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("SCHEDULER_LOCAL_")}
    env["SCHEDULER_CLUSTER_DIR"] = str(cluster_dir)
    return subprocess.run([sys.executable, str(CLUSTER_PY), *args], capture_output=True, text=True, env=env, timeout=60)


def load_servers_module() -> Any:
    """deploy/local/servers.py, which is a script's module, not a package's."""
    spec = importlib.util.spec_from_file_location("deploy_local_servers", CLUSTER_PY.parent / "servers.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


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


def test_three_nodes_of_each_server_listen_on_their_own_addresses_under_their_own_names(tmp_path: Path) -> None:
    result = cluster_py(tmp_path, "status", "--json", "--nodes", "3")
    assert result.returncode == 3
    report = json.loads(result.stdout)
    assert list(report) == [f"{kind}-{n}" for kind in ("cassandra", "kafka", "zookeeper") for n in (1, 2, 3)]
    assert [report[f"kafka-{n}"]["host"] for n in (1, 2, 3)] == ["127.0.1.1", "127.0.1.2", "127.0.1.3"]
    assert report["zookeeper-2"]["ports"] == {"client": 2181, "peer": 2888, "election": 3888}
    assert report["cassandra-3"]["data_dir"] == str(tmp_path / "cassandra-3")
    one = cluster_py(tmp_path, "status", "--json", "--nodes", "3", "--only", "cassandra-2,zookeeper")
    assert list(json.loads(one.stdout)) == ["cassandra-2", "zookeeper-1", "zookeeper-2", "zookeeper-3"]


def test_a_node_that_does_not_exist_and_an_even_node_count_are_usage_errors(tmp_path: Path) -> None:
    missing = cluster_py(tmp_path, "kill", "--only", "cassandra-4", "--nodes", "3")
    assert missing.returncode == 2 and "unknown server(s) cassandra-4" in missing.stderr
    single = cluster_py(tmp_path, "stop", "--only", "cassandra-1")
    assert single.returncode == 2, "a single-node cluster's nodes are named by their server"
    even = cluster_py(tmp_path, "start", "--nodes", "2")
    assert even.returncode == 2 and "must be one of 1, 3, 5" in even.stderr


def test_kill_of_a_node_that_is_not_running_signals_nothing(tmp_path: Path) -> None:
    result = cluster_py(tmp_path, "kill", "--nodes", "3", "--only", "kafka-2")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "kafka-2: not running"


def test_env_points_the_scheduler_at_every_node_with_three_replicas(tmp_path: Path) -> None:
    result = cluster_py(tmp_path, "env", "--nodes", "3")
    assert result.returncode == 0, result.stderr
    exports = dict(line.removeprefix("export ").split("=", 1) for line in result.stdout.splitlines())
    assert exports["SCHEDULER_CASSANDRA_HOSTS"] == '"127.0.1.1,127.0.1.2,127.0.1.3"'
    assert exports["SCHEDULER_KAFKA_BOOTSTRAP"] == '"127.0.1.1:9092,127.0.1.2:9092,127.0.1.3:9092"'
    assert exports["SCHEDULER_REPLICATION"] == "\"{'class': 'NetworkTopologyStrategy', 'datacenter1': 3}\""
    shell = subprocess.run(["bash", "-c", result.stdout + '\nprintf %s "$SCHEDULER_REPLICATION"'],
                           capture_output=True, text=True, check=True)
    assert shell.stdout == "{'class': 'NetworkTopologyStrategy', 'datacenter1': 3}"
    single = dict(line.removeprefix("export ").split("=", 1)
                  for line in cluster_py(tmp_path, "env").stdout.splitlines())
    assert single["SCHEDULER_ZOOKEEPER_HOSTS"] == '"127.0.0.1:2181"' and "SCHEDULER_REPLICATION" not in single


def test_the_three_node_configs_make_one_ring_one_quorum_and_one_ensemble(tmp_path: Path) -> None:
    servers = load_servers_module()
    settings = servers.Settings(tmp_path, "127.0.1.1", 9042, 7000, 9092, 9093, 2181, None, nodes=3)
    rings = [servers.Cassandra(settings, n)._yaml() for n in (1, 2, 3)]
    tokens = {line for ring in rings for line in ring.splitlines() if line.startswith("initial_token:")}
    assert len(tokens) == 3, "each node has a token of its own"
    for n, ring in enumerate(rings, 1):
        assert f"listen_address: 127.0.1.{n}" in ring and "auto_bootstrap: false" in ring
        assert 'seeds: "127.0.1.1:7000,127.0.1.2:7000,127.0.1.3:7000"' in ring
    kafka = servers.Kafka(settings, 2)._properties()
    assert "node.id=2\n" in kafka
    assert "controller.quorum.voters=1@127.0.1.1:9093,2@127.0.1.2:9093,3@127.0.1.3:9093\n" in kafka
    assert "default.replication.factor=3\n" in kafka and "min.insync.replicas=2\n" in kafka
    assert "offsets.topic.replication.factor=3\n" in kafka and "unclean.leader.election.enable=false\n" in kafka
    zookeeper = servers.ZooKeeper(settings, 3)
    config = zookeeper._config()
    assert "server.1=127.0.1.1:2888:3888\nserver.2=127.0.1.2:2888:3888\nserver.3=127.0.1.3:2888:3888\n" in config
    assert "clientPortAddress=127.0.1.3" in config
    assert (zookeeper.data / "myid").read_text() == "3\n"
    single = servers.Kafka(servers.Settings(tmp_path, "127.0.0.1", 9042, 7000, 9092, 9093, 2181, None), 1)
    assert "default.replication.factor=1\n" in single._properties() and single.name == "kafka"


def test_wipe_refuses_one_node_of_several(tmp_path: Path) -> None:
    (tmp_path / "kafka-2").mkdir()
    result = cluster_py(tmp_path, "wipe", "--nodes", "3", "--only", "kafka-2")
    assert result.returncode == 2 and "every node of a server or none" in result.stderr
    assert (tmp_path / "kafka-2").exists()
    assert cluster_py(tmp_path, "wipe", "--nodes", "3", "--only", "kafka").returncode == 0
    assert not (tmp_path / "kafka-2").exists()
