"""`scheduler.connect` on the real Cassandra and Kafka, in a keyspace and topics of the
test's own: the cluster comes from the `SCHEDULER_*` variables, tasks due soon go to the
Kafka hand-off topic, and an unreachable Kafka or a keyspace without the schema fails
`connect` itself with the Cassandra session closed again."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import scheduler
from scheduler.adapters.cassandra.store import CassandraTaskStore
from scheduler.adapters.kafka.consumer import KafkaTopicScanner
from scheduler.adapters.kafka.topics import delete_topics, ensure_topics
from scheduler.errors import QueueUnavailable, StoreError
from scheduler.handoff import HandedTask, decode
from scheduler.settings import CassandraSettings, KafkaSettings
from tests.cluster import Cluster, unique_name

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
def kafka(cluster: Cluster, keyspace: CassandraSettings) -> Iterator[KafkaSettings]:
    """The scheduler's topics under a prefix of the test's own; deleted afterwards."""
    settings = KafkaSettings(bootstrap=cluster.kafka.bootstrap, topic_prefix=unique_name("t"))
    ensure_topics(settings, shard_count=keyspace.shard_count, ready_partitions=1)
    yield settings
    delete_topics(settings)


@pytest.fixture
def store_closes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The keyspace of every Cassandra store closed during the test."""
    closed: list[str] = []
    close: Callable[[Any], None] = CassandraTaskStore.close

    def recorded(self: CassandraTaskStore) -> None:
        closed.append(self.keyspace)
        close(self)

    monkeypatch.setattr(CassandraTaskStore, "close", recorded)
    return closed


def env_of(keyspace: CassandraSettings, kafka: KafkaSettings) -> dict[str, str]:
    return {"SCHEDULER_BACKEND": "cassandra", "SCHEDULER_CASSANDRA_HOSTS": ",".join(keyspace.hosts),
            "SCHEDULER_CASSANDRA_PORT": str(keyspace.port), "SCHEDULER_KEYSPACE": keyspace.keyspace,
            "SCHEDULER_KAFKA_BOOTSTRAP": kafka.bootstrap, "SCHEDULER_TOPIC_PREFIX": kafka.topic_prefix}


def test_connect_finds_the_cluster_in_the_variables_and_hands_tasks_due_soon_to_kafka(
    keyspace: CassandraSettings, kafka: KafkaSettings, store_closes: list[str],
) -> None:
    with scheduler.connect(tenant="college", env=env_of(keyspace, kafka)) as client:
        assert isinstance(client.store, CassandraTaskStore) and client.store.keyspace == keyspace.keyspace
        soon = client.submit("sms", {"to": "+91"}, delay=5)
        later = client.submit("sms", {"to": "+91"}, delay=3600)
        assert client.get(soon) is not None and client.get(later) is not None
    assert store_closes == [keyspace.keyspace]
    records = [decode(delivery.value) for delivery in KafkaTopicScanner(kafka).scan(kafka.handoff_topic)]
    assert [item.task.id for item in records if isinstance(item, HandedTask)] == [soon]


def test_an_unreachable_kafka_fails_connect_and_closes_the_store_again(
    keyspace: CassandraSettings, store_closes: list[str],
) -> None:
    nowhere = KafkaSettings(bootstrap="127.0.0.1:1", connect_timeout_s=2)
    with pytest.raises(QueueUnavailable, match="cannot reach Kafka at 127.0.0.1:1"):
        scheduler.connect(backend="cassandra", cassandra=keyspace, kafka=nowhere, env={})
    assert store_closes == [keyspace.keyspace]


def test_a_keyspace_without_the_schema_fails_connect(keyspace: CassandraSettings, kafka: KafkaSettings) -> None:
    env = {**env_of(keyspace, kafka), "SCHEDULER_KEYSPACE": unique_name("none")}
    with pytest.raises(StoreError, match="scheduler schema apply"):
        scheduler.connect(tenant="college", env=env)


def test_missing_topics_are_only_a_warning_and_tasks_due_later_go_in(
    keyspace: CassandraSettings, cluster: Cluster, caplog: pytest.LogCaptureFixture,
) -> None:
    unmade = KafkaSettings(bootstrap=cluster.kafka.bootstrap, topic_prefix=unique_name("t"))
    with caplog.at_level(logging.WARNING, logger="scheduler.backends"):
        with scheduler.connect(tenant="college", env=env_of(keyspace, unmade)) as client:
            task_id = client.submit("sms", delay=3600)
            assert client.get(task_id) is not None
    assert any(unmade.handoff_topic in record.getMessage() for record in caplog.records), caplog.text
