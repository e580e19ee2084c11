"""The embedded queue's retention: messages past it are deleted a bounded number at a
time, oldest first in each partition, never a partition's last one, so offsets go on
from where they were and every reader keeps reading (`SqliteQueue.purge_expired`)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import pytest

from scheduler.adapters.embedded.queue import DEAD_LETTER_RETENTION_S, RETENTION_S, SqliteQueue
from scheduler.settings import KafkaSettings
from tests.support import wait_until
from tests.tasks import NINE_OCLOCK_MS

KAFKA = KafkaSettings()
READY = KAFKA.ready_topic("normal")
DAY_MS = 86_400_000
OLD = NINE_OCLOCK_MS
NOW = OLD + RETENTION_S * 1000  # the old messages' last moment kept


@pytest.fixture
def queue(tmp_path: Path) -> Iterator[SqliteQueue]:
    with closing(SqliteQueue(tmp_path / "queue.db", handoff_topic=KAFKA.handoff_topic)) as opened:
        yield opened


def offsets(queue: SqliteQueue, topic: str, partition: int) -> list[int]:
    return [offset for offset, _ in queue.read_from(topic, partition, 0, 10_000)]


def test_the_retentions_are_the_kafka_topics_seven_days_and_thirty_for_dead_letters() -> None:
    assert RETENTION_S == 7 * 86_400
    assert DEAD_LETTER_RETENTION_S == 30 * 86_400


def test_messages_past_the_retention_go_and_the_partitions_last_one_stays(queue: SqliteQueue) -> None:
    queue.write([(READY, 0, [b"a", b"b", b"c"]), (READY, 1, [b"d", b"e"])], stamps=[OLD, OLD])
    queue.write([(READY, 0, [b"f"])], stamps=[OLD + 1])

    assert queue.purge_expired(NOW, 100) == 0  # exactly the retention old: kept
    assert queue.purge_expired(NOW + 1, 100) == 4  # a, b, c and d; e is partition 1's last: it stays
    assert offsets(queue, READY, 0) == [3]
    assert offsets(queue, READY, 1) == [1]
    assert queue.purge_expired(NOW + 2, 100) == 0  # f has expired too, but it is partition 0's last
    assert offsets(queue, READY, 0) == [3]

    queue.write([(READY, 0, [b"g"])])  # offsets go on from the last one kept
    assert queue.read_from(READY, 0, 0, 10) == [(3, b"f"), (4, b"g")]


def test_a_purge_deletes_at_most_its_limit_over_topics_and_partitions(queue: SqliteQueue) -> None:
    queue.write([(READY, partition, [b"x"] * 4) for partition in range(3)]
                + [(KAFKA.dead_letter_topic, 0, [b"letter"] * 4), (KAFKA.handoff_topic, 9, [b"h"] * 4)],
                stamps=[OLD] * 5)
    later = NOW + 1

    removed = [queue.purge_expired(later, 4) for _ in range(4)]

    assert removed == [4, 4, 4, 0]  # 12: all but the last of each of the four partitions not of dead letters
    for topic, partition in [(READY, 0), (READY, 1), (READY, 2), (KAFKA.handoff_topic, 9)]:
        assert offsets(queue, topic, partition) == [3], (topic, partition)
    assert offsets(queue, KAFKA.dead_letter_topic, 0) == [0, 1, 2, 3]  # kept 30 days
    assert queue.purge_expired(OLD + DEAD_LETTER_RETENTION_S * 1000 + 1, 10) == 3
    assert offsets(queue, KAFKA.dead_letter_topic, 0) == [3]


def test_a_partition_is_purged_up_to_its_first_message_not_expired(queue: SqliteQueue) -> None:
    queue.write([(READY, 0, [b"old"])], stamps=[OLD])
    queue.write([(READY, 0, [b"new"])], stamps=[OLD + DAY_MS])
    queue.write([(READY, 0, [b"old again", b"last"])], stamps=[OLD])  # a stamp out of order

    assert queue.purge_expired(NOW + 1, 100) == 1
    assert [value for _, value in queue.read_from(READY, 0, 0, 10)] == [b"new", b"old again", b"last"]


def test_readers_behind_the_purge_read_on_from_the_first_message_kept(queue: SqliteQueue) -> None:
    group = KAFKA.worker_group("default")
    queue.commit(group, READY, {0: 1})  # read one, then stopped for over a week
    queue.write([(READY, 0, [b"m0", b"m1", b"m2", b"m3"])], stamps=[OLD])
    queue.write([(KAFKA.handoff_topic, 2, [b"h0", b"h1", b"h2"])], stamps=[OLD])
    assert queue.purge_expired(NOW + 1, 100) == 5
    assert queue.lag({group: [READY]}) == {READY: 1}  # the purged messages no longer wait

    consumer = queue.consumer(group, [READY], member="w1", session_timeout_s=5)
    reader = queue.handoff_reader(KAFKA.dispatcher_group)
    try:
        reader.assign(2)
        got: list[bytes] = []

        def delivered() -> bool:
            got.extend(delivery.value for delivery in consumer.poll(10, 0.1))
            return bool(got)

        wait_until(delivered, timeout_s=10, what="the consumer to be dealt its partition")
        assert got == [b"m3"]
        assert [record.value for record in reader.poll(10, 1.0)] == [b"h2"]
    finally:
        consumer.close()
        reader.close()


def test_a_limit_below_one_is_refused(queue: SqliteQueue) -> None:
    with pytest.raises(ValueError, match="limit"):
        queue.purge_expired(NOW, 0)
