"""Against the real Kafka: task messages go through an idempotent `acks=all` producer
and come back whole, in order within each partition."""

from __future__ import annotations

import uuid
from collections import defaultdict

from confluent_kafka import Consumer, KafkaError, Message, Producer

from scheduler.adapters.kafka.security import client_config
from scheduler.model import Task, TaskId, decode_message, encode_message, encode_payload
from tests.cluster import Cluster

COUNT = 300


def test_task_messages_are_produced_and_consumed_whole_and_in_partition_order(
    cluster: Cluster, kafka_topic: str
) -> None:
    producer = Producer(
        {**client_config(cluster.kafka), "enable.idempotence": True, "acks": "all", "linger.ms": 5}
    )
    errors: list[KafkaError] = []

    def delivered(error: KafkaError | None, _message: Message) -> None:
        if error is not None:
            errors.append(error)

    sent: dict[int, list[Task]] = defaultdict(list)
    for n in range(COUNT):
        run_at = 1_796_202_000_000 + n
        task = Task(id=TaskId.new(run_at), tenant=f"college-{n % 7}", type="reminder",
                    payload=encode_payload({"n": n}), run_at_ms=run_at)
        partition = task.id.shard(64) % 3
        producer.produce(kafka_topic, encode_message(task, fence=42), partition=partition, on_delivery=delivered)
        sent[partition].append(task)
    assert producer.flush(30) == 0, "messages still unsent after 30 s"
    assert errors == []

    consumer = Consumer({
        **client_config(cluster.kafka),
        "group.id": f"test-{uuid.uuid4().hex}",
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
    })
    consumer.subscribe([kafka_topic])
    received: dict[int, list[Task]] = defaultdict(list)
    try:
        for _ in range(600):  # at most 600 polls of 0.1 s: a minute
            if sum(map(len, received.values())) >= COUNT:
                break
            message = consumer.poll(0.1)
            if message is None:
                continue
            assert message.error() is None, message.error()
            value, at = message.value(), message.partition()
            assert value is not None and at is not None
            decoded = decode_message(value)
            assert decoded.fence == 42
            received[at].append(decoded.task)
    finally:
        consumer.close()
    assert sum(map(len, received.values())) == COUNT
    assert dict(received) == dict(sent)
