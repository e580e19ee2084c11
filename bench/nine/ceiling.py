"""The raw Kafka ceiling: how fast one process produces the bench's own messages with
the dispatcher's producer settings and nothing else to do, the yardstick for the fire
rate. A message that fails or is not acknowledged within the flush is a
`BenchFailure`."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from confluent_kafka import Message, Producer

from scheduler.adapters.kafka.publisher import PRODUCER_CONFIG
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

    config: dict[str, Any] = {"bootstrap.servers": kafka.bootstrap, "client.id": "nine-oclock-ceiling",
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
