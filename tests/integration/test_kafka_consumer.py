"""The Kafka consumer beyond the shared contract (`tests/contract/test_consumer.py`): an
unreachable broker, and a member that stops polling."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from scheduler.adapters.kafka.consumer import KafkaConsumer, KafkaTopicScanner
from scheduler.errors import ConfigError, QueueUnavailable
from scheduler.settings import KafkaSettings
from tests.cluster import Cluster, unique_name
from tests.contract.test_consumer import KafkaBackend, offsets, split, until, values

UNREACHABLE = KafkaSettings(bootstrap="127.0.0.1:1", connect_timeout_s=1.0)
"""Port 1 on loopback: nothing listens, every connection is refused at once."""

SESSION_S = 6.0
"""The broker's smallest session timeout (`group.min.session.timeout.ms`, 6 s by default)."""


@pytest.fixture
def backend(cluster: Cluster) -> Iterator[KafkaBackend]:
    made = KafkaBackend(cluster.kafka.bootstrap)
    try:
        yield made
    finally:
        made.close()


def test_an_unreachable_broker_is_named_at_once() -> None:
    started = time.monotonic()
    with pytest.raises(QueueUnavailable, match="127.0.0.1:1"):
        KafkaConsumer(UNREACHABLE, "g", ["t"], member="a")
    with pytest.raises(QueueUnavailable, match="127.0.0.1:1"):
        KafkaTopicScanner(UNREACHABLE).scan("t")
    assert time.monotonic() - started < 10


def test_a_member_that_stops_polling_loses_its_partitions_after_the_session_timeout(backend: KafkaBackend) -> None:
    topic, group = backend.topic(2), unique_name("g")
    everything = {(topic, 0), (topic, 1)}
    for partition in range(2):
        backend.publish(topic, partition, values(f"p{partition}", 3))
    a = backend.member(group, [topic], session_timeout_s=SESSION_S)
    b = backend.member(group, [topic], session_timeout_s=SESSION_S)
    split(a, b, everything)
    (held_by_a,) = a.assignment()
    until(lambda: len(offsets(a.got, *held_by_a)) >= 3, a, what="a to read its partition")
    revoked_before = len(a.revoked)

    stopped = time.monotonic()  # a stops polling
    until(lambda: b.assignment() == everything, b, what="b to take a's partition", timeout_s=3 * SESSION_S)
    assert SESSION_S - 1 < time.monotonic() - stopped < 2 * SESSION_S
    before = len(b.got)
    until(lambda: len(offsets(b.got[before:], *held_by_a)) >= 3, b, what="b to read a's partition from the start")
    b.c.commit({held_by_a: 1})

    a.c.commit({held_by_a: 3})  # a has not polled since: it still believes it holds it; dropped
    assert backend.committed(group, *held_by_a[:1], [held_by_a[1]]) == {held_by_a[1]: 1}
    until(lambda: len(a.revoked) > revoked_before, a, what="a to hear it lost its partition", disjoint=False)
    assert a.revoked[revoked_before:] == [[held_by_a]]


def test_a_session_timeout_the_broker_refuses_is_a_config_error_not_an_idle_member(backend: KafkaBackend) -> None:
    topic = backend.topic(1)
    backend.publish(topic, 0, values("p", 1))
    consumer = KafkaConsumer(backend.settings, unique_name("g"), [topic], member="short",
                             session_timeout_s=SESSION_S / 2)
    try:
        deadline = time.monotonic() + 30
        with pytest.raises(ConfigError, match="group.min.session.timeout.ms"):
            while time.monotonic() < deadline:
                consumer.poll(10, 0.5)
    finally:
        consumer.close()
