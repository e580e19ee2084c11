"""The producer SDK and the task commands against the real Cassandra."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

from scheduler.adapters.cassandra.connection import CassandraConnection
from scheduler.adapters.cassandra.store import CassandraTaskStore
from scheduler.cli import Exit
from scheduler.model import Partition, decode_payload, from_ms
from scheduler.ports import CancelOutcome, TaskStatus
from scheduler.producer import Client, Submission
from scheduler.settings import CassandraSettings
from tests.support import run_cli
from tests.tasks import NINE_OCLOCK_MS


@pytest.fixture
def store(keyspace: CassandraSettings) -> Iterator[CassandraTaskStore]:
    opened = CassandraTaskStore.open(keyspace, batch_rows=50, max_in_flight=8)
    yield opened
    opened.close()


def test_a_submitted_task_is_readable_by_bucket_and_by_id(store: CassandraTaskStore) -> None:
    client = Client(store, tenant="board")
    task_id = client.submit("sms", {"to": "+919800000001"}, delay=timedelta(hours=1), priority="high")

    by_id = client.get(task_id)
    assert by_id is not None and by_id.status is TaskStatus.SCHEDULED
    bucket = task_id.run_at_ms - task_id.run_at_ms % 60_000
    by_bucket = list(store.read_partition(Partition(bucket, task_id.shard(store.shard_count))))
    assert [stored.task for stored in by_bucket] == [by_id.task]
    assert decode_payload(by_bucket[0].task.payload) == {"to": "+919800000001"}


def test_a_retried_idempotent_submit_yields_one_task(
    store: CassandraTaskStore, keyspace: CassandraSettings, cassandra: CassandraConnection
) -> None:
    run_at = from_ms(NINE_OCLOCK_MS + 86_400_000)
    ids = {
        Client(store, tenant="shop", now_ms=lambda: NINE_OCLOCK_MS).submit(
            "cancel_hold", {"order": 9}, run_at=run_at, idempotency_key="order-9"
        )
        for _ in range(3)
    }
    assert len(ids) == 1
    (task_id,) = ids
    rows = cassandra.session.execute(
        f"SELECT task_id FROM {keyspace.keyspace}.tasks_by_bucket WHERE minute_bucket = %s AND shard = %s",
        (from_ms(task_id.run_at_ms - task_id.run_at_ms % 60_000), task_id.shard(store.shard_count)),
    ).all()
    assert [row.task_id for row in rows] == [task_id.uuid]


def test_a_cross_tenant_cancel_is_refused(store: CassandraTaskStore) -> None:
    client = Client(store)
    task_id = client.submit("reminder", tenant="college", delay=600)
    assert client.cancel(task_id, "board") is CancelOutcome.NOT_FOUND
    assert client.get(task_id).status is TaskStatus.SCHEDULED  # type: ignore[union-attr]
    assert client.cancel(task_id, "college") is CancelOutcome.CANCELLED
    assert client.get(task_id).status is TaskStatus.CANCELLED  # type: ignore[union-attr]


def test_an_invalid_item_in_submit_many_is_reported_and_the_rest_accounted_for(store: CassandraTaskStore) -> None:
    run_at = from_ms(NINE_OCLOCK_MS + 86_400_000)
    items: list[Any] = [Submission(type="sms", payload={"n": n}, run_at=run_at) for n in range(1200)]
    items[17] = Submission(type="sms", payload={"n": 17}, priority="urgent")
    items[900] = {"type": "sms", "payload": object()}
    report = Client(store, tenant="board", chunk_size=500, now_ms=lambda: NINE_OCLOCK_MS).submit_many(items)

    assert [error.index for error in report.rejected] == [17, 900]
    assert (report.consumed, report.stored, report.failed, report.stopped_early) == (1200, 1198, [], False)
    assert report.ids is not None
    stored = {task_id for task_id in report.ids if task_id}
    assert len(stored) == 1198
    bucket = NINE_OCLOCK_MS + 86_400_000
    in_store = {
        row.task.id for shard in range(store.shard_count) for row in store.read_partition(Partition(bucket, shard))
    }
    assert in_store == stored


def test_the_task_commands_work_on_the_cassandra_backend(keyspace: CassandraSettings) -> None:
    env = {
        **os.environ,
        "SCHEDULER_BACKEND": "cassandra",
        "SCHEDULER_CASSANDRA_HOSTS": ",".join(keyspace.hosts),
        "SCHEDULER_CASSANDRA_PORT": str(keyspace.port),
        "SCHEDULER_KEYSPACE": keyspace.keyspace,
    }
    submitted = run_cli("submit", "sms", "--tenant", "college", "--payload", '{"n": 1}', "--delay", "1h", env=env)
    assert submitted.returncode == Exit.OK, submitted.stderr
    task_id = submitted.stdout.strip()
    shown = json.loads(run_cli("get", task_id, "--json", env=env).stdout)
    assert (shown["id"], shown["tenant"], shown["payload"]) == (task_id, "college", {"n": 1})
    assert run_cli("cancel", task_id, "--tenant", "college", env=env).returncode == Exit.OK
    assert json.loads(run_cli("get", task_id, "--json", env=env).stdout)["status"] == "cancelled"


def test_a_keyspace_without_the_schema_is_a_clear_error(keyspace: CassandraSettings) -> None:
    env = {**os.environ, "SCHEDULER_BACKEND": "cassandra", "SCHEDULER_CASSANDRA_HOSTS": ",".join(keyspace.hosts),
           "SCHEDULER_CASSANDRA_PORT": str(keyspace.port), "SCHEDULER_KEYSPACE": "never_created"}
    result = run_cli("get", "01a23a40-6938-7c1e-b140-6ae8a9860617", env=env)
    assert result.returncode == Exit.FAILURE
    assert "run `scheduler schema apply`" in result.stderr
