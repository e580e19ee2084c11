"""The consumer contract (`Consumer` and `TopicScanner` in `scheduler.ports`), run once per
adapter: the embedded SQLite queue (each member with a `SqliteQueue` of its own on one
file, as separate processes would have) and Kafka on the real server (topics and groups
of the test's own, deleted afterwards). Kafka-only cases are in
`tests/integration/test_kafka_consumer.py`; the embedded-only case of a member that
expires is at the end of this file.

Every test waits on conditions with deadlines. The few fixed waits (`QUIET_S`) check
that something does *not* arrive: a paused topic, a redelivery that must not happen."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer as ClientConsumer
from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka import TopicPartition as KafkaPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from scheduler.adapters.embedded.queue import SqliteQueue
from scheduler.adapters.kafka.consumer import KafkaConsumer, KafkaTopicScanner
from scheduler.adapters.kafka.security import client_config
from scheduler.ports import Consumer, Delivery, TopicPartition, TopicScanner
from scheduler.settings import KafkaSettings
from tests.cluster import unique_name

DEADLINE_S = 30.0
QUIET_S = 0.5
"""How long a test polls to see that nothing more comes."""
SESSION_S = 6.0
"""Kafka's smallest (`group.min.session.timeout.ms`): heartbeats every 0.6 s make rebalances quick."""


@dataclass
class Member:
    """A consumer, everything it delivered, and every `on_revoked` call it made."""

    consumer: Consumer | None = None
    got: list[Delivery] = field(default_factory=list)
    revoked: list[list[TopicPartition]] = field(default_factory=list)
    on_revoked: Callable[[list[TopicPartition]], None] | None = None
    """Called after the revocation is recorded (e.g. to commit)."""

    @property
    def c(self) -> Consumer:
        assert self.consumer is not None
        return self.consumer

    def record_revoked(self, partitions: list[TopicPartition]) -> None:
        self.revoked.append(partitions)
        if self.on_revoked is not None:
            self.on_revoked(partitions)

    def poll(self, timeout_s: float = 0.05, max_records: int = 100) -> list[Delivery]:
        got = self.c.poll(max_records, timeout_s)
        assert len(got) <= max_records
        self.got += got
        return got

    def assignment(self) -> set[TopicPartition]:
        return self.c.assignment()

    def all_revoked(self) -> set[TopicPartition]:
        return {tp for call in self.revoked for tp in call}


def until(condition: Callable[[], bool], *members: Member, what: str, timeout_s: float = DEADLINE_S,
          disjoint: bool = True) -> None:
    """Poll `members` in turn until `condition` holds; with `disjoint`, check after every
    poll that no partition is held by two of them."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        for member in members:
            member.poll()
            if disjoint:
                held = [member.assignment() for member in members]
                assert sum(map(len, held)) == len(set().union(*held)), f"a partition held twice: {held}"


def quiet(*members: Member) -> None:
    """Poll `members` for `QUIET_S`, collecting whatever comes."""
    end = time.monotonic() + QUIET_S
    while time.monotonic() < end:
        for member in members:
            member.poll()


def split(a: Member, b: Member, partitions: set[TopicPartition]) -> None:
    """Poll both until each holds some of `partitions` and together all."""
    until(lambda: bool(a.assignment()) and bool(b.assignment()) and a.assignment() | b.assignment() == partitions,
          a, b, what=f"two members to split {sorted(partitions)}")


def values(label: str, count: int) -> list[bytes]:
    return [f"{label}-{n}".encode() for n in range(count)]


def offsets(deliveries: Sequence[Delivery], topic: str, partition: int) -> list[int]:
    return [d.offset for d in deliveries if (d.topic, d.partition) == (topic, partition)]


def by_partition(deliveries: Sequence[Delivery]) -> dict[TopicPartition, list[bytes]]:
    found: dict[TopicPartition, list[bytes]] = defaultdict(list)
    for delivery in deliveries:
        found[(delivery.topic, delivery.partition)].append(delivery.value)
    return dict(found)


class Backend:
    """One adapter: topics, publishing to a given partition, members and scanners."""

    def __init__(self) -> None:
        self.opened: list[Consumer] = []

    def topic(self, partitions: int) -> str:
        raise NotImplementedError

    def publish(self, topic: str, partition: int, values: Sequence[bytes]) -> None:
        raise NotImplementedError

    def make_consumer(self, group: str, topics: Sequence[str], member: str,
                      on_revoked: Callable[[list[TopicPartition]], None], session_timeout_s: float) -> Consumer:
        raise NotImplementedError

    def scanner(self) -> TopicScanner:
        raise NotImplementedError

    def member(self, group: str, topics: Sequence[str], *, name: str | None = None,
               session_timeout_s: float = SESSION_S) -> Member:
        made = Member()
        made.consumer = self.make_consumer(group, topics, name or unique_name("m"), made.record_revoked,
                                           session_timeout_s)
        self.opened.append(made.consumer)
        return made

    def close(self) -> None:
        for consumer in reversed(self.opened):
            consumer.close()


class SqliteBackend(Backend):
    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path
        self.queue = SqliteQueue(path)
        self.queues = [self.queue]

    def topic(self, partitions: int) -> str:
        return unique_name("topic")

    def publish(self, topic: str, partition: int, values: Sequence[bytes]) -> None:
        self.queue.write([(topic, partition, values)])

    def make_consumer(self, group: str, topics: Sequence[str], member: str,
                      on_revoked: Callable[[list[TopicPartition]], None], session_timeout_s: float) -> Consumer:
        queue = SqliteQueue(self.path)  # a process of its own
        self.queues.append(queue)
        return queue.consumer(group, topics, member=member, on_revoked=on_revoked,
                              session_timeout_s=session_timeout_s)

    def scanner(self) -> TopicScanner:
        return self.queue.scanner()

    def close(self) -> None:
        super().close()
        for queue in self.queues:
            queue.close()


def report(reports: list[KafkaError | None], error: KafkaError | None, _message: object) -> None:
    reports.append(error)


class KafkaBackend(Backend):
    def __init__(self, bootstrap: str) -> None:
        super().__init__()
        self.settings = KafkaSettings(bootstrap=bootstrap, topic_prefix=unique_name("t"))
        self.admin = AdminClient(client_config(self.settings))
        # Idempotent, as the scheduler's producers are: a send retried (a partition of a
        # topic just made, not led yet) keeps its place instead of landing after the next.
        self.producer = Producer({**client_config(self.settings), "linger.ms": 0, "enable.idempotence": True})
        self.topics: list[str] = []
        self.groups: set[str] = set()

    def topic(self, partitions: int) -> str:
        name = f"{self.settings.topic_prefix}.{len(self.topics)}"
        self.admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)])[name].result(
            timeout=DEADLINE_S)
        self.topics.append(name)
        deadline = time.monotonic() + DEADLINE_S
        while len(self.admin.list_topics(name, timeout=10).topics[name].partitions) != partitions:
            assert time.monotonic() < deadline, f"topic {name} never showed in the metadata"
            time.sleep(0.05)
        return name

    def publish(self, topic: str, partition: int, values: Sequence[bytes]) -> None:
        """Each value stored before the next is sent, its delivery report checked: a send
        the broker failed (a flush only says that every report came, not that it was a
        success) is sent again, so what the consumer must read is really there, in order."""
        for value in values:
            deadline = time.monotonic() + DEADLINE_S
            while True:
                reports: list[KafkaError | None] = []
                self.producer.produce(topic, value, partition=partition, on_delivery=partial(report, reports))
                assert self.producer.flush(DEADLINE_S) == 0 and len(reports) == 1
                if reports[0] is None:
                    break
                assert time.monotonic() < deadline, f"{value!r} was never stored in {topic}[{partition}]: {reports[0]}"

    def make_consumer(self, group: str, topics: Sequence[str], member: str,
                      on_revoked: Callable[[list[TopicPartition]], None], session_timeout_s: float) -> Consumer:
        self.groups.add(group)
        return KafkaConsumer(self.settings, group, topics, member=member, on_revoked=on_revoked,
                             session_timeout_s=session_timeout_s)

    def scanner(self) -> TopicScanner:
        return KafkaTopicScanner(self.settings)

    def committed(self, group: str, topic: str, partitions: Sequence[int]) -> dict[int, int | None]:
        """The group's committed positions, asked without joining it."""
        reader = ClientConsumer({**client_config(self.settings), "group.id": group})
        try:
            found = reader.committed([KafkaPartition(topic, p) for p in partitions], timeout=10)
        finally:
            reader.close()
        return {tp.partition: tp.offset if tp.offset >= 0 else None for tp in found}

    def close(self) -> None:
        super().close()
        self.producer.flush(5)
        futures: dict[str, Any] = {}
        if self.topics:
            futures |= self.admin.delete_topics(self.topics, operation_timeout=10)
        if self.groups:
            futures |= self.admin.delete_consumer_groups(list(self.groups), request_timeout=10)
        for future in futures.values():
            try:
                future.result(timeout=20)
            except KafkaException:
                pass  # a group that never committed does not exist


@pytest.fixture(params=["sqlite", pytest.param("kafka", marks=pytest.mark.integration)])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    made: Backend
    if request.param == "sqlite":
        made = SqliteBackend(tmp_path / "queue.db")
    else:
        made = KafkaBackend(request.getfixturevalue("cluster").kafka.bootstrap)
    try:
        yield made
    finally:
        made.close()


def test_one_member_reads_every_partition_once_in_offset_order(backend: Backend) -> None:
    topic = backend.topic(3)
    for partition in range(3):
        backend.publish(topic, partition, values(f"p{partition}", 20))
    member = backend.member(unique_name("g"), [topic])
    deadline = time.monotonic() + DEADLINE_S
    while len(member.got) < 60:
        assert time.monotonic() < deadline, f"got {len(member.got)} of 60"
        member.poll(max_records=7)
    quiet(member)
    assert member.assignment() == {(topic, p) for p in range(3)}
    assert by_partition(member.got) == {(topic, p): values(f"p{p}", 20) for p in range(3)}
    for partition in range(3):
        assert offsets(member.got, topic, partition) == list(range(20))
    assert all(d.topic == topic and abs(d.timestamp_ms - time.time() * 1000) < 60_000 for d in member.got)


def test_lag_is_what_the_member_has_not_received_yet_of_each_partition_it_holds(backend: Backend) -> None:
    topic = backend.topic(2)
    backend.publish(topic, 0, values("p0", 30))
    backend.publish(topic, 1, values("p1", 5))
    member = backend.member(unique_name("g"), [topic])
    until(lambda: len(member.got) >= 10, member, what="a first batch")
    member.c.pause([topic])  # nothing more is received: the lag must settle on what is left
    quiet(member)

    def settled() -> bool:
        lag = member.c.lag()
        received = by_partition(member.got)
        return all(lag.get((topic, p)) == total - len(received.get((topic, p), []))
                   for p, total in ((0, 30), (1, 5)))

    until(settled, member, what=f"the lag of what was not received ({member.c.lag()})")
    member.c.resume([topic])
    until(lambda: len(member.got) >= 35, member, what="everything")
    until(lambda: member.c.lag() == {(topic, 0): 0, (topic, 1): 0}, member, what="no lag left")


def test_a_new_member_starts_after_the_committed_positions(backend: Backend) -> None:
    topic, group = backend.topic(3), unique_name("g")
    for partition in range(3):
        backend.publish(topic, partition, values(f"p{partition}", 10))
    first = backend.member(group, [topic])
    until(lambda: len(first.got) >= 30, first, what="all 30 messages")
    first.c.commit({(topic, 0): 10, (topic, 1): 4})  # partition 2: read, never committed
    first.c.close()

    second = backend.member(group, [topic])
    until(lambda: len(second.got) >= 16, second, what="the 16 uncommitted messages")
    quiet(second)
    assert by_partition(second.got) == {(topic, 1): values("p1", 10)[4:], (topic, 2): values("p2", 10)}
    assert offsets(second.got, topic, 1) == list(range(4, 10))


def test_two_members_split_the_partitions_and_read_everything_once(backend: Backend) -> None:
    topic, group = backend.topic(4), unique_name("g")
    everything = {(topic, p) for p in range(4)}
    for partition in range(4):  # the embedded group only knows partitions with messages
        backend.publish(topic, partition, [b"first"])
    a, b = backend.member(group, [topic]), backend.member(group, [topic])
    split(a, b, everything)

    for partition in range(4):
        backend.publish(topic, partition, values(f"p{partition}", 10))
    until(lambda: sum(d.value != b"first" for d in a.got + b.got) >= 40, a, b, what="all 40 messages")
    quiet(a, b)
    # "first" may come twice: read by a before the split, then by b, since a committed
    # nothing. The messages published after the split come once, from their holder.
    new_a, new_b = ([d for d in member.got if d.value != b"first"] for member in (a, b))
    assert {(d.topic, d.partition) for d in new_a} <= a.assignment()
    assert {(d.topic, d.partition) for d in new_b} <= b.assignment()
    assert by_partition(new_a + new_b) == {(topic, p): values(f"p{p}", 10) for p in range(4)}
    assert {(d.partition, d.value) for d in a.got + b.got if d.value == b"first"} == {(p, b"first") for p in range(4)}


def test_the_partitions_of_a_member_that_closes_go_to_the_other_from_the_committed_position(backend: Backend) -> None:
    topic, group = backend.topic(4), unique_name("g")
    everything = {(topic, p) for p in range(4)}
    for partition in range(4):
        backend.publish(topic, partition, [b"first"])
    a, b = backend.member(group, [topic]), backend.member(group, [topic])
    split(a, b, everything)
    for partition in range(4):
        backend.publish(topic, partition, values(f"p{partition}", 10))
    until(lambda: all(offsets(a.got + b.got, *tp)[-1:] == [10] for tp in everything), a, b,
          what="both members to read to the end")
    held_by_a = a.assignment()
    a.c.commit(dict.fromkeys(held_by_a, 5))  # offsets 5..10 not safe yet
    b.c.commit(dict.fromkeys(b.assignment(), 11))
    a.c.close()

    before = len(b.got)
    until(lambda: b.assignment() == everything and len(b.got) - before >= 6 * len(held_by_a), b,
          what="b to take a's partitions and read what a did not commit")
    quiet(b)
    again = b.got[before:]
    assert {(d.topic, d.partition) for d in again} == held_by_a
    for tp in held_by_a:
        assert offsets(again, *tp) == list(range(5, 11))
    # b gave up nothing for good (Kafka's eager protocol revokes b's own partitions and
    # gives them straight back; they resume from b's commit, so nothing is read twice).
    assert b.all_revoked() <= everything - held_by_a


def test_on_revoked_reports_what_a_joining_member_takes_and_late_commits_are_dropped(backend: Backend) -> None:
    topic, group = backend.topic(4), unique_name("g")
    everything = {(topic, p) for p in range(4)}
    for partition in range(4):
        backend.publish(topic, partition, values(f"p{partition}", 6))
    a = backend.member(group, [topic])
    a.on_revoked = lambda partitions: a.c.commit(dict.fromkeys(partitions, 2))  # still a's: the commit counts
    until(lambda: len(a.got) >= 24, a, what="a to read all 24 messages")
    assert a.assignment() == everything and a.revoked == []

    b = backend.member(group, [topic])
    split(a, b, everything)
    taken = b.assignment()
    assert a.all_revoked() >= taken  # Kafka's eager protocol revokes all, then gives some back
    assert a.assignment() == everything - taken
    until(lambda: len(b.got) >= 4 * len(taken), b, what="b to read from the positions a committed when revoked")
    for tp in taken:
        assert offsets(b.got, *tp) == [2, 3, 4, 5]

    a.c.commit(dict.fromkeys(taken, 6))  # no longer a's: dropped
    b.c.close()
    before = len(a.got)
    until(lambda: a.assignment() == everything and len(a.got) - before >= 4 * len(taken), a,
          what="a to take b's partitions back")
    quiet(a)
    for tp in taken:
        assert offsets(a.got[before:], *tp) == [2, 3, 4, 5]
    assert a.all_revoked() >= taken


def test_two_members_of_a_group_each_get_a_share_of_every_topic(backend: Backend) -> None:
    """Workers of one pool read three topics: a burst on any one must reach them all."""
    topics, group = [backend.topic(4) for _ in range(3)], unique_name("g")
    for topic in topics:
        backend.publish(topic, 0, values("x", 1))
        backend.publish(topic, 3, values("x", 1))
    a = backend.member(group, topics)
    b = backend.member(group, topics)
    everything = {(topic, p) for topic in topics for p in range(4)}
    if isinstance(backend, KafkaBackend):
        split(a, b, everything)
        for topic in topics:
            assert {p for t, p in a.assignment() if t == topic} and {p for t, p in b.assignment() if t == topic}
    else:  # the embedded log deals only partitions that hold messages
        split(a, b, {(topic, p) for topic in topics for p in (0, 3)})
        for topic in topics:
            assert [t for t, _ in a.assignment()].count(topic) == 1 == [t for t, _ in b.assignment()].count(topic)


def test_a_paused_topic_stops_while_another_flows(backend: Backend) -> None:
    x, y = backend.topic(2), backend.topic(1)
    member = backend.member(unique_name("g"), [x, y])
    member.c.pause([x])  # before the assignment: partitions assigned later start paused

    def of(topic: str) -> list[Delivery]:
        return [d for d in member.got if d.topic == topic]

    for partition in range(2):
        backend.publish(x, partition, values(f"x{partition}", 5))
    backend.publish(y, 0, values("y", 5))
    until(lambda: len(of(y)) >= 5, member, what="the unpaused topic")
    quiet(member)
    assert of(x) == [] and [d.value for d in of(y)] == values("y", 5)

    member.c.resume([x])
    until(lambda: len(of(x)) >= 10, member, what="the resumed topic")
    member.c.pause([x])  # assigned now
    for partition in range(2):
        backend.publish(x, partition, values(f"x{partition}-again", 3))
    backend.publish(y, 0, values("y-again", 3))
    until(lambda: len(of(y)) >= 8, member, what="the unpaused topic, again")
    quiet(member)
    assert len(of(x)) == 10

    member.c.resume([x])
    until(lambda: len(of(x)) >= 16, member, what="the resumed topic, again")
    quiet(member)
    assert by_partition(of(x)) == {(x, p): values(f"x{p}", 5) + values(f"x{p}-again", 3) for p in range(2)}
    assert [d.value for d in of(y)] == values("y", 5) + values("y-again", 3)
    assert member.assignment() == {(x, 0), (x, 1), (y, 0)}


def test_the_scanner_reads_a_whole_topic_and_moves_no_position(backend: Backend) -> None:
    topic, group = backend.topic(3), unique_name("g")
    backend.publish(topic, 0, values("p0", 4))
    backend.publish(topic, 2, values("p2", 3))
    first = backend.member(group, [topic])
    until(lambda: len(first.got) >= 7, first, what="all 7 messages")
    first.c.commit({(topic, 0): 2, (topic, 2): 3})
    first.c.close()

    scanner = backend.scanner()
    scanned = scanner.scan(topic)
    assert [(d.topic, d.partition, d.offset, d.value) for d in scanned] == (
        [(topic, 0, n, value) for n, value in enumerate(values("p0", 4))]
        + [(topic, 2, n, value) for n, value in enumerate(values("p2", 3))]
    )
    assert all(abs(d.timestamp_ms - time.time() * 1000) < 60_000 for d in scanned)
    limited = scanner.scan(topic, limit=5)
    assert len(limited) == 5 and set(limited) <= set(scanned)
    for partition in (0, 2):
        assert offsets(limited, topic, partition) == list(range(len(offsets(limited, topic, partition))))
    assert scanner.scan(topic, limit=0) == []
    assert scanner.scan(f"{topic}-missing") == []

    second = backend.member(group, [topic])
    until(lambda: len(second.got) >= 2, second, what="the uncommitted messages")
    quiet(second)
    assert [(d.partition, d.offset) for d in second.got] == [(0, 2), (0, 3)]


# The embedded queue only.


def test_an_embedded_member_that_stops_polling_loses_its_partitions_and_its_late_commits(tmp_path: Path) -> None:
    backend = SqliteBackend(tmp_path / "queue.db")
    try:
        topic, group = backend.topic(2), unique_name("g")
        everything = {(topic, 0), (topic, 1)}
        for partition in range(2):
            backend.publish(topic, partition, values(f"p{partition}", 3))
        a = backend.member(group, [topic], name="a", session_timeout_s=0.5)
        b = backend.member(group, [topic], name="b", session_timeout_s=0.5)
        split(a, b, everything)
        until(lambda: len(a.got) + len(b.got) >= 6, a, b, what="all 6 messages")
        (held_by_a,) = a.assignment()
        revoked_before = len(a.revoked)  # a held both until b joined

        stopped = time.monotonic()  # a stops polling
        until(lambda: b.assignment() == everything, b, what="b to take a's partition")
        assert time.monotonic() - stopped > 0.3  # a's session (0.5 s after its last heartbeat)
        until(lambda: len(offsets(b.got, *held_by_a)) >= 3, b, what="b to read a's partition from the start")
        b.c.commit({held_by_a: 2})

        a.c.commit({held_by_a: 3})  # a has not polled since: it still believes it holds it
        assert backend.queue.position(group, *held_by_a) == 2
        assert a.assignment() == {held_by_a}
        a.poll()
        assert a.revoked[revoked_before:] == [[held_by_a]] and held_by_a not in a.assignment()
        # The rule deals the sorted partitions to the sorted members: a gets it back.
        until(lambda: a.assignment() == {held_by_a} and b.assignment() == everything - {held_by_a}, a, b,
              what="a to get its share again")
        assert b.revoked[-1:] == [[held_by_a]]
        a.c.commit({held_by_a: 3})  # taken afresh, at a new generation: the commit counts
        assert backend.queue.position(group, *held_by_a) == 3
    finally:
        backend.close()


def test_the_embedded_publisher_deals_a_ready_topics_messages_over_its_partitions(tmp_path: Path) -> None:
    queue = SqliteQueue(tmp_path / "queue.db", ready_partitions=4)
    try:
        publisher = queue.publisher()
        ready, dead = KafkaSettings().ready_topic("normal"), KafkaSettings().dead_letter_topic
        publisher.publish(ready, values("first", 3))
        publisher.publish(dead, values("letter", 3))
        publisher.flush(DEADLINE_S)
        publisher.publish(ready, values("second", 6))
        publisher.flush(DEADLINE_S)
        scanned = queue.scanner().scan(ready)
        # Round-robin, carrying on from where the previous flush stopped.
        assert by_partition(scanned) == {
            (ready, 0): [b"first-0", b"second-1", b"second-5"], (ready, 1): [b"first-1", b"second-2"],
            (ready, 2): [b"first-2", b"second-3"], (ready, 3): [b"second-0", b"second-4"]}
        assert [d.offset for d in scanned if d.partition == 0] == [0, 1, 2]
        # Not a ready topic: one partition, so letters keep their names and their order.
        assert by_partition(queue.scanner().scan(dead)) == {(dead, 0): values("letter", 3)}
    finally:
        queue.close()


def test_messages_an_older_version_left_in_partition_0_are_still_consumed(tmp_path: Path) -> None:
    """A file written when every ready message went to partition 0, half of it consumed
    and committed: a consumer of this version reads the rest of partition 0 from the
    committed position, and the partitions new messages went to."""
    backend = SqliteBackend(tmp_path / "queue.db")
    try:
        topic, group = KafkaSettings().ready_topic("high"), unique_name("g")
        backend.publish(topic, 0, values("old", 6))  # as the older publisher wrote them
        backend.queue.commit(group, topic, {0: 3})
        publisher = backend.queue.publisher()
        publisher.publish(topic, values("new", 16))
        publisher.flush(DEADLINE_S)
        a, b = backend.member(group, [topic]), backend.member(group, [topic])
        wanted = set(values("old", 6)[3:] + values("new", 16))
        # Before the two have split the partitions, one may read some that it then gives
        # up uncommitted, and the other reads them again: at least once, not exactly once.
        until(lambda: {d.value for d in a.got + b.got} >= wanted, a, b, what="every message not committed")
        quiet(a, b)
        assert {d.value for d in a.got + b.got} == wanted
        assert a.got and b.got
    finally:
        backend.close()
