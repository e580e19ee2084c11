"""Against the real Cassandra: the schema applies idempotently (and brings a keyspace
made before a column existed up to date, and finishes when its node stops answering for
a while), a task row round-trips, and the static `fence` column behaves as the fencing
design relies on."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import replace

import pytest

from scheduler.adapters.cassandra import schema
from scheduler.adapters.cassandra.connection import CassandraConnection, connect
from scheduler.adapters.cassandra.effects import CassandraEffectLedger
from scheduler.adapters.cassandra.store import CassandraTaskStore, recorded_created_ms, recorded_shard_count
from scheduler.cli import Exit
from scheduler.errors import SchemaConflict, StoreError
from scheduler.model import Priority, Task, TaskId, encode_payload
from scheduler.ports import StatusReport, TaskStatus
from scheduler.settings import CassandraSettings
from tests.cluster import Cluster, local_status, unique_name
from tests.support import run_cli
from tests.tasks import make_task

TABLES = {"meta", "tasks_by_bucket", "shards", "effects", "schedules", "tenant_limits", "cancel_marks", "cancel_counts",
          "count_hours", "count_minutes", "count_snapshots", "count_snapshot_latest", "processes", "lateness_minutes",
          "workflows"}


def tables_of(cassandra: CassandraConnection, keyspace: str) -> set[str]:
    rows = cassandra.session.execute(
        "SELECT table_name FROM system_schema.tables WHERE keyspace_name = %s", (keyspace,)
    )
    return {row.table_name for row in rows}


def test_schema_apply_is_idempotent_and_records_the_shard_count(
    cassandra: CassandraConnection, keyspace: CassandraSettings
) -> None:
    assert tables_of(cassandra, keyspace.keyspace) == TABLES
    again = schema.apply(cassandra, keyspace)
    assert again.shard_count_recorded_now is False
    assert again.shard_count == 64
    assert tables_of(cassandra, keyspace.keyspace) == TABLES


def test_another_shard_count_for_an_existing_keyspace_is_refused(
    cassandra: CassandraConnection, keyspace: CassandraSettings
) -> None:
    other = CassandraSettings(hosts=keyspace.hosts, port=keyspace.port, keyspace=keyspace.keyspace, shard_count=32)
    with pytest.raises(SchemaConflict, match="created with 64 shards, not 32"):
        schema.apply(cassandra, other)
    row = cassandra.session.execute(f"SELECT value FROM {keyspace.keyspace}.meta WHERE name = 'shard_count'").one()
    assert row.value == "64"


def test_a_task_row_round_trips(cassandra: CassandraConnection, keyspace: CassandraSettings) -> None:
    run_at = 1_796_202_000_250
    task = Task(
        id=TaskId.for_key(run_at, "board", "result-sms-0001"),
        tenant="board",
        type="sms",
        payload=encode_payload({"to": "+919800000001", "text": "Your result is out"}),
        run_at_ms=run_at,
        priority=Priority.HIGH,
        max_attempts=7,
        idempotency_key="result-sms-0001",
    )
    partition = task.partition(64)
    session = cassandra.session
    insert = session.prepare(
        f"INSERT INTO {keyspace.keyspace}.tasks_by_bucket (minute_bucket, shard, run_at, task_id, tenant, type, "
        "priority, payload, attempt, max_attempts, idempotency_key) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
    )
    session.execute(
        insert,
        (partition.minute_bucket, partition.shard, task.run_at_ms, task.id.uuid, task.tenant, task.type,
         task.priority.code, task.payload, task.attempt, task.max_attempts, task.idempotency_key),
    )
    select = session.prepare(
        f"SELECT run_at, task_id, tenant, type, priority, payload, attempt, max_attempts, idempotency_key, status "
        f"FROM {keyspace.keyspace}.tasks_by_bucket WHERE minute_bucket = ? AND shard = ?"
    )
    (row,) = list(session.execute(select, (partition.minute_bucket, partition.shard)))
    read_back = Task(
        id=TaskId.from_uuid(row.task_id), tenant=row.tenant, type=row.type, payload=row.payload,
        run_at_ms=int(row.run_at.timestamp() * 1000), priority=Priority.from_code(row.priority),
        attempt=row.attempt, max_attempts=row.max_attempts, idempotency_key=row.idempotency_key,
    )
    assert read_back == task
    assert row.status is None


def test_the_static_fence_accepts_only_a_first_write_then_higher_or_equal_tokens(
    cassandra: CassandraConnection, keyspace: CassandraSettings
) -> None:
    session = cassandra.session
    table = f"{keyspace.keyspace}.tasks_by_bucket"
    where = "WHERE minute_bucket = 1796202000000 AND shard = 7"

    def fence() -> int | None:
        row = session.execute(f"SELECT fence FROM {table} {where} LIMIT 1").one()
        return None if row is None else row.fence

    # A never-written static column is null and null compares false: the design's first write
    # must use `IF fence = null`.
    assert session.execute(f"UPDATE {table} SET fence = 5 {where} IF fence <= 5").one().applied is False
    assert fence() is None
    assert session.execute(f"UPDATE {table} SET fence = 5 {where} IF fence = null").one().applied is True
    assert session.execute(f"UPDATE {table} SET fence = 6 {where} IF fence = null").one().applied is False
    stale = session.execute(f"UPDATE {table} SET fence = 4 {where} IF fence <= 4").one()
    assert stale.applied is False
    assert stale.fence == 5
    assert fence() == 5
    assert session.execute(f"UPDATE {table} SET fence = 8 {where} IF fence <= 8").one().applied is True
    assert fence() == 8


@pytest.fixture
def spare_keyspace(cassandra: CassandraConnection) -> Iterator[str]:
    name = unique_name("t")
    yield name
    cassandra.session.execute(f"DROP KEYSPACE IF EXISTS {name}")


def test_the_schema_apply_command_is_safe_to_repeat_and_refuses_a_new_shard_count(
    cluster: Cluster, spare_keyspace: str
) -> None:
    env = {
        **os.environ,
        "SCHEDULER_CASSANDRA_HOSTS": ",".join(cluster.cassandra.hosts),
        "SCHEDULER_CASSANDRA_PORT": str(cluster.cassandra.port),
        "SCHEDULER_KEYSPACE": spare_keyspace,
    }

    def apply(*flags: str) -> subprocess.CompletedProcess[str]:
        return run_cli("schema", "apply", *flags, env=env)

    first = apply()
    assert first.returncode == Exit.OK, first.stderr
    assert "64 shards (recorded now)" in first.stdout
    second = apply()
    assert second.returncode == Exit.OK, second.stderr
    assert "64 shards (as recorded before)" in second.stdout
    conflict = apply("--shard-count", "32")
    assert conflict.returncode == Exit.CONFLICT
    assert "created with 64 shards, not 32" in conflict.stderr


def test_a_replication_cassandra_refuses_is_a_failure_not_an_unreachable_server(
    cluster: Cluster, spare_keyspace: str
) -> None:
    result = run_cli(
        "schema", "apply", "--keyspace", spare_keyspace, "--replication", "{'class': 'NoSuchStrategy'}",
        env={**os.environ, "SCHEDULER_CASSANDRA_HOSTS": ",".join(cluster.cassandra.hosts),
             "SCHEDULER_CASSANDRA_PORT": str(cluster.cassandra.port)},
    )
    assert result.returncode == Exit.FAILURE, result.stderr
    assert f"applying the schema to keyspace '{spare_keyspace}' failed" in result.stderr


@pytest.mark.local_cluster
@pytest.mark.timeout(400)  # every statement has the short timeout: on a busy machine, some are asked twice
def test_schema_apply_asks_a_node_again_after_it_stopped_answering_and_finishes(
    cluster: Cluster, cassandra: CassandraConnection, spare_keyspace: str, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The node is paused (SIGSTOP) for longer than a statement may take, as a node of a
    cluster just started can be: the statement times out, is asked again of the same node
    once it answers, and every table is made and the shard count recorded."""
    assert cluster.local
    monkeypatch.setattr(schema, "STATEMENT_TIMEOUT_S", 2.0)
    pid = local_status()["cassandra"]["pid"]
    settings = CassandraSettings(hosts=cluster.cassandra.hosts, port=cluster.cassandra.port, keyspace=spare_keyspace)
    with connect(cluster.cassandra) as connection:
        # A process of its own resumes the node, even if this one dies meanwhile.
        resumer = subprocess.Popen(["sh", "-c", f"kill -STOP {pid} && echo stopped; sleep 5; kill -CONT {pid}"],
                                   stdout=subprocess.PIPE, text=True, start_new_session=True)
        try:
            assert resumer.stdout is not None and resumer.stdout.readline() == "stopped\n"
            with caplog.at_level(logging.WARNING, logger=schema.__name__):
                applied = schema.apply(connection, settings)
        finally:
            os.kill(pid, signal.SIGCONT)
            resumer.communicate(timeout=30)
    # The first statement timed out, and was asked again.
    assert f"'CREATE KEYSPACE IF NOT EXISTS {spare_keyspace}' failed (OperationTimedOut" in caplog.text
    assert tables_of(cassandra, spare_keyspace) == TABLES
    assert applied.shard_count == 64
    assert recorded_shard_count(cassandra, spare_keyspace) == 64
    assert recorded_created_ms(cassandra, spare_keyspace) is not None


def columns_of(cassandra: CassandraConnection, keyspace: str, table: str) -> set[str]:
    rows = cassandra.session.execute(
        "SELECT column_name FROM system_schema.columns WHERE keyspace_name = %s AND table_name = %s", (keyspace, table)
    )
    return {row.column_name for row in rows}


def test_schema_apply_adds_the_error_column_to_a_keyspace_made_before_it(
    cluster: Cluster, cassandra: CassandraConnection, spare_keyspace: str
) -> None:
    settings = CassandraSettings(hosts=cluster.cassandra.hosts, port=cluster.cassandra.port, keyspace=spare_keyspace)
    text = schema.schema_text()
    old_text = text.replace("    last_error      text,", "").replace(
        "ALTER TABLE tasks_by_bucket ADD IF NOT EXISTS last_error text;", ""
    )
    assert "last_error" not in "".join(line.split("--")[0] for line in old_text.splitlines())
    for statement in schema.render(spare_keyspace, settings.replication, old_text):
        cassandra.session.execute(statement)
    assert "last_error" not in columns_of(cassandra, spare_keyspace, "tasks_by_bucket")

    schema.apply(cassandra, settings)
    assert "last_error" in columns_of(cassandra, spare_keyspace, "tasks_by_bucket")
    schema.apply(cassandra, settings)  # and again: nothing to add, no error

    task = make_task()
    store = CassandraTaskStore.open(settings)
    try:
        store.insert([task])
        store.record_status([StatusReport(task.id, 1, TaskStatus.FAILED, error="after the upgrade")])
        assert store.get(task.id).error == "after the upgrade"  # type: ignore[union-attr]
    finally:
        store.close()


def test_schema_apply_adds_the_cost_column_and_rows_written_before_it_cost_1(
    cluster: Cluster, cassandra: CassandraConnection, spare_keyspace: str
) -> None:
    settings = CassandraSettings(hosts=cluster.cassandra.hosts, port=cluster.cassandra.port, keyspace=spare_keyspace)
    old_text = schema.schema_text().replace("    cost            int,", "").replace(
        "ALTER TABLE tasks_by_bucket ADD IF NOT EXISTS cost int;", ""
    )
    for statement in schema.render(spare_keyspace, settings.replication, old_text):
        cassandra.session.execute(statement)
    cassandra.session.execute(
        f"INSERT INTO {spare_keyspace}.meta (name, value) VALUES ('shard_count', '64')"
    )
    assert "cost" not in columns_of(cassandra, spare_keyspace, "tasks_by_bucket")
    with pytest.raises(StoreError, match="cannot prepare.*schema apply"):  # its statements name the column
        CassandraTaskStore.open(settings)
    task = make_task()
    insert = cassandra.session.prepare(  # a row as the store wrote it before tasks had a cost
        f"INSERT INTO {spare_keyspace}.tasks_by_bucket (minute_bucket, shard, run_at, task_id, tenant, type, "
        "priority, payload, attempt, max_attempts) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
    )
    cassandra.session.execute(insert, (
        task.minute_bucket, task.id.shard(64), task.run_at_ms, task.id.uuid, task.tenant, task.type,
        task.priority.code, task.payload, task.attempt, task.max_attempts,
    ))

    schema.apply(cassandra, settings)
    assert "cost" in columns_of(cassandra, spare_keyspace, "tasks_by_bucket")

    costly = replace(make_task(), cost=500)
    store = CassandraTaskStore.open(settings)
    try:
        assert store.get(task.id).task == task  # type: ignore[union-attr]
        assert store.get_many([task.id])[task.id].task.cost == 1
        assert [row.task.cost for row in store.read_partition(task.partition(64)) if row.task.id == task.id] == [1]
        assert store.insert([costly]) == []
        assert store.get(costly.id).task.cost == 500  # type: ignore[union-attr]
    finally:
        store.close()


def test_get_many_and_the_effect_ledger_report_a_failing_server_as_store_errors(
    cassandra: CassandraConnection, keyspace: CassandraSettings
) -> None:
    store = CassandraTaskStore.open(keyspace)
    try:
        ledger = CassandraEffectLedger.for_store(store)
        task = make_task()
        store.insert([task])
        assert set(store.get_many([task.id])) == {task.id}
        cassandra.session.execute(f"DROP TABLE {keyspace.keyspace}.tasks_by_bucket")
        cassandra.session.execute(f"DROP TABLE {keyspace.keyspace}.effects")

        with pytest.raises(StoreError, match="reading tasks failed in 2 of 2 partitions"):
            store.get_many([task.id, TaskId.new(task.run_at_ms + 60_000)])
        with pytest.raises(StoreError, match="effect ledger claim failed"):
            ledger.claim("college", "k", "a", 10)
        with pytest.raises(StoreError, match="schema apply"):
            CassandraEffectLedger.for_store(store)
    finally:
        store.close()
