"""The rows and id lists the Cassandra store packs itself are byte for byte what the
driver binds."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

import pytest
from cassandra.query import UNSET_VALUE, BatchStatement, BatchType, PreparedStatement, Statement
from hypothesis import given
from hypothesis import strategies as st

from scheduler import retention
from scheduler.adapters.cassandra import rows
from scheduler.adapters.cassandra import store as store_module
from scheduler.adapters.cassandra.connection import CassandraConnection
from scheduler.adapters.cassandra.queries import named_queries
from scheduler.adapters.cassandra.store import (
    MAX_ERROR_CHARS,
    CassandraTaskStore,
    bounded_error,
    status_write_timestamp_us,
)
from scheduler.errors import StoreError
from scheduler.model import MAX_ATTEMPTS_LIMIT, MAX_COST, Priority, TaskId, from_ms, minute_bucket
from scheduler.ports import InsertFailure, StatusReport, TaskStatus, report_order
from scheduler.ports.tasks import ORDER_LIMIT
from scheduler.settings import CassandraSettings
from tests.tasks import NINE_OCLOCK_MS, make_task


def test_packed_rows_equal_the_drivers_binding(cassandra: CassandraConnection, keyspace: CassandraSettings) -> None:
    insert = cassandra.session.prepare(named_queries(keyspace.keyspace)["insert_task"])
    rows.check_insert_columns(insert)
    for task in (
        make_task(NINE_OCLOCK_MS + 1234, tenant="कॉलेज", key="order-१७", priority=Priority.LOW, payload={"a": [1, 2]},
                  attempt=3, max_attempts=7),
        make_task(NINE_OCLOCK_MS + 59_999, priority=Priority.HIGH),
        replace(make_task(NINE_OCLOCK_MS + 17), cost=500),
        replace(make_task(NINE_OCLOCK_MS + 18, key="k"), cost=MAX_COST),
    ):
        shard = task.id.shard(64)
        bound = insert.bind((
            task.minute_bucket, shard, task.run_at_ms, task.id.uuid, task.tenant, task.type, task.priority.code,
            task.payload, task.attempt, task.max_attempts, task.idempotency_key if task.idempotency_key else UNSET_VALUE,
            task.cost, 604_860,
        ))
        ttl = rows.packed_ttl(604_860)
        packed = rows.row_values(task, rows.partition_key(task.minute_bucket, shard), ttl)
        assert packed == bound.values
        batch = rows.insert_batch(insert, keyspace.keyspace, rows.partition_key(task.minute_bucket, shard), [task], ttl)
        assert batch.routing_key == bound.routing_key


def test_packed_id_lists_equal_the_drivers_binding(cassandra: CassandraConnection, keyspace: CassandraSettings) -> None:
    read_tasks = cassandra.session.prepare(named_queries(keyspace.keyspace)["read_tasks"])
    for ids in ([], [TaskId.new(NINE_OCLOCK_MS)], [TaskId.new(NINE_OCLOCK_MS + n * 997) for n in range(60)]):
        bound = read_tasks.bind((NINE_OCLOCK_MS, 5, [(task_id.run_at_ms, task_id.uuid) for task_id in ids]))
        assert bound.values[2] == rows.clustering_keys(ids)
        assert bound.values[:2] == list(rows.partition_key(NINE_OCLOCK_MS, 5))


def _reports() -> list[StatusReport]:
    """Reports of every status, attempts up to the limit, errors none, empty, non-ASCII
    and over `MAX_ERROR_CHARS`, two on each of 40 tasks over several partitions. The ids
    are keyed, so the same partitions every run: two of the tasks share one, and its four
    reports take two batches of three."""
    ids = [TaskId.for_key(NINE_OCLOCK_MS + n * 7919, "lab", f"report-{n}") for n in range(40)]
    errors = [None, "", "SMS gateway: नंबर गलत है", "x" * (MAX_ERROR_CHARS + 1), "é" * MAX_ERROR_CHARS]
    records = [None, '{"outcome":"done","worker":"w-1"}', '{"outcome":"failed","error":"नंबर गलत है"}']
    return [
        StatusReport(task_id, 1 + n * 7 % MAX_ATTEMPTS_LIMIT, status, errors[n % len(errors)], records[n % 3])
        for n, (task_id, status) in enumerate(zip(ids * 2, list(TaskStatus) * 14, strict=False))
    ]


def _drivers_binding(set_status: PreparedStatement, report: StatusReport, ttl: int = 3_600) -> Statement:
    """`report` bound the way the store did before it packed status rows itself: the
    driver's `bind` of datetimes, a `UUID` and text (the history cell unset without a record)."""
    task_id = report.task_id
    run_at = task_id.run_at_ms
    bound: Statement = set_status.bind((
        status_write_timestamp_us(task_id, report.attempt, report.status), ttl, report.status.value, report.attempt,
        bounded_error(report.error) or "", report.attempt, UNSET_VALUE if report.record is None else report.record,
        from_ms(minute_bucket(run_at)), task_id.shard(64), from_ms(run_at), task_id.uuid,
    ))
    return bound


def test_packed_status_rows_equal_the_drivers_binding(
    cassandra: CassandraConnection, keyspace: CassandraSettings
) -> None:
    set_status = cassandra.session.prepare(named_queries(keyspace.keyspace)["set_status"])
    rows.check_status_columns(set_status)
    for report in _reports():
        task_id = report.task_id
        bound = _drivers_binding(set_status, report)
        key = rows.partition_key(minute_bucket(task_id.run_at_ms), task_id.shard(64))
        packed = rows.status_values(
            key, task_id, status_write_timestamp_us(task_id, report.attempt, report.status), rows.packed_ttl(3_600),
            report.status,
            report.attempt, bounded_error(report.error) or "", report.record,
        )
        assert packed == bound.values
        assert rows.partition_batch(keyspace.keyspace, key).routing_key == bound.routing_key


def test_status_batches_equal_the_drivers(
    keyspace: CassandraSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`record_status` builds, batch for batch, what adding the driver's bound statements
    to a batch gives: the same rows in the same order, routing, keyspace and type, the
    partitions' reports cut into batches of `batch_rows`."""
    store = CassandraTaskStore.open(keyspace, batch_rows=3)
    try:
        set_status = store._q["set_status"]
        reports = _reports()
        sent: list[Statement] = []

        def capture(requests: Iterable[tuple[Statement, object]]) -> list[InsertFailure]:
            sent.extend(statement for statement, _ in requests)
            return []

        monkeypatch.setattr(store, "_run_all", capture)
        now_ms = NINE_OCLOCK_MS - 3_600_000
        monkeypatch.setattr(store_module, "_now_ms", lambda: now_ms)

        def ttl(report: StatusReport) -> int:
            return retention.ttl_s(minute_bucket(report.task_id.run_at_ms), store.retention_s, now_ms)

        store.record_status(reports)
        groups: dict[tuple[int, int], list[StatusReport]] = {}
        for report in reports:
            home = (minute_bucket(report.task_id.run_at_ms), report.task_id.shard(64))
            groups.setdefault(home, []).append(report)
        expected: list[BatchStatement] = []
        for group in groups.values():
            for start in range(0, len(group), 3):
                batch = BatchStatement(batch_type=BatchType.UNLOGGED)
                for report in group[start:start + 3]:
                    batch.add(_drivers_binding(set_status, report, ttl(report)))
                expected.append(batch)
        assert len(sent) == len(expected) > len(groups)
        for built, wanted in zip(sent, expected, strict=True):
            assert isinstance(built, BatchStatement)
            assert built._statements_and_parameters == wanted._statements_and_parameters
            assert (built.routing_key, built.keyspace, built.batch_type) == (
                wanted.routing_key, wanted.keyspace, wanted.batch_type
            )
    finally:
        store.close()


def test_a_status_statement_of_another_layout_is_refused(
    cassandra: CassandraConnection, keyspace: CassandraSettings
) -> None:
    swapped = named_queries(keyspace.keyspace)["set_status"].replace(
        "status = ?, status_attempt = ?", "status_attempt = ?, status = ?"
    )
    with pytest.raises(StoreError, match="set_status binds .* update rows.py"):
        rows.check_status_columns(cassandra.session.prepare(swapped))


@given(
    run_at_ms=st.integers(0, (1 << 48) - 1),
    attempt=st.integers(0, MAX_ATTEMPTS_LIMIT),
    status=st.sampled_from(TaskStatus),
)
def test_status_write_timestamp_is_the_documented_formula(run_at_ms: int, attempt: int, status: TaskStatus) -> None:
    """The fast form (orders by the status's value) gives what `run_at * 1000 +
    report_order(attempt, status)` gives, within the task's millisecond."""
    task_id = TaskId.new(run_at_ms)
    assert status_write_timestamp_us(task_id, attempt, status) == run_at_ms * 1000 + report_order(attempt, status)
    assert 0 <= report_order(attempt, status) < ORDER_LIMIT <= 1000
