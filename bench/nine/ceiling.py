"""Raw ceilings, the yardsticks of the benches' figures, each measured with nothing else
to do: the Kafka produce ceiling (`kafka_ceiling`: how fast one process produces the
bench's own messages with the dispatcher's producer settings), for the fire rate; and,
for the worker bench, the consume ceilings (`kafka_consume_ceiling`, and
`sqlite_read_ceiling` for the embedded queue), the home-row check ceiling
(`home_check_ceiling`) and the status-write ceiling (`status_write_ceiling`). A message that fails, is not acknowledged within the flush,
or is not there to read is a `BenchFailure`."""

from __future__ import annotations

import secrets
import sqlite3
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, Message, Producer, TopicPartition

from scheduler.adapters.kafka.publisher import PRODUCER_CONFIG
from scheduler.adapters.kafka.security import client_config
from scheduler.model import TaskId
from scheduler.ports import StatusReport, TaskStatus, TaskStore
from scheduler.settings import KafkaSettings

from .common import KAFKA_LOG, BenchFailure


def kafka_ceiling(kafka: KafkaSettings, topic: str, messages: Sequence[bytes], rounds: int = 3) -> dict[str, Any]:
    """Messages/s of one process producing `messages` with the dispatcher's producer
    settings, from the first `produce` to the end of the `flush`: the median of `rounds`
    runs (one run is well under a second, so one alone is noisy), after an untimed 1%."""
    failed = 0

    def delivered(error: Any, _: Message) -> None:
        nonlocal failed
        if error is not None:
            failed += 1

    config: dict[str, Any] = {**client_config(kafka), "client.id": "nine-oclock-ceiling",
                              **PRODUCER_CONFIG, "on_delivery": delivered, "logger": KAFKA_LOG}
    producer = Producer(config)

    def produce_all(values: Sequence[bytes]) -> float:
        started = time.monotonic()
        produce = producer.produce
        for value in values:
            while True:
                try:
                    produce(topic, value)
                    break
                except BufferError:
                    producer.poll(0.01)
        if producer.flush(120) or failed:
            raise BenchFailure(f"the Kafka ceiling run lost messages: {failed} failed, {len(producer)} unacknowledged")
        return time.monotonic() - started

    produce_all(messages[: max(1, len(messages) // 100)])
    rates = sorted(round(len(messages) / produce_all(messages)) for _ in range(rounds))
    return {"messages": len(messages), "message_bytes_mean": round(sum(map(len, messages)) / len(messages), 1),
            "msgs_per_s": rates[len(rates) // 2], "runs": rates, "settings": dict(PRODUCER_CONFIG)}


# The worker bench's ceilings: reading the ready topic back, and writing statuses.


def kafka_consume_ceiling(kafka: KafkaSettings, topic: str, expected: int, rounds: int = 3, batch: int = 500,
                          timeout_s: float = 120.0) -> dict[str, Any]:
    """Messages/s of a bare consumer (confluent-kafka, default fetch settings, no group:
    every partition of `topic` assigned from its start) reading the `expected` messages
    already there, `batch` at a time (the worker's poll size: `consume` returns as soon
    as that many are fetched); each value is taken out of its message, nothing is
    decoded. Timed as
    the worker is, from the first message: the messages after the first batch over the
    time from that batch to the last message (the first fetch waits on connections).
    The median of `rounds` runs, each a fresh consumer."""
    rates: list[int] = []
    for _ in range(rounds):
        config: dict[str, Any] = {**client_config(kafka), "group.id": f"bench-ceiling-{secrets.token_hex(4)}",
                                  "enable.auto.commit": False, "logger": KAFKA_LOG}
        consumer = Consumer(config)
        try:
            partitions = consumer.list_topics(topic, timeout=30).topics[topic].partitions
            deadline = time.monotonic() + timeout_s
            consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
            count = first_batch = 0
            first_at = 0.0
            while count < expected:
                for message in consumer.consume(batch, 0.5):
                    if message.error() is None:
                        message.value()
                        count += 1
                if count and not first_batch:
                    first_at, first_batch = time.monotonic(), count
                if time.monotonic() > deadline:
                    raise BenchFailure(f"the consume ceiling read {count:,} of {expected:,} messages of {topic} "
                                       f"in {timeout_s} s")
            seconds = time.monotonic() - first_at
            if count > first_batch and seconds > 0:
                rates.append(round((count - first_batch) / seconds))
        finally:
            consumer.close()
    if not rates:
        return {"messages": expected, "msgs_per_s": None, "runs": [],
                "how": "too few messages: each run read them all in its first batch"}
    rates.sort()
    return {"messages": expected, "msgs_per_s": rates[len(rates) // 2], "runs": rates,
            "operations": expected * rounds, "how": f"bare confluent-kafka consumer, all partitions assigned from the start, consume({batch})"}


def sqlite_read_ceiling(queue_path: Path, topic: str, expected: int, batch: int, rounds: int = 3) -> dict[str, Any]:
    """Messages/s of plain `sqlite3` reading the embedded queue's `topic`, partition by
    partition in offset order, `batch` rows a query (the worker's poll size): the
    embedded counterpart of the consume ceiling."""
    rates: list[int] = []
    for _ in range(rounds):
        db = sqlite3.connect(str(queue_path))
        try:
            partitions = [p for (p,) in db.execute(
                'SELECT DISTINCT "partition" FROM messages WHERE topic = ? ORDER BY 1', (topic,))]
            started = time.monotonic()
            count = 0
            for partition in partitions:
                offset = 0
                while rows := db.execute('SELECT "offset", value FROM messages WHERE topic = ? AND "partition" = ? '
                                         'AND "offset" >= ? ORDER BY "offset" LIMIT ?',
                                         (topic, partition, offset, batch)).fetchall():
                    count += len(rows)
                    offset = rows[-1][0] + 1
            if count < expected:
                raise BenchFailure(f"the embedded queue holds {count:,} of {expected:,} messages of {topic}")
            rates.append(round(count / (time.monotonic() - started)))
        finally:
            db.close()
    rates.sort()
    return {"messages": expected, "msgs_per_s": rates[len(rates) // 2], "runs": rates,
            "operations": expected * rounds, "how": f"plain sqlite3 SELECTs of {batch} rows in offset order"}


def home_check_ceiling(store: TaskStore, task_ids: Sequence[TaskId], batch: int = 500) -> dict[str, Any]:
    """Ids/s of `store.statuses` from one thread, `batch` ids a call (the worker checks
    each polled batch against the home rows this way), on `task_ids` (stored tasks no
    worker sees). Median of three rounds."""
    rates: list[int] = []
    for _ in range(3):
        started = time.monotonic()
        found = 0
        for start in range(0, len(task_ids), batch):
            found += len(store.statuses(task_ids[start:start + batch]))
        if found != len(task_ids):
            raise BenchFailure(f"statuses found {found:,} of {len(task_ids):,} stored tasks")
        rates.append(round(len(task_ids) / (time.monotonic() - started)))
    ordered = sorted(rates)
    return {"ids": len(task_ids), "ids_per_s": ordered[len(ordered) // 2], "runs": rates,
            "operations": len(task_ids) * len(rates), "how": f"store.statuses of {batch} ids a call, one thread"}


STATUS_ROUNDS = ((1, TaskStatus.RUNNING), (1, TaskStatus.DONE), (2, TaskStatus.DONE))
"""Each round's report (attempt, status) outranks the last, so each one changes every row."""


def status_write_ceiling(store: TaskStore, task_ids: Sequence[TaskId], batch: int = 5000) -> dict[str, Any]:
    """Reports/s of `store.record_status` from one thread, `batch` reports a call (the
    settler's largest batch), on `task_ids` (stored tasks no worker sees), with nothing
    else running: the settler's write path alone. Median of three rounds."""
    rates: list[int] = []
    for attempt, status in STATUS_ROUNDS:
        reports = [StatusReport(task_id, attempt, status) for task_id in task_ids]
        started = time.monotonic()
        for start in range(0, len(reports), batch):
            store.record_status(reports[start:start + batch])
        rates.append(round(len(reports) / (time.monotonic() - started)))
    ordered = sorted(rates)
    return {"reports": len(task_ids), "reports_per_s": ordered[len(ordered) // 2], "runs": rates,
            "operations": len(task_ids) * len(rates), "how": f"store.record_status of {batch:,} reports a call, one thread"}
