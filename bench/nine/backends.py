"""The two backends a run can use, behind one shape (`Backend`): where the tasks are
stored, how the processes the bench starts find them, the raw ceiling the fire rate is
set against, the ingest, and the reader of the ready topics.

- `ServerBackend` (`--backend cassandra`, the default): Cassandra, Kafka and ZooKeeper,
  on a keyspace, topics and ZooKeeper root of the run's own (`Deployment`); the ceiling
  is Kafka's produce ceiling; the reader consumes the ready topics (`Reader`).
- `EmbeddedBackend` (`--backend embedded`): the SQLite files of the embedded backend in
  a directory of the run's own (`tasks.db`, with `queue.db` and `coordinator.db` beside
  it). There is no Kafka: the ceiling is what one process writes into a scratch copy of
  the SQLite queue through its publisher (one transaction of `SQLITE_BATCH` messages at
  a time, as a dispatcher's tick writes), and the reader follows the queue's messages
  table and at the end takes every message with the time the queue stored it from the
  queue's `TopicScanner`."""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME

from scheduler.adapters.cassandra.connection import connect
from scheduler.adapters.embedded.queue import SqliteQueue
from scheduler.adapters.embedded.store import SqliteTaskStore
from scheduler.model import MESSAGE_ID_SLICE
from scheduler.producer import Submission
from scheduler.settings import READY_TOPICS, KafkaSettings

from .ceiling import kafka_ceiling
from .common import BenchFailure
from .deployment import Deployment
from .reader import Reader, Record
from .settings import LEASE_TIMEOUT_S, SHARDS
from .workload import ingest, ingest_into

SQLITE_BATCH = 2000
EMBEDDED_TOPIC_PREFIX = "nine-oclock"


class ReadyReader(Protocol):
    @property
    def seen(self) -> int: ...

    pid: int | None

    def finish(self) -> tuple[list[Record], float]: ...

    def abort(self) -> None: ...


class Backend(Protocol):
    name: str

    def create(self, cleanup: list[Callable[[], None]], keep: bool) -> None: ...

    def describe(self) -> dict[str, Any]: ...

    def summary(self) -> str:
        """Where the run's tasks, topics and leases are, for the progress lines."""
        ...

    def env(self) -> dict[str, str]:
        """The variables the scheduler processes read to find this deployment."""
        ...

    def arguments(self) -> list[str]:
        """The command-line arguments that pick this backend (`--backend ...`)."""
        ...

    def ceiling(self, messages: Sequence[bytes]) -> dict[str, Any]: ...

    def ingest(self, items: list[Submission],
               progress: Callable[[int], None]) -> tuple[dict[str, Any], dict[bytes, int]]: ...

    def reader(self, mode: str) -> ReadyReader: ...


class ServerBackend:
    """Cassandra, Kafka and ZooKeeper (see `Deployment`)."""

    name = "cassandra"

    def __init__(self, log_append_time: bool = True) -> None:
        """`log_append_time`: the ready topics stamp each message when Kafka stores it
        (the burst's lateness); False: they keep the dispatcher's stamp, the moment its gate
        released the message (the fairness scenario's rates)."""
        self.deployment = Deployment.fresh()
        self.log_append_time = log_append_time

    def create(self, cleanup: list[Callable[[], None]], keep: bool) -> None:
        connection = connect(self.deployment.cassandra)
        cleanup.append(connection.close)
        self.deployment.create(connection, cleanup, keep, self.log_append_time)

    def describe(self) -> dict[str, Any]:
        d = self.deployment
        return {"backend": self.name, "keyspace": d.cassandra.keyspace, "topic_prefix": d.kafka.topic_prefix,
                "zookeeper_root": d.zookeeper.root,
                "ready_timestamps": "LogAppendTime" if self.log_append_time else "CreateTime (release moment)"}

    def summary(self) -> str:
        d = self.deployment
        return f"keyspace {d.cassandra.keyspace}, topics {d.kafka.topic_prefix}.*, ZooKeeper {d.zookeeper.root}"

    def env(self) -> dict[str, str]:
        return self.deployment.env()

    def arguments(self) -> list[str]:
        return ["--backend", "cassandra"]

    def ceiling(self, messages: Sequence[bytes]) -> dict[str, Any]:
        return {"kind": "kafka_produce", **kafka_ceiling(self.deployment.kafka, self.deployment.ceiling_topic,
                                                         messages)}

    def ingest(self, items: list[Submission],
               progress: Callable[[int], None]) -> tuple[dict[str, Any], dict[bytes, int]]:
        return ingest(self.deployment.cassandra, items, progress)

    def reader(self, mode: str) -> ReadyReader:
        return Reader(mode, self.deployment.kafka, self.deployment.ready_topics)


class EmbeddedBackend:
    """The embedded backend's SQLite files in `directory`."""

    name = "embedded"

    def __init__(self, directory: Path) -> None:
        self.directory = directory.resolve()
        self.db = self.directory / "tasks.db"
        self.kafka = KafkaSettings(topic_prefix=EMBEDDED_TOPIC_PREFIX)

    @property
    def queue_path(self) -> Path:
        return self.db.with_name("queue.db")

    @property
    def ready_topics(self) -> list[str]:
        return [self.kafka.ready_topic(name) for name in READY_TOPICS]

    def create(self, cleanup: list[Callable[[], None]], keep: bool) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        if any(self.directory.iterdir()):
            raise BenchFailure(f"{self.directory} is not empty: the embedded run needs a fresh directory")
        if not keep:
            cleanup.append(lambda: shutil.rmtree(self.directory, ignore_errors=True))
        SqliteTaskStore(self.db, shard_count=SHARDS).close()  # the schema, before any dispatcher opens it
        SqliteQueue(self.queue_path).close()

    def describe(self) -> dict[str, Any]:
        return {"backend": self.name, "db": str(self.db), "queue": str(self.queue_path),
                "ready_timestamps": "publish time (release time for tasks the gate let out)",
                "coordinator": str(self.db.with_name("coordinator.db")), "topic_prefix": self.kafka.topic_prefix}

    def summary(self) -> str:
        return f"embedded backend, {self.db} with queue.db and coordinator.db beside it"

    def env(self) -> dict[str, str]:
        return {"SCHEDULER_BACKEND": "embedded", "SCHEDULER_DB": str(self.db),
                "SCHEDULER_SHARDS_TOTAL": str(SHARDS), "SCHEDULER_TOPIC_PREFIX": self.kafka.topic_prefix,
                "SCHEDULER_LEASE_TIMEOUT_S": str(LEASE_TIMEOUT_S)}

    def arguments(self) -> list[str]:
        return ["--backend", "embedded", "--db", str(self.db)]

    def ceiling(self, messages: Sequence[bytes]) -> dict[str, Any]:
        """Messages/s into a scratch queue file through the embedded publisher, `SQLITE_BATCH`
        a transaction: the median of 3 rounds, each into a fresh file."""
        rates: list[int] = []
        for round_ in range(3):
            path = self.directory / f"ceiling-{round_}" / "queue.db"
            path.parent.mkdir()
            queue = SqliteQueue(path)
            publisher = queue.publisher()
            started = time.monotonic()
            for start in range(0, len(messages), SQLITE_BATCH):
                publisher.publish(self.ready_topics[0], messages[start:start + SQLITE_BATCH])
                publisher.flush(60)
            rates.append(round(len(messages) / (time.monotonic() - started)))
            queue.close()
            shutil.rmtree(path.parent, ignore_errors=True)
        rates.sort()
        return {"kind": "sqlite_queue_insert", "messages": len(messages),
                "message_bytes_mean": round(sum(map(len, messages)) / len(messages), 1),
                "msgs_per_s": rates[len(rates) // 2], "runs": rates,
                "how": f"SqliteQueue publisher, {SQLITE_BATCH:,} messages a transaction (synchronous=FULL), "
                       "one process, into a scratch file beside the run's"}

    def ingest(self, items: list[Submission],
               progress: Callable[[int], None]) -> tuple[dict[str, Any], dict[bytes, int]]:
        store = SqliteTaskStore(self.db, shard_count=SHARDS)
        try:
            return ingest_into(store, items, progress)
        finally:
            store.close()

    def reader(self, mode: str) -> ReadyReader:
        """On a thread of the bench, whatever `mode` (`--reader` is for Kafka)."""
        return QueueReader(self.queue_path, self.ready_topics)


class QueueReader:
    """Follows the embedded queue's ready topics on a thread (distinct task ids seen, for
    the run's loop); at the end takes every message with its stored time from the
    queue's `TopicScanner`."""

    def __init__(self, path: Path, topics: list[str]) -> None:
        self.pid: int | None = None
        self._queue = SqliteQueue(path)
        self._topics = topics
        self._stop = threading.Event()
        self._ids: set[bytes] = set()
        self._cpu = 0.0
        self._thread = threading.Thread(target=self._follow, name="queue-reader", daemon=True)
        self._thread.start()
        self.pid = os.getpid()

    @property
    def seen(self) -> int:
        return len(self._ids)

    def _follow(self) -> None:
        offsets = {(topic, partition): 0 for topic in self._topics
                   for partition in range(self._queue.partitions_of(topic))}
        started = time.thread_time()
        while not self._stop.is_set():
            got = 0
            for (topic, partition), offset in offsets.items():
                rows = self._queue.read_from(topic, partition, offset, 10_000)
                if rows:
                    offsets[(topic, partition)] = rows[-1][0] + 1
                    self._ids.update(value[MESSAGE_ID_SLICE] for _, value in rows)
                    got += len(rows)
            if not got:
                self._stop.wait(0.2)
        self._cpu = time.thread_time() - started

    def finish(self) -> tuple[list[Record], float]:
        self._stop.set()
        self._thread.join(30)
        started = time.thread_time()
        scanner = self._queue.scanner()
        records = [(delivery.value, delivery.timestamp_ms, TIMESTAMP_LOG_APPEND_TIME)
                   for topic in self._topics for delivery in scanner.scan(topic)]
        self._queue.close()
        return records, self._cpu + time.thread_time() - started

    def abort(self) -> None:
        self._stop.set()
