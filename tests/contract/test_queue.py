"""The queue contract (`Publisher`, `HandoffLog`, `HandoffReader` in `scheduler.ports`),
run once per adapter: the embedded SQLite queue and Kafka on the real server (topics of
their own, deleted afterwards)."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, TypeVar

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from scheduler.adapters.embedded.queue import SqliteQueue
from scheduler.adapters.kafka.security import client_config
from scheduler.adapters.kafka.topics import watermark_offsets
from scheduler.ports import HandoffLog, HandoffReader, HandoffRecord, Publisher
from scheduler.settings import KafkaSettings
from tests.cluster import unique_name

SHARDS = 4
DEADLINE_S = 20.0


class Closable(Protocol):
    def close(self) -> None: ...


C = TypeVar("C", bound=Closable)


@dataclass
class Backend:
    """One adapter's ways to make each side of the queue, and to read a topic back whole."""

    names: KafkaSettings
    """Topic naming; for SQLite only the names are used."""
    make_publisher: Callable[[], Publisher]
    make_log: Callable[[], HandoffLog]
    make_reader: Callable[[str], HandoffReader]
    read: Callable[[str], list[bytes]]
    opened: list[Closable] = field(default_factory=list)

    def publisher(self) -> Publisher:
        return self._keep(self.make_publisher())

    def log(self) -> HandoffLog:
        return self._keep(self.make_log())

    def reader(self, member: str) -> HandoffReader:
        return self._keep(self.make_reader(member))

    def _keep(self, part: C) -> C:
        self.opened.append(part)
        return part

    def close(self) -> None:
        for part in reversed(self.opened):
            part.close()


def sqlite_backend(path: Path) -> Backend:
    names = KafkaSettings()
    queue = SqliteQueue(path, handoff_topic=names.handoff_topic)

    def reader(_member: str) -> HandoffReader:
        # Each reader opens the file anew, as another dispatcher process would.
        other = SqliteQueue(path, handoff_topic=names.handoff_topic)
        made.opened.append(other)
        return other.handoff_reader()

    made = Backend(names, queue.publisher, lambda: queue.handoff_log(SHARDS), reader, queue.read)
    made.opened.append(queue)
    return made


def kafka_backend(bootstrap: str) -> Backend:
    from scheduler.adapters.kafka.handoff import KafkaHandoffLog, KafkaHandoffReader
    from scheduler.adapters.kafka.publisher import KafkaPublisher

    settings = KafkaSettings(bootstrap=bootstrap, topic_prefix=unique_name("t"))
    return Backend(
        settings,
        lambda: KafkaPublisher(settings),
        lambda: KafkaHandoffLog(settings, SHARDS),
        lambda member: KafkaHandoffReader(settings, member=member),
        lambda topic: read_kafka_topic(settings, topic),
    )


def read_kafka_topic(settings: KafkaSettings, topic: str) -> list[bytes]:
    """Every value in `topic`, partition by partition, read by a plain consumer up to the
    end each partition had when this started."""
    consumer = Consumer({**client_config(settings), "group.id": unique_name("read"),
                         "enable.auto.commit": False})
    try:
        partitions = sorted(consumer.list_topics(topic, timeout=10).topics[topic].partitions)
        ends = {p: watermark_offsets(consumer, settings, topic, p)[1] for p in partitions}
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions if ends[p] > 0])
        values: dict[int, list[bytes]] = defaultdict(list)
        next_offset = dict.fromkeys(partitions, 0)
        deadline = time.monotonic() + DEADLINE_S
        while any(next_offset[p] < ends[p] for p in partitions):
            assert time.monotonic() < deadline, f"timed out reading {topic}"
            for message in consumer.consume(1000, 0.1):
                assert message.error() is None, message.error()
                partition, offset, value = message.partition(), message.offset(), message.value()
                assert partition is not None and offset is not None and value is not None
                values[partition].append(value)
                next_offset[partition] = offset + 1
        return [value for p in partitions for value in values[p]]
    finally:
        consumer.close()


@pytest.fixture(params=["sqlite", pytest.param("kafka", marks=pytest.mark.integration)])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    if request.param == "sqlite":
        made = sqlite_backend(tmp_path / "queue.db")
        try:
            yield made
        finally:
            made.close()
        return
    from scheduler.adapters.kafka.topics import delete_topics, ensure_topics

    made = kafka_backend(request.getfixturevalue("cluster").kafka.bootstrap)
    ensure_topics(made.names, shard_count=SHARDS, ready_partitions=3)
    try:
        yield made
    finally:
        made.close()
        delete_topics(made.names)


def poll_until(reader: HandoffReader, count: int, *, max_records: int = 100) -> list[HandoffRecord]:
    """Poll until `count` records came, failing after `DEADLINE_S`; never more than asked."""
    records: list[HandoffRecord] = []
    deadline = time.monotonic() + DEADLINE_S
    while len(records) < count:
        assert time.monotonic() < deadline, f"got {len(records)} of {count} records: {records}"
        got = reader.poll(max_records, 0.2)
        assert len(got) <= max_records
        records += got
    assert len(records) == count, records
    return records


def by_shard(records: list[HandoffRecord]) -> dict[int, list[bytes]]:
    shards: dict[int, list[bytes]] = defaultdict(list)
    for record in records:
        shards[record.shard].append(record.value)
    return dict(shards)


def values(label: str, count: int) -> list[bytes]:
    return [f"{label}-{n}".encode() for n in range(count)]


# Publisher


def test_published_values_are_all_readable_after_flush(backend: Backend) -> None:
    publisher = backend.publisher()
    high, normal = backend.names.ready_topic("high"), backend.names.ready_topic("normal")
    sent_normal = values("normal", 300)
    publisher.publish(high, values("high", 50))
    for start in range(0, 300, 100):
        publisher.publish(normal, sent_normal[start:start + 100])
    publisher.flush(DEADLINE_S)
    assert sorted(backend.read(high)) == sorted(values("high", 50))
    assert sorted(backend.read(normal)) == sorted(sent_normal)
    assert backend.read(backend.names.ready_topic("low")) == []


def test_flush_with_nothing_published_returns(backend: Backend) -> None:
    publisher = backend.publisher()
    publisher.flush(DEADLINE_S)
    publisher.publish(backend.names.ready_topic("low"), [b"one"])
    publisher.flush(DEADLINE_S)
    publisher.flush(DEADLINE_S)
    assert backend.read(backend.names.ready_topic("low")) == [b"one"]


# Hand-off log


def test_handoff_records_come_back_in_order_within_each_shard(backend: Backend) -> None:
    log, reader = backend.log(), backend.reader("a")
    reader.assign(1)
    reader.assign(2)
    log.append([(1, values("a", 5)), (2, values("b", 3))])
    log.append([(1, values("c", 4))])
    records = poll_until(reader, 12)
    assert by_shard(records) == {1: values("a", 5) + values("c", 4), 2: values("b", 3)}
    for shard in (1, 2):
        offsets = [record.offset for record in records if record.shard == shard]
        assert offsets == sorted(offsets) and len(set(offsets)) == len(offsets)
    assert reader.poll(10, 0.3) == []


def test_poll_returns_at_most_max_records(backend: Backend) -> None:
    log, reader = backend.log(), backend.reader("a")
    log.append([(0, values("x", 10))])
    reader.assign(0)
    records = poll_until(reader, 10, max_records=3)
    assert [record.value for record in records] == values("x", 10)


def test_an_empty_poll_returns_nothing_after_the_timeout(backend: Backend) -> None:
    reader = backend.reader("a")
    reader.assign(3)
    started = time.monotonic()
    assert reader.poll(10, 0.3) == []
    assert 0.25 <= time.monotonic() - started < 5


def test_a_new_reader_resumes_at_the_committed_position(backend: Backend) -> None:
    log = backend.log()
    log.append([(0, values("x", 10))])
    first = backend.reader("a")
    first.assign(0)
    records = poll_until(first, 10)
    first.commit({0: records[6].offset})  # 0..5 handled; 6..9 read but not yet safe
    first.unassign(0)
    first.close()

    second = backend.reader("b")
    second.assign(0)
    again = poll_until(second, 4)
    assert again == records[6:]
    assert second.poll(10, 0.3) == []


def test_without_a_commit_the_next_owner_reads_from_the_start(backend: Backend) -> None:
    log = backend.log()
    log.append([(2, values("x", 3))])
    first = backend.reader("a")
    first.assign(2)
    records = poll_until(first, 3)
    first.close()
    second = backend.reader("b")
    second.assign(2)
    assert poll_until(second, 3) == records


def test_reassigning_a_shard_resumes_at_its_committed_position(backend: Backend) -> None:
    log, reader = backend.log(), backend.reader("a")
    log.append([(1, values("x", 5))])
    reader.assign(1)
    records = poll_until(reader, 5)
    reader.commit({1: records[2].offset})
    reader.unassign(1)
    reader.assign(1)
    assert poll_until(reader, 3) == records[2:]


def test_readers_commit_their_own_shards_without_interfering(backend: Backend) -> None:
    log = backend.log()
    log.append([(0, values("zero", 5)), (1, values("one", 5))])
    a, b = backend.reader("a"), backend.reader("b")
    a.assign(0)
    b.assign(1)
    read_a, read_b = poll_until(a, 5), poll_until(b, 5)
    assert {record.shard for record in read_a} == {0} and {record.shard for record in read_b} == {1}
    a.commit({0: read_a[-1].offset + 1})
    b.commit({1: read_b[2].offset})
    a.close()
    b.close()

    log.append([(0, [b"zero-new"]), (1, [b"one-new"])])
    c = backend.reader("c")
    c.assign(0)
    c.assign(1)
    assert by_shard(poll_until(c, 5)) == {0: [b"zero-new"], 1: [b"one-2", b"one-3", b"one-4", b"one-new"]}


def test_records_of_unassigned_shards_are_not_returned(backend: Backend) -> None:
    log, reader = backend.log(), backend.reader("a")
    reader.assign(0)
    reader.assign(1)
    reader.assign(2)
    reader.unassign(1)
    log.append([(0, [b"zero"]), (1, [b"one"]), (2, [b"two"]), (3, [b"three"])])
    assert by_shard(poll_until(reader, 2)) == {0: [b"zero"], 2: [b"two"]}
    assert reader.poll(10, 0.3) == []

    reader.unassign(2)
    log.append([(0, [b"zero-2"]), (2, [b"two-2"])])
    assert by_shard(poll_until(reader, 1)) == {0: [b"zero-2"]}
    assert reader.poll(10, 0.3) == []
