"""The dispatcher on the embedded backend: SQLite store, SQLite log, SQLite coordinator,
as real processes on one machine with no servers. Two dispatchers share the shards; one
is killed with SIGKILL and the other takes its shards over; nothing is lost and a
cancelled task never fires."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from scheduler.adapters.embedded.queue import SqliteQueue
from scheduler.adapters.embedded.store import SqliteTaskStore
from scheduler.handoff import LogHandoff
from scheduler.model import TaskId, decode_message, from_ms
from scheduler.producer import Client
from scheduler.settings import READY_TOPICS, KafkaSettings
from tests.dispatchers import Fleet
from tests.support import wait_until

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def embedded(tmp_path: Path) -> Iterator[tuple[Client, SqliteQueue, Fleet]]:
    db = tmp_path / "tasks.db"
    store = SqliteTaskStore(db)
    queue = SqliteQueue(db.with_name("queue.db"))
    client = Client(store, tenant="college", handoff=LogHandoff(queue.handoff_log(store.shard_count)))
    fleet = Fleet({"SCHEDULER_BACKEND": "embedded", "SCHEDULER_DB": str(db), "SCHEDULER_LEASE_TIMEOUT_S": "2"},
                  tmp_path)
    try:
        yield client, queue, fleet
    finally:
        fleet.stop_all()
        queue.close()
        store.close()


def published(queue: SqliteQueue) -> list[TaskId]:
    settings = KafkaSettings()
    return [decode_message(value).task.id for name in READY_TOPICS for value in queue.read(settings.ready_topic(name))]


def test_two_embedded_dispatchers_share_the_shards_and_survive_a_kill(
    embedded: tuple[Client, SqliteQueue, Fleet],
) -> None:
    client, queue, fleet = embedded
    now = time.time_ns() // 1_000_000
    stored_first = [client.submit("sms", {"n": n}, run_at=from_ms(now + 6_000 + n * 20)) for n in range(200)]
    a = fleet.start("a")
    fleet.start("b")
    fleet.wait_for_split({"a": 32, "b": 32}, timeout_s=60)
    now = time.time_ns() // 1_000_000
    handed = [client.submit("sms", {"n": n}, run_at=from_ms(now + 1_000 + n * 50)) for n in range(200)]
    doomed = client.submit("sms", {}, run_at=from_ms(now + 8_000))
    assert client.cancel(doomed).value == "cancelled"
    wait_until(lambda: len(set(published(queue))) >= 50, timeout_s=30, what="some tasks to fire")
    a.signal(signal.SIGKILL)

    expected = set(stored_first) | set(handed)
    wait_until(lambda: expected <= set(published(queue)), timeout_s=60,
               what=f"{len(expected - set(published(queue)))} tasks to fire")
    fleet.wait_for_split({"b": 64}, timeout_s=30)
    wait_until(lambda: time.time_ns() // 1_000_000 > now + 9_000, timeout_s=30, what="the cancelled task's time")
    assert doomed not in published(queue)
