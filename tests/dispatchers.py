"""Running `scheduler dispatcher` processes in tests, and watching what they publish.

A `Fleet` starts dispatchers as real processes (so kill -9 and SIGSTOP are real), each
with its own log and stats file, on one test's keyspace, topic prefix and ZooKeeper
root. A `ReadyTopics` reader collects every message published to the ready topics,
with the time the broker stamped on it, so tests count what fired, when, and under
which token.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, BinaryIO

from confluent_kafka import Consumer, TopicPartition

from scheduler.adapters.cassandra.store import CassandraTaskStore
from scheduler.adapters.kafka.security import client_config
from scheduler.errors import InvalidMessage
from scheduler.model import TaskId, decode_message, from_ms
from scheduler.producer import Client
from scheduler.settings import READY_TOPICS, CassandraSettings, KafkaSettings
from tests.support import wait_until

LEASE_TIMEOUT_S = 3.0
"""Lease timeout of the dispatchers tests start: short, so failovers are quick."""

EVENT = re.compile(
    r"^(?P<at>\S+) \S+ \S+: (?:firing shard (?P<start>\d+) from|stopped firing shard (?P<drop>\d+)|"
    r"stopped firing shard (?P<give>\d+) to give it back)"
)


@dataclass
class ManagedProcess:
    """A `scheduler` process a test started: its log, its stats file, and signals."""

    name: str
    process: subprocess.Popen[bytes]
    log_path: Path
    stats_path: Path
    log_file: BinaryIO

    def stats(self) -> dict[str, Any]:
        try:
            document: dict[str, Any] = json.loads(self.stats_path.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return {}
        return document

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def signal(self, signum: int) -> None:
        os.kill(self.process.pid, signum)

    def alive(self) -> bool:
        return self.process.poll() is None


@dataclass
class Dispatcher(ManagedProcess):
    def shards(self) -> list[int]:
        return list(self.stats().get("shards", []))


@dataclass
class Fleet:
    env: Mapping[str, str]
    directory: Path
    dispatchers: list[Dispatcher] = field(default_factory=list)

    def start(self, name: str, *args: str) -> Dispatcher:
        log_path = self.directory / f"{name}.log"
        stats_path = self.directory / f"{name}.json"
        log_file = log_path.open("wb")
        process = subprocess.Popen(
            [sys.executable, "-m", "scheduler", "dispatcher", "--member", name, "--stats-file", str(stats_path),
             *args],
            stdout=subprocess.DEVNULL, stderr=log_file, env={**os.environ, **self.env},
        )
        dispatcher = Dispatcher(name, process, log_path, stats_path, log_file)
        self.dispatchers.append(dispatcher)
        return dispatcher

    def wait_for_split(self, expected: Mapping[str, int], timeout_s: float) -> None:
        """Wait until each named dispatcher holds the expected number of shards."""
        by_name = {d.name: d for d in self.dispatchers}

        def settled() -> bool:
            for name, count in expected.items():
                if not by_name[name].alive():
                    raise AssertionError(f"dispatcher {name} exited:\n{by_name[name].log()[-3000:]}")
                if len(by_name[name].shards()) != count:
                    return False
            return True

        wait_until(settled, timeout_s=timeout_s, what=f"the split {dict(expected)}: "
                   + str({n: len(by_name[n].shards()) for n in expected}))

    def stop_all(self) -> None:
        for dispatcher in self.dispatchers:
            if dispatcher.alive():
                dispatcher.signal(signal.SIGCONT)
                dispatcher.process.terminate()
        for dispatcher in self.dispatchers:
            try:
                dispatcher.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                dispatcher.process.kill()
                dispatcher.process.wait(timeout=10)
            dispatcher.log_file.close()

    def firing_intervals(self) -> dict[int, list[tuple[float, float, str]]]:
        """shard -> (from, to, dispatcher) for every time a dispatcher fired it, from the
        logs; `to` is infinity while it still fires. A start is logged before the first
        fire and a stop after the last, so logged intervals contain the real ones."""
        intervals: dict[int, list[tuple[float, float, str]]] = {}
        for dispatcher in self.dispatchers:
            open_since: dict[int, float] = {}
            for line in dispatcher.log().splitlines():
                match = EVENT.match(line)
                if match is None:
                    continue
                at = datetime.fromisoformat(match["at"]).timestamp()
                if match["start"] is not None:
                    open_since[int(match["start"])] = at
                else:
                    shard = int(match["drop"] or match["give"])
                    begun = open_since.pop(shard, None)
                    if begun is not None:
                        intervals.setdefault(shard, []).append((begun, at, dispatcher.name))
            for shard, begun in open_since.items():
                end = float("inf") if dispatcher.alive() else dispatcher_end(dispatcher)
                intervals.setdefault(shard, []).append((begun, end, dispatcher.name))
        return intervals


def dispatcher_end(dispatcher: Dispatcher) -> float:
    """When a dead dispatcher's log ends: it fired nothing after."""
    for line in reversed(dispatcher.log().splitlines()):
        try:
            return datetime.fromisoformat(line.split(" ", 1)[0]).timestamp()
        except ValueError:
            continue
    return 0.0


def overlaps(intervals: Mapping[int, list[tuple[float, float, str]]]) -> list[str]:
    """Every pair of firing intervals of one shard that overlap, described."""
    found = []
    for shard, spans in intervals.items():
        ordered = sorted(spans)
        for (a_from, a_to, a_name), (b_from, b_to, b_name) in zip(ordered, ordered[1:], strict=False):
            if b_from < a_to:
                found.append(f"shard {shard}: {a_name} [{a_from}, {a_to}] and {b_name} [{b_from}, {b_to}]")
    return found


@dataclass(frozen=True)
class Published:
    task_id: TaskId
    fence: int
    at_ms: int
    topic: str
    run_at_ms: int
    tenant: str = ""
    cost: int = 1


class ReadyTopics:
    """Reads every ready topic from the start, in a background thread, until closed."""

    def __init__(self, kafka: KafkaSettings) -> None:
        self.messages: list[Published] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._consumer = Consumer({
            **client_config(kafka), "group.id": f"{kafka.topic_prefix}.test-reader",
            "enable.auto.commit": False, "auto.offset.reset": "earliest",
        })
        partitions = []
        metadata = self._consumer.list_topics(timeout=30)
        for name in READY_TOPICS:
            topic = kafka.ready_topic(name)
            partitions += [TopicPartition(topic, p, 0) for p in metadata.topics[topic].partitions]
        self._consumer.assign(partitions)
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while not self._stop.is_set():
            for message in self._consumer.consume(1000, 0.1):
                value, topic = message.value(), message.topic()
                if message.error() is not None or value is None or topic is None:
                    continue
                try:
                    decoded = decode_message(value)
                except InvalidMessage:
                    continue  # a test's deliberate garbage; workers dead-letter it
                _, stamp = message.timestamp()
                task = decoded.task
                published = Published(task.id, decoded.fence, stamp, topic, task.run_at_ms, task.tenant, task.cost)
                with self._lock:
                    self.messages.append(published)

    def snapshot(self) -> list[Published]:
        with self._lock:
            return list(self.messages)

    def ids(self) -> set[TaskId]:
        return {m.task_id for m in self.snapshot()}

    def wait_for(self, ids: set[TaskId], timeout_s: float) -> list[Published]:
        wait_until(lambda: ids <= self.ids(), timeout_s=timeout_s,
                   what=f"{len(ids - self.ids())} of {len(ids)} tasks to be published")
        return self.snapshot()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self._consumer.close()


def by_id(messages: list[Published]) -> Iterator[tuple[TaskId, list[Published]]]:
    grouped: dict[TaskId, list[Published]] = {}
    for message in messages:
        grouped.setdefault(message.task_id, []).append(message)
    yield from grouped.items()


@dataclass
class Deployment:
    """One test's distributed backend: its keyspace, topics and ZooKeeper root, a client
    that hands off like any producer, a reader of the ready topics, and the dispatchers."""

    cassandra: CassandraSettings
    kafka: KafkaSettings
    store: CassandraTaskStore
    client: Client
    ready: ReadyTopics
    fleet: Fleet

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000


def submit_spread(deployment: Deployment, count: int, from_ms: int, to_ms: int) -> dict[TaskId, int]:
    """`count` tasks due evenly from `from_ms` to `to_ms`; id -> run_at."""
    ids = {}
    for n in range(count):
        run_at = from_ms + (to_ms - from_ms) * n // max(count - 1, 1)
        task_id = deployment.client.submit("sms", {"n": n}, run_at=from_ms_datetime(run_at), tenant=f"college-{n % 5}")
        ids[task_id] = run_at
    return ids


def from_ms_datetime(ms: int) -> datetime:
    return from_ms(ms)
