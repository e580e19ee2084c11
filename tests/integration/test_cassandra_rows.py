"""The rows and id lists the Cassandra store packs itself are byte for byte what the
driver binds."""

from __future__ import annotations

from cassandra.query import UNSET_VALUE

from scheduler.adapters.cassandra import rows
from scheduler.adapters.cassandra.connection import CassandraConnection
from scheduler.adapters.cassandra.store import named_queries
from scheduler.model import Priority, TaskId
from scheduler.settings import CassandraSettings
from tests.tasks import NINE_OCLOCK_MS, make_task


def test_packed_rows_equal_the_drivers_binding(cassandra: CassandraConnection, keyspace: CassandraSettings) -> None:
    insert = cassandra.session.prepare(named_queries(keyspace.keyspace)["insert_task"])
    rows.check_insert_columns(insert)
    for task in (
        make_task(NINE_OCLOCK_MS + 1234, tenant="कॉलेज", key="order-१७", priority=Priority.LOW, payload={"a": [1, 2]},
                  attempt=3, max_attempts=7),
        make_task(NINE_OCLOCK_MS + 59_999, priority=Priority.HIGH),
    ):
        shard = task.id.shard(64)
        bound = insert.bind((
            task.minute_bucket, shard, task.run_at_ms, task.id.uuid, task.tenant, task.type, task.priority.code,
            task.payload, task.attempt, task.max_attempts, task.idempotency_key if task.idempotency_key else UNSET_VALUE,
        ))
        packed = rows.row_values(task, rows.partition_key(task.minute_bucket, shard))
        assert packed == bound.values
        batch = rows.insert_batch(insert, keyspace.keyspace, rows.partition_key(task.minute_bucket, shard), [task])
        assert batch.routing_key == bound.routing_key


def test_packed_id_lists_equal_the_drivers_binding(cassandra: CassandraConnection, keyspace: CassandraSettings) -> None:
    read_tasks = cassandra.session.prepare(named_queries(keyspace.keyspace)["read_tasks"])
    for ids in ([], [TaskId.new(NINE_OCLOCK_MS)], [TaskId.new(NINE_OCLOCK_MS + n * 997) for n in range(60)]):
        bound = read_tasks.bind((NINE_OCLOCK_MS, 5, [(task_id.run_at_ms, task_id.uuid) for task_id in ids]))
        assert bound.values[2] == rows.clustering_keys(ids)
        assert bound.values[:2] == list(rows.partition_key(NINE_OCLOCK_MS, 5))
