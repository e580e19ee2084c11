"""Reading back the ready topics: every message from offset 0, with its broker
timestamp, until told to stop and then to the end of each partition; on a thread of
the bench or in a spawned process of its own (`Reader`). The process also stops by
itself when the bench is gone. A reader that has not finished `DRAIN_TIMEOUT_S` and a
margin after the stop is a `BenchFailure`."""

from __future__ import annotations

import multiprocessing
import os
import resource
import signal
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from confluent_kafka import Consumer, Message, TopicPartition

from scheduler.adapters.kafka.security import client_config
from scheduler.model import MESSAGE_ID_SLICE
from scheduler.settings import KafkaSettings

from .common import BenchFailure
from .settings import DRAIN_TIMEOUT_S


class Flag(Protocol):
    def is_set(self) -> bool: ...


class Count(Protocol):
    value: int


@dataclass
class Counter:
    value: int = 0


Record = tuple[bytes, int, int]
"""(message value, broker timestamp in ms, timestamp type)."""


def read_ready_topics(kafka: KafkaSettings, topics: Sequence[str], stop: Flag, seen: Count) -> tuple[list[Record], float]:
    """Every message of `topics` from offset 0 until `stop`, then to the end of each
    partition; `seen` counts distinct task ids as they come. Messages are kept as they
    arrived (decoded afterwards), so the reader costs little while the burst runs.
    Returns the records and the CPU seconds of this process while reading."""
    consumer = Consumer({**client_config(kafka), "group.id": "nine-oclock-reader",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    cpu_started = resource.getrusage(resource.RUSAGE_SELF)
    metadata = consumer.list_topics(timeout=30)
    partitions = [TopicPartition(topic, p, 0) for topic in topics for p in metadata.topics[topic].partitions]
    consumer.assign(partitions)
    records: list[Record] = []
    ids: set[bytes] = set()

    def take(batch: list[Message]) -> None:
        for message in batch:
            value = message.value()
            if message.error() is not None or value is None:
                continue
            kind, stamp = message.timestamp()
            records.append((value, stamp, kind))
            ids.add(value[MESSAGE_ID_SLICE])
        seen.value = len(ids)

    while not stop.is_set():
        take(consumer.consume(10_000, 0.2))
    ends = {(p.topic, p.partition): consumer.get_watermark_offsets(TopicPartition(p.topic, p.partition),
                                                                   timeout=10)[1] for p in partitions}
    deadline = time.monotonic() + DRAIN_TIMEOUT_S
    while time.monotonic() < deadline:
        positions = consumer.position(partitions)
        if all(max(p.offset, 0) >= ends[(p.topic, p.partition)] for p in positions):
            break
        take(consumer.consume(10_000, 0.2))
    consumer.close()
    cpu_ended = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (cpu_ended.ru_utime + cpu_ended.ru_stime) - (cpu_started.ru_utime + cpu_started.ru_stime)
    return records, cpu


@dataclass
class StopOrOrphaned:
    """Set when the bench says stop, or when the bench is gone (killed)."""

    stop: Any
    parent: int

    def is_set(self) -> bool:
        return bool(self.stop.is_set()) or os.getppid() != self.parent


def reader_process_main(kafka: KafkaSettings, topics: list[str], stop: Any, seen: Any, connection: Any) -> None:
    """A spawned reader process's body: read, then send the records and CPU seconds back."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the bench stops it through `stop`
    try:
        connection.send(read_ready_topics(kafka, topics, StopOrOrphaned(stop, os.getppid()), seen))
    finally:
        connection.close()


class Reader:
    """`read_ready_topics` on a thread of the bench or in a process of its own."""

    def __init__(self, mode: str, kafka: KafkaSettings, topics: list[str]) -> None:
        self.mode = mode
        self.result: tuple[list[Record], float] | None = None
        self.pid: int | None = None
        if mode == "thread":
            self._stop: Any = threading.Event()
            self._seen: Any = Counter()

            def run() -> None:
                self.result = read_ready_topics(kafka, topics, self._stop, self._seen)

            self._thread = threading.Thread(target=run, name="ready-reader", daemon=True)
            self._thread.start()
            self.pid = os.getpid()
        else:
            context = multiprocessing.get_context("spawn")
            self._stop = context.Event()
            self._seen = context.Value("q", 0, lock=False)
            self._receive, send = context.Pipe(duplex=False)
            self._process = context.Process(target=reader_process_main, name="ready-reader",
                                            args=(kafka, topics, self._stop, self._seen, send), daemon=True)
            self._process.start()
            send.close()
            self.pid = self._process.pid

    @property
    def seen(self) -> int:
        return int(self._seen.value)

    def finish(self) -> tuple[list[Record], float]:
        """Stop reading once every partition is read to its end; the records and CPU seconds."""
        self._stop.set()
        if self.mode == "thread":
            self._thread.join(DRAIN_TIMEOUT_S + 30)
        elif self._receive.poll(DRAIN_TIMEOUT_S + 60):
            self.result = self._receive.recv()
            self._process.join(10)
        if self.result is None:
            raise BenchFailure("the ready-topic reader did not finish")
        return self.result

    def abort(self) -> None:
        self._stop.set()
        if self.mode == "process" and self._process.is_alive():
            self._process.terminate()
            self._process.join(10)
