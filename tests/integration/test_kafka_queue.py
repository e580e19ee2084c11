"""The Kafka queue adapter on the real broker, beyond the shared contract
(`tests/contract/test_queue.py`): creating topics, the errors it raises, and how fast
the publisher goes."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pytest
from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType  # type: ignore[attr-defined]

from scheduler.adapters.kafka.handoff import KafkaHandoffLog, KafkaHandoffReader
from scheduler.adapters.kafka.publisher import KafkaPublisher
from scheduler.adapters.kafka.topics import delete_topics, ensure_topics
from scheduler.errors import ConfigError, QueueError, QueueUnavailable
from scheduler.settings import DEAD_LETTER_RETENTION_MS, QUEUE_RETENTION_MS, READY_TOPICS, KafkaSettings
from tests.cluster import Cluster, unique_name

UNREACHABLE = KafkaSettings(bootstrap="127.0.0.1:1", connect_timeout_s=1.0)
"""Port 1 on loopback: nothing listens, every connection is refused at once."""


@pytest.fixture
def settings(cluster: Cluster) -> Iterator[KafkaSettings]:
    """A topic prefix of this test's own; its topics and group are deleted afterwards."""
    made = KafkaSettings(bootstrap=cluster.kafka.bootstrap, topic_prefix=unique_name("t"))
    yield made
    delete_topics(made)


def partition_counts(admin: AdminClient, settings: KafkaSettings) -> dict[str, int]:
    topics = admin.list_topics(timeout=10).topics
    return {name: len(topic.partitions) for name, topic in topics.items() if name.startswith(settings.topic_prefix)}


def test_ensure_topics_creates_every_topic_once(settings: KafkaSettings, kafka_admin: AdminClient) -> None:
    ensure_topics(settings, shard_count=6, ready_partitions=2)
    ensure_topics(settings, shard_count=6, ready_partitions=2)
    expected = {settings.ready_topic(name): 2 for name in READY_TOPICS}
    expected |= {settings.dead_letter_topic: 2, settings.handoff_topic: 6}
    assert partition_counts(kafka_admin, settings) == expected
    KafkaPublisher(settings).check()
    KafkaHandoffLog(settings, 6).check()
    # Each is made with a stated retention, dead letters kept longest.
    described = kafka_admin.describe_configs([ConfigResource(ResourceType.TOPIC, name) for name in expected])
    retention = {resource.name: int(future.result(timeout=10)["retention.ms"].value)
                 for resource, future in described.items()}
    assert retention == {name: DEAD_LETTER_RETENTION_MS if name == settings.dead_letter_topic else QUEUE_RETENTION_MS
                         for name in expected}


def test_ensure_topics_refuses_a_handoff_topic_made_for_another_shard_count(settings: KafkaSettings) -> None:
    ensure_topics(settings, shard_count=4)
    with pytest.raises(ConfigError, match=r"has 4 partitions but the scheduler runs 8 shards"):
        ensure_topics(settings, shard_count=8)
    with pytest.raises(QueueError, match="not one per shard"):
        KafkaHandoffLog(settings, 8).check()


def test_an_unreachable_broker_is_named() -> None:
    started = time.monotonic()
    with pytest.raises(QueueUnavailable, match="127.0.0.1:1"):
        KafkaPublisher(UNREACHABLE).check()
    with pytest.raises(QueueUnavailable, match="127.0.0.1:1"):
        ensure_topics(UNREACHABLE, shard_count=4)
    assert time.monotonic() - started < 10


def test_check_tells_to_create_the_topics_first(settings: KafkaSettings) -> None:
    with pytest.raises(QueueError, match="ensure_topics") as raised:
        KafkaPublisher(settings).check()
    assert not isinstance(raised.value, QueueUnavailable)


def test_flush_raises_for_messages_to_a_topic_that_does_not_exist(settings: KafkaSettings) -> None:
    # The producer would wait 30 s for a new topic to show up in the metadata first.
    publisher = KafkaPublisher(settings, config={"topic.metadata.propagation.max.ms": 500})
    try:
        publisher.publish(settings.ready_topic("high"), [b"one", b"two"])
        with pytest.raises(QueueError, match=rf"2 messages .* not stored: 2 to {settings.ready_topic('high')}"):
            publisher.flush(20)
        publisher.flush(5)  # failures are reported once, by the flush that follows them
    finally:
        publisher.close()


def test_flush_raises_when_the_broker_does_not_answer() -> None:
    publisher = KafkaPublisher(UNREACHABLE)
    try:
        publisher.publish(UNREACHABLE.ready_topic("high"), [b"one"])
        # The count is librdkafka's queue: the message, and at times requests of its own
        # (the producer id's) beside it, so not always 1.
        with pytest.raises(QueueError, match=r"\d+ messages are still unacknowledged after 0.5 s .*127.0.0.1:1"):
            publisher.flush(0.5)
    finally:
        publisher.close()


def test_handoff_append_to_a_missing_topic_fails(settings: KafkaSettings) -> None:
    log = KafkaHandoffLog(settings, 4, timeout_s=3)
    try:
        with pytest.raises(QueueError, match="hand-off records"):
            log.append([(0, [b"x"])])
        with pytest.raises(ValueError, match="outside 0..3"):
            log.append([(4, [b"x"])])
    finally:
        log.close()


def test_check_of_the_handoff_sides_tells_to_create_the_topics_first(settings: KafkaSettings) -> None:
    # A reader assigned a shard of a missing topic would only ever return nothing.
    reader = KafkaHandoffReader(settings, member="a")
    log = KafkaHandoffLog(settings, 4)
    try:
        for side in (reader, log):
            with pytest.raises(QueueError, match=f"no topic {settings.handoff_topic}.*ensure_topics"):
                side.check()
    finally:
        reader.close()
        log.close()
    with pytest.raises(QueueUnavailable, match="127.0.0.1:1"):
        KafkaHandoffReader(UNREACHABLE, member="a").check()


def test_publish_rate(settings: KafkaSettings, capsys: pytest.CaptureFixture[str]) -> None:
    ensure_topics(settings, shard_count=4)
    count, batch = 50_000, 500
    # About a task message's size and mix: an id and payload that do not compress, text that does.
    values = [os.urandom(40) + b"|tenant-college-0017|send-reminder|" + os.urandom(60) + bytes(64)
              for _ in range(batch)]
    topic = settings.ready_topic("normal")
    publisher = KafkaPublisher(settings)
    try:
        publisher.check()
        started = time.perf_counter()
        cpu_started = time.thread_time()
        for _ in range(count // batch):
            publisher.publish(topic, values)
        published, cpu = time.perf_counter() - started, time.thread_time() - cpu_started
        publisher.flush(30)
        flushed = time.perf_counter() - started
    finally:
        publisher.close()
    with capsys.disabled():
        print(
            f"\npublished {count} messages of {len(values[0])} B: {count / flushed:,.0f} msg/s to the end of flush; "
            f"publish {published / count * 1e6:.2f} µs/msg wall, {cpu / count * 1e6:.2f} µs/msg CPU of the "
            f"calling thread; flush waited {(flushed - published) * 1000:.0f} ms"
        )
