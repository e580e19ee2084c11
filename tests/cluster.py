"""Fixtures that give each integration test the real servers and a place of its own.

The session fixture `cluster` finds the servers in this order:
1. an already running cluster named by `SCHEDULER_CASSANDRA_HOSTS` / `SCHEDULER_CASSANDRA_PORT`,
   `SCHEDULER_KAFKA_BOOTSTRAP` and `SCHEDULER_ZOOKEEPER_HOSTS` (any one set means "use these";
   the others keep their defaults), which is never started or stopped;
2. the local cluster of `deploy/local/cluster.py`, if `status` says all three are up
   (left running afterwards);
3. otherwise it starts the local cluster and stops it at the end of the session, unless
   `SCHEDULER_KEEP_CLUSTER=1`.

Each test then gets its own keyspace, Kafka topic or ZooKeeper chroot, removed afterwards.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]
from kazoo.client import KazooClient

from scheduler.adapters.cassandra import schema
from scheduler.adapters.cassandra.connection import DRIVER_ERRORS, CassandraConnection, connect
from scheduler.adapters.kafka.security import client_config
from scheduler.settings import CassandraSettings, KafkaSettings, ZooKeeperSettings
from tests.support import EXTERNAL_CLUSTER_VARIABLES, zookeeper_session

REPO = Path(__file__).resolve().parents[1]
CLUSTER_COMMAND = [sys.executable, str(REPO / "deploy" / "local" / "cluster.py")]
START_TIMEOUT_S = 300
SERVERS = ("cassandra", "kafka", "zookeeper")


@dataclass(frozen=True)
class Cluster:
    cassandra: CassandraSettings
    kafka: KafkaSettings
    zookeeper: ZooKeeperSettings
    local: bool


Status = dict[str, dict[str, Any]]


def local_status() -> Status:
    result = subprocess.run([*CLUSTER_COMMAND, "status", "--json"], capture_output=True, text=True, timeout=60)
    if not result.stdout.strip():
        raise RuntimeError(f"deploy/local/cluster.py status printed nothing: {result.stderr}")
    status: Status = json.loads(result.stdout)
    return status


def cluster_env(cluster: Cluster) -> dict[str, str]:
    """This process's environment, pointed at `cluster`: for the `scheduler` commands and
    benches a test starts."""
    return {**os.environ, "SCHEDULER_CASSANDRA_HOSTS": ",".join(cluster.cassandra.hosts),
            "SCHEDULER_CASSANDRA_PORT": str(cluster.cassandra.port),
            "SCHEDULER_KAFKA_BOOTSTRAP": cluster.kafka.bootstrap,
            "SCHEDULER_ZOOKEEPER_HOSTS": cluster.zookeeper.hosts}


def all_up(status: Status) -> bool:
    return all(status.get(server, {}).get("state") == "up" for server in SERVERS)


def local_cluster(status: Status) -> Cluster:
    """Addresses of the running local servers, as `status --json` reports them."""
    cassandra, kafka, zookeeper = (status[server] for server in SERVERS)
    return Cluster(
        cassandra=CassandraSettings(hosts=(cassandra["host"],), port=int(cassandra["port"])),
        kafka=KafkaSettings(bootstrap=f"{kafka['host']}:{kafka['port']}"),
        zookeeper=ZooKeeperSettings(hosts=f"{zookeeper['host']}:{zookeeper['port']}"),
        local=True,
    )


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    if any(os.environ.get(variable) for variable in EXTERNAL_CLUSTER_VARIABLES):
        yield Cluster(CassandraSettings.from_env(), KafkaSettings.from_env(), ZooKeeperSettings.from_env(), local=False)
        return
    status = local_status()
    if all_up(status):
        yield local_cluster(status)
        return
    started = subprocess.run(
        [*CLUSTER_COMMAND, "start"], capture_output=True, text=True, timeout=START_TIMEOUT_S
    )
    if started.returncode != 0:
        pytest.skip(
            "the local cluster could not be started (python deploy/local/cluster.py start):\n"
            f"{started.stdout}\n{started.stderr}"
        )
    try:
        yield local_cluster(local_status())
    finally:
        if os.environ.get("SCHEDULER_KEEP_CLUSTER") != "1":
            subprocess.run([*CLUSTER_COMMAND, "stop"], capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="session")
def cassandra(cluster: Cluster) -> Iterator[CassandraConnection]:
    with connect(cluster.cassandra) as connection:
        yield connection


def unique_name(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:16]}"


def answers(connection: CassandraConnection) -> bool:
    """Whether the connection reaches Cassandra again (after a server restart the driver
    reconnects on its own schedule, with backoff)."""
    try:
        connection.session.execute("SELECT release_version FROM system.local")
    except DRIVER_ERRORS:
        return False
    return True


@pytest.fixture
def keyspace(cluster: Cluster, cassandra: CassandraConnection) -> Iterator[CassandraSettings]:
    """A fresh keyspace with the schema applied; dropped after the test."""
    settings = CassandraSettings(
        hosts=cluster.cassandra.hosts, port=cluster.cassandra.port, keyspace=unique_name("t")
    )
    schema.apply(cassandra, settings)
    yield settings
    cassandra.session.execute(f"DROP KEYSPACE IF EXISTS {settings.keyspace}")


@pytest.fixture
def kafka_admin(cluster: Cluster) -> AdminClient:
    return AdminClient(client_config(cluster.kafka))


@pytest.fixture
def kafka_topic(kafka_admin: AdminClient) -> Iterator[str]:
    """A fresh topic of 3 partitions; deleted after the test."""
    name = unique_name("test")
    kafka_admin.create_topics([NewTopic(name, num_partitions=3, replication_factor=1)])[name].result(timeout=30)
    yield name
    kafka_admin.delete_topics([name])[name].result(timeout=30)


@pytest.fixture
def zk_root(cluster: Cluster) -> Iterator[KazooClient]:
    """A client at the ZooKeeper root, for making and removing chroots."""
    with zookeeper_session(cluster.zookeeper.hosts, cluster.zookeeper.tls) as client:
        yield client


@pytest.fixture
def zk_chroot(cluster: Cluster, zk_root: KazooClient) -> Iterator[str]:
    """`host:port/tests/<unique>`: a connection string whose root is this test's own."""
    path = f"/tests/{unique_name('t')}"
    zk_root.ensure_path(path)
    yield f"{cluster.zookeeper.hosts}{path}"
    zk_root.delete(path, recursive=True)
