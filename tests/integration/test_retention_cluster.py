"""Retention on the real Cassandra (`scheduler.retention`): the command that sets it, the
TTL every write carries, and a task run by a real dispatcher and worker that is gone
after a short retention while a task not yet due, and a cancelled one, are kept."""

from __future__ import annotations

import os
import time
from datetime import timedelta

import pytest

from scheduler import retention
from scheduler.adapters.cassandra import schema
from scheduler.adapters.cassandra.connection import CassandraConnection
from scheduler.adapters.cassandra.store import CassandraTaskStore
from scheduler.model import BUCKET_MS, TaskId, minute_bucket
from scheduler.ports import CancelOutcome, HomeStatus, StatusReport, TaskStatus
from scheduler.settings import CassandraSettings
from tests.dispatchers import Deployment
from tests.readme import check_retention_commands
from tests.support import run_cli, wait_until
from tests.tasks import make_task
from tests.workers import Workers


def _env(keyspace: CassandraSettings) -> dict[str, str]:
    return {**os.environ, "SCHEDULER_BACKEND": "cassandra", "SCHEDULER_CASSANDRA_HOSTS": ",".join(keyspace.hosts),
            "SCHEDULER_CASSANDRA_PORT": str(keyspace.port), "SCHEDULER_KEYSPACE": keyspace.keyspace}


def _ttls(cassandra: CassandraConnection, keyspace: str, task_id: TaskId) -> tuple[int | None, int | None]:
    """TTL(payload), TTL(status) of the task's home row (None: no TTL, or no such cell)."""
    row = cassandra.session.execute(
        f"SELECT TTL(payload), TTL(status) FROM {keyspace}.tasks_by_bucket "
        "WHERE minute_bucket = %s AND shard = %s AND run_at = %s AND task_id = %s",
        (minute_bucket(task_id.run_at_ms), task_id.shard(64), task_id.run_at_ms, task_id.uuid),
    ).one()
    assert row is not None, f"no row for {task_id}"
    return row[0], row[1]


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def test_the_retention_command_shows_sets_and_refuses_bad_values(keyspace: CassandraSettings) -> None:
    env = _env(keyspace)
    shown = run_cli("retention", "show", env=env)
    assert (shown.returncode, shown.stdout.strip()) == (0, "7d"), shown.stderr
    for bad, reason in (("0", "too short"), ("59", "too short"), ("30s", "too short"), ("1m", "too short"), ("59m", "too short"), ("3651d", "too long"),
                        ("soon", "not a retention"), ("7x", "not a retention"), ("1.5d", "not a retention"), ("5 m", "not a retention")):
        refused = run_cli("retention", "set", bad, env=env)
        assert refused.returncode == 2, (bad, refused.stdout, refused.stderr)
        assert reason in refused.stderr, (bad, refused.stderr)
    assert run_cli("retention", "show", env=env).stdout.strip() == "7d"  # nothing was written
    changed = run_cli("retention", "set", "1d12h", env=env)
    assert (changed.returncode, changed.stdout.strip()) == (0, "retention 1d12h (was 7d)"), changed.stderr
    assert run_cli("retention", "show", "--json", env=env).stdout.strip() == '{"retention_s": 129600}'
    store = CassandraTaskStore.open(keyspace)
    try:
        assert store.retention_s == 129_600
    finally:
        store.close()


def test_every_write_carries_the_ttl_that_ends_with_its_partition(
    keyspace: CassandraSettings, cassandra: CassandraConnection
) -> None:
    store = CassandraTaskStore.open(keyspace)
    try:
        store.set_retention(86_400)
        now = _now_ms()
        future = make_task(now + 3_600_000)
        late = make_task(now - 10 * BUCKET_MS)  # written ten minutes after its minute
        far = make_task(2_240_000_000_000)  # 2040: past the 32-bit expiry Cassandra 5.0 keeps by default
        cancelled = make_task(now + 1_800_000)
        assert store.insert([future, late, far, cancelled]) == []

        payload_ttl, status_ttl = _ttls(cassandra, keyspace.keyspace, future.id)
        expected = (minute_bucket(future.run_at_ms) + BUCKET_MS + 86_400_000 - now) / 1000
        assert status_ttl is None
        assert payload_ttl is not None and expected - 30 <= payload_ttl <= expected + 1
        # Late: kept the retention from the write, not from its minute (long gone by then).
        payload_ttl, _ = _ttls(cassandra, keyspace.keyspace, late.id)
        assert payload_ttl is not None and 86_400 - 30 <= payload_ttl <= 86_400
        assert _ttls(cassandra, keyspace.keyspace, far.id) == (None, None)  # kept, never refused

        store.record_status([StatusReport(future.id, 1, TaskStatus.DONE), StatusReport(far.id, 1, TaskStatus.DONE)])
        payload_ttl, status_ttl = _ttls(cassandra, keyspace.keyspace, future.id)
        assert status_ttl is not None and payload_ttl is not None and abs(status_ttl - payload_ttl) <= 30
        assert store.get(far.id).status is TaskStatus.DONE  # type: ignore[union-attr]

        # A cancel keeps the whole row at least as long as a retry it stops may wait.
        assert store.cancel(cancelled.id, cancelled.tenant) is CancelOutcome.CANCELLED
        payload_ttl, status_ttl = _ttls(cassandra, keyspace.keyspace, cancelled.id)
        assert payload_ttl is not None and payload_ttl >= retention.cancel_kept_s(86_400) - 30
        assert status_ttl is not None and status_ttl >= retention.cancel_kept_s(86_400) - 30
        stored = store.get(cancelled.id)
        assert stored is not None and stored.status is TaskStatus.CANCELLED and stored.task == cancelled

        # The fence of a partition ends with it too.
        partition = future.partition(64)
        assert store.write_fenced(partition, 7, []) is True
        row = cassandra.session.execute(
            f"SELECT TTL(fence) FROM {keyspace.keyspace}.tasks_by_bucket WHERE minute_bucket = %s AND shard = %s",
            (partition.minute_bucket, partition.shard),
        ).one()
        assert row[0] is not None and row[0] > 86_400
    finally:
        store.close()


@pytest.mark.timeout(300)
def test_a_finished_task_is_gone_after_a_short_retention_and_one_not_yet_due_is_kept(
    deployment: Deployment, workers: Workers, cassandra: CassandraConnection
) -> None:
    """With a 1-minute retention, a task run by a real dispatcher and worker is removed
    within two minutes of its report; a task due in an hour and a cancelled one are not,
    and `scheduler get` says why the finished one is not found."""
    deployment.store.set_retention(60)  # before the processes open the store: they read it then
    deployment.fleet.start("d1")
    worker = workers.start("w1")
    workers.wait_started(worker)
    client = deployment.client
    finished = client.submit("sms", {"mode": "ok"}, delay=timedelta(seconds=1))
    later = client.submit("sms", {"mode": "ok"}, delay=timedelta(hours=1))
    stopped = client.submit("sms", {"mode": "ok"}, delay=timedelta(minutes=30))
    assert client.cancel(stopped) is CancelOutcome.CANCELLED

    def done() -> bool:
        stored = client.get(finished)
        return stored is not None and stored.status is TaskStatus.DONE

    wait_until(done, timeout_s=60, what="the task to run and report done")
    done_at = _now_ms()
    assert client.expired(finished) is False
    wait_until(lambda: client.get(finished) is None, timeout_s=150, what="the finished task's rows to expire")
    gone_after_s = (_now_ms() - done_at) / 1000
    # Kept the retention after its minute or its report, whichever is later: at least 1 min.
    assert gone_after_s >= 55, gone_after_s

    def row() -> object:
        return cassandra.session.execute(
            f"SELECT * FROM {deployment.cassandra.keyspace}.tasks_by_bucket "
            "WHERE minute_bucket = %s AND shard = %s AND run_at = %s AND task_id = %s",
            (minute_bucket(finished.run_at_ms), finished.shard(64), finished.run_at_ms, finished.uuid),
        ).one()

    # No cell of it is left, status and history included (a report after the task's minute
    # ended outlives its other cells by the difference: seconds here).
    wait_until(lambda: row() is None, timeout_s=60, what="the finished task's status cells to expire")
    assert client.expired(finished) is True
    shown = run_cli("get", str(finished), env={**os.environ, **deployment.fleet.env})
    assert shown.returncode == 1
    assert f"no task with id {finished}" in shown.stderr and "it has expired" in shown.stderr, shown.stderr

    kept = client.get(later)
    assert kept is not None and kept.status is TaskStatus.SCHEDULED
    cancelled = client.get(stopped)
    assert cancelled is not None and cancelled.status is TaskStatus.CANCELLED


def test_the_readmes_retention_commands_run_as_written(keyspace: CassandraSettings) -> None:
    check_retention_commands(_env(keyspace))


def test_a_cancel_outliving_its_tasks_fields_still_stops_its_retries(
    keyspace: CassandraSettings, cassandra: CassandraConnection
) -> None:
    """A task written again after its cancel (a keyed resubmit) gives its fields a shorter
    TTL than the cancel's; once they expire the row holds only the cancel, which the
    worker's home-row check must still see."""
    store = CassandraTaskStore.open(keyspace)
    try:
        task = make_task(_now_ms() + 3_600_000, key="order-17")
        assert store.insert([task]) == []
        assert store.cancel(task.id, task.tenant) is CancelOutcome.CANCELLED
        # The task's fields written again with a TTL of a second, as a shorter-lived write would.
        cassandra.session.execute(
            f"UPDATE {keyspace.keyspace}.tasks_by_bucket USING TTL 1 SET tenant = %s, attempt = 1 "
            "WHERE minute_bucket = %s AND shard = %s AND run_at = %s AND task_id = %s",
            (task.tenant, minute_bucket(task.run_at_ms), task.id.shard(64), task.run_at_ms, task.id.uuid),
        )
        wait_until(lambda: store.get(task.id) is None, timeout_s=10, what="the task's fields to expire")
        assert store.statuses([task.id]) == {task.id: HomeStatus(TaskStatus.CANCELLED, 1)}
    finally:
        store.close()


def test_schema_apply_gives_the_task_table_a_short_gc_grace_also_on_an_existing_keyspace(
    keyspace: CassandraSettings, cassandra: CassandraConnection
) -> None:
    def gc_grace() -> int:
        row = cassandra.session.execute(
            "SELECT gc_grace_seconds, compaction FROM system_schema.tables "
            "WHERE keyspace_name = %s AND table_name = 'tasks_by_bucket'", (keyspace.keyspace,)).one()
        assert row.compaction["class"].endswith("SizeTieredCompactionStrategy")
        return int(row.gc_grace_seconds)

    assert gc_grace() == 10_800
    cassandra.session.execute(f"ALTER TABLE {keyspace.keyspace}.tasks_by_bucket WITH gc_grace_seconds = 864000")
    schema.apply(cassandra, keyspace)  # as on a keyspace made before the option
    assert gc_grace() == 10_800
