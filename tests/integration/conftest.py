"""The `deployment` fixture: a whole distributed backend of the test's own; and
`workers`, a fleet of `scheduler worker` processes on it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from kazoo.client import KazooClient

from scheduler.adapters.cassandra.store import CassandraTaskStore
from scheduler.adapters.kafka.handoff import KafkaHandoffLog
from scheduler.adapters.kafka.topics import delete_topics, ensure_topics
from scheduler.handoff import LogHandoff
from scheduler.producer import Client
from scheduler.settings import CassandraSettings, KafkaSettings
from tests.cluster import Cluster, unique_name
from tests.dispatchers import LEASE_TIMEOUT_S, Deployment, Fleet, ReadyTopics
from tests.workers import Workers


@pytest.fixture
def deployment(cluster: Cluster, keyspace: CassandraSettings, zk_root: KazooClient, tmp_path: Path) -> Iterator[Deployment]:
    kafka = KafkaSettings(bootstrap=cluster.kafka.bootstrap, topic_prefix=unique_name("t"))
    ensure_topics(kafka, shard_count=keyspace.shard_count, ready_partitions=4)
    root = f"/tests/{unique_name('d')}"
    env = {
        "SCHEDULER_BACKEND": "cassandra",
        "SCHEDULER_CASSANDRA_HOSTS": ",".join(keyspace.hosts),
        "SCHEDULER_CASSANDRA_PORT": str(keyspace.port),
        "SCHEDULER_KEYSPACE": keyspace.keyspace,
        "SCHEDULER_KAFKA_BOOTSTRAP": kafka.bootstrap,
        "SCHEDULER_TOPIC_PREFIX": kafka.topic_prefix,
        "SCHEDULER_ZOOKEEPER_HOSTS": cluster.zookeeper.hosts,
        "SCHEDULER_ZOOKEEPER_ROOT": root,
        "SCHEDULER_LEASE_TIMEOUT_S": str(LEASE_TIMEOUT_S),
    }
    store = CassandraTaskStore.open(keyspace)
    handoff_log = KafkaHandoffLog(kafka, store.shard_count)
    client = Client(store, tenant="college", handoff=LogHandoff(handoff_log, store.shard_count))
    ready = ReadyTopics(kafka)
    fleet = Fleet(env, tmp_path)
    try:
        yield Deployment(keyspace, kafka, store, client, ready, fleet)
    finally:
        fleet.stop_all()
        ready.close()
        handoff_log.close()
        store.close()
        delete_topics(kafka)
        if zk_root.exists(root):
            zk_root.delete(root, recursive=True)


@pytest.fixture
def workers(deployment: Deployment, tmp_path: Path) -> Iterator[Workers]:
    fleet = Workers(deployment.fleet.env, tmp_path, tmp_path / "sink.db")
    try:
        yield fleet
    finally:
        fleet.stop_all()
