"""`EmbeddedRig`: a worker's whole world on the embedded backend, in one process: the
SQLite store, queue and effect ledger, a `Worker` on a thread, and helpers to fire
tasks into the ready topics the way a dispatcher does."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from scheduler.adapters.embedded.effects import SqliteEffectLedger
from scheduler.adapters.embedded.queue import SqliteQueue
from scheduler.adapters.embedded.store import SqliteTaskStore
from scheduler.backends import POOL_TOPICS
from scheduler.handoff import LogHandoff
from scheduler.model import Priority, Task, TaskId, encode_message, encode_payload
from scheduler.ports import StoredTask
from scheduler.settings import KafkaSettings
from scheduler.worker.app import App
from scheduler.worker.runtime import Worker, WorkerConfig
from tests.worker import apps

KAFKA = KafkaSettings()
TOPIC_OF = {Priority.HIGH: "high", Priority.NORMAL: "normal", Priority.LOW: "low"}


def wait_for(condition: Callable[[], Any], timeout_s: float = 10.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def task(type_: str = "sms", payload: Any = None, *, tenant: str = "board", priority: Priority = Priority.NORMAL,
         attempt: int = 1, max_attempts: int = 5, run_at_ms: int | None = None) -> Task:
    now = time.time_ns() // 1_000_000 if run_at_ms is None else run_at_ms
    return Task(TaskId.new(now), tenant, type_, encode_payload(payload if payload is not None else {}), now,
                priority, attempt, max_attempts)


@dataclass
class EmbeddedRig:
    path: Path
    store: SqliteTaskStore = field(init=False)
    queue: SqliteQueue = field(init=False)
    ledger: SqliteEffectLedger = field(init=False)
    workers: list[tuple[Worker, threading.Thread]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.store = SqliteTaskStore(self.path / "tasks.db")
        self.queue = SqliteQueue(self.path / "queue.db")
        self.ledger = SqliteEffectLedger(self.path / "tasks.db")
        self.sink = apps.Sink(self.path / "sink.db")
        apps._sink = self.sink
        self.publisher = self.queue.publisher()

    def fire(self, tasks: Iterable[Task], *, fence: int = 1, store: bool = True, topic: str | None = None) -> list[Task]:
        """Store the tasks (their home rows) and publish them as a dispatcher would."""
        tasks = list(tasks)
        if store:
            assert not self.store.insert(tasks)
        for item in tasks:
            name = topic or TOPIC_OF[item.priority]
            self.publisher.publish(KAFKA.ready_topic(name), [encode_message(item, fence)])
        self.publisher.flush(10)
        return tasks

    def publish_raw(self, name: str, value: bytes) -> None:
        self.publisher.publish(KAFKA.ready_topic(name), [value])
        self.publisher.flush(10)

    def start(self, app: App = apps.app, *, pool: str = "default", concurrency: int = 4, member: str = "w1",
              store: Any = None, **config: Any) -> Worker:
        """A worker on a thread of its own; `store` (default: the rig's) is the one it
        reads and reports to, e.g. one that holds its writes back."""
        topics = {name: KAFKA.ready_topic(name) for name in POOL_TOPICS[pool]}
        worker = Worker(
            app, WorkerConfig(member=member, pool=pool, topics=topics, dead_letter_topic=KAFKA.dead_letter_topic,
                              concurrency=concurrency, **config),
            consumer_factory=lambda on_revoked: self.queue.consumer(
                KAFKA.worker_group(pool), list(topics.values()), member=member, on_revoked=on_revoked,
                session_timeout_s=2.0),
            store=self.store if store is None else store, publisher=self.publisher,
            handoff=LogHandoff(self.queue.handoff_log(self.store.shard_count), self.store.shard_count),
            ledger=self.ledger,
        )
        thread = threading.Thread(target=worker.run, name=f"worker-{member}", daemon=True)
        thread.start()
        self.workers.append((worker, thread))
        return worker

    def home(self, item: Task) -> StoredTask:
        found = self.store.get(item.id)
        assert found is not None
        return found

    def committed(self, name: str, pool: str = "default") -> int:
        """Messages of ready topic `name` its pool's group committed past, over every partition."""
        topic, group = KAFKA.ready_topic(name), KAFKA.worker_group(pool)
        return sum(self.queue.position(group, topic, p) or 0 for p in range(self.queue.ready_partitions))

    def dead_letters(self) -> list[bytes]:
        return self.queue.read(KAFKA.dead_letter_topic)

    def handoffs(self) -> list[bytes]:
        return self.queue.read(KAFKA.handoff_topic)

    def close(self) -> None:
        for worker, thread in self.workers:
            worker.stop()
            thread.join(30)
            assert not thread.is_alive(), "a worker did not stop"
        self.sink.close()
        self.queue.close()
        self.store.close()


class HeldReports:
    """A store whose `record_status` waits until `release` is set (everything else is
    the wrapped store's): it widens the moment between an attempt's start and its
    reports, as a slow settler or store does."""

    def __init__(self, store: SqliteTaskStore) -> None:
        self._store = store
        self.release = threading.Event()

    def record_status(self, reports: Any) -> None:
        assert self.release.wait(60), "reports held for a minute"
        self._store.record_status(reports)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


def later(item: Task, **changes: Any) -> Task:
    return replace(item, **changes)
