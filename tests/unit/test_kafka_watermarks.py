"""Asking a partition's watermarks: a broker that answers "no leader yet" is asked again
past the connect timeout (it is there, making or loading the partition), up to the
leader patience, which a scan of many partitions spends once; a refusal is reported as
one, and a broker that does not answer fails at once."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from scheduler.adapters.kafka import topics
from scheduler.errors import QueueAccessDenied, QueueUnavailable
from scheduler.settings import KafkaSettings

SETTINGS = KafkaSettings(bootstrap="127.0.0.1:9092", connect_timeout_s=0.3)


class ScriptedClient:
    """Answers `get_watermark_offsets` from a script: an error code to raise, or offsets."""

    def __init__(self, script: Iterator[int | tuple[int, int]]) -> None:
        self.script = script
        self.asks = 0
        self.metadata_asks = 0

    def get_watermark_offsets(self, _partition: Any, timeout: float) -> tuple[int, int]:
        self.asks += 1
        step = next(self.script)
        if isinstance(step, int):
            raise KafkaException(KafkaError(step, "scripted"))
        return step

    def list_topics(self, _topic: str, timeout: float) -> None:
        self.metadata_asks += 1


@pytest.fixture(autouse=True)
def quick(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(topics, "WATERMARK_RETRY_S", 0.05)
    monkeypatch.setattr(topics, "LEADER_PATIENCE_S", 1.0)


def no_leader_then(offsets: tuple[int, int], times: int) -> Iterator[int | tuple[int, int]]:
    for index in range(times):
        yield KafkaError.NOT_LEADER_FOR_PARTITION if index % 2 else KafkaError.LEADER_NOT_AVAILABLE
    yield offsets


def test_a_partition_without_a_leader_for_longer_than_the_connect_timeout_is_asked_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(topics, "LEADER_PATIENCE_S", 30.0)
    client = ScriptedClient(no_leader_then((3, 17), times=12))  # 12 x 0.05 s = 0.6 s > 0.3 s
    assert topics.watermark_offsets(client, SETTINGS, "t.handoff", 0) == (3, 17)
    assert client.asks == 13
    assert client.metadata_asks == 12  # the leaders asked afresh before each new ask


def test_a_partition_that_never_gets_a_leader_fails_after_the_patience_naming_it() -> None:
    client = ScriptedClient(iter(lambda: KafkaError.NOT_LEADER_FOR_PARTITION, None))
    started = time.monotonic()
    with pytest.raises(QueueUnavailable, match=r"partition 5 of t\.handoff .* still had no leader that serves it"):
        topics.watermark_offsets(client, SETTINGS, "t.handoff", 5)
    assert time.monotonic() - started >= 1.0 - 0.05  # the patience, not the 0.3 s connect timeout
    assert client.asks > 1


def test_a_new_leader_not_caught_up_yet_is_asked_again() -> None:
    client = ScriptedClient(iter([KafkaError.OFFSET_NOT_AVAILABLE, KafkaError.REPLICA_NOT_AVAILABLE, (0, 4)]))
    assert topics.watermark_offsets(client, SETTINGS, "t.handoff", 0) == (0, 4)


def test_a_leader_the_client_does_not_know_yet_is_asked_again() -> None:
    """librdkafka answers `_UNKNOWN_PARTITION` itself, at once, while its metadata shows
    the partition's leader as -1 (a broker that led it restarting)."""
    client = ScriptedClient(iter([KafkaError._UNKNOWN_PARTITION, KafkaError.UNKNOWN_TOPIC_OR_PART, (2, 9)]))
    assert topics.watermark_offsets(client, SETTINGS, "t.handoff", 3) == (2, 9)
    assert client.metadata_asks == 2


def test_a_scan_spends_one_leader_patience_on_all_its_partitions() -> None:
    client = ScriptedClient(iter(lambda: KafkaError.NOT_LEADER_FOR_PARTITION, None))
    spent = time.monotonic() - 0.01  # as if the scan's earlier partitions had used it up
    with pytest.raises(QueueUnavailable, match="still had no leader"):
        topics.watermark_offsets(client, SETTINGS, "t.handoff", 7, leader_deadline=spent)
    assert client.asks == 1


def test_a_refusal_is_reported_as_one_and_not_asked_again() -> None:
    client = ScriptedClient(iter([KafkaError.TOPIC_AUTHORIZATION_FAILED, (0, 1)]))
    with pytest.raises(QueueAccessDenied, match="refused"):
        topics.watermark_offsets(client, SETTINGS, "t.handoff", 0)
    assert client.asks == 1


def test_no_answer_is_an_unreachable_broker_at_once() -> None:
    client = ScriptedClient(iter([KafkaError._TIMED_OUT, (0, 1)]))
    with pytest.raises(QueueUnavailable, match="cannot reach Kafka at 127.0.0.1:9092"):
        topics.watermark_offsets(client, SETTINGS, "t.handoff", 0)
    assert client.asks == 1
