"""`scheduler dispatcher` on the embedded backend purges what is past its retention: the
store's shortest retention set, finished tasks of a minute long gone and week-old
messages are deleted by the process that holds shard 0, while a task due later stays."""

from __future__ import annotations

import time
from contextlib import closing
from pathlib import Path

import pytest

from scheduler.adapters.embedded.queue import SqliteQueue
from scheduler.adapters.embedded.store import SqliteTaskStore
from scheduler.model import BUCKET_MS, minute_bucket
from scheduler.ports import StatusReport, TaskStatus
from scheduler.retention import MIN_RETENTION_S
from scheduler.settings import KafkaSettings
from tests.dispatchers import Fleet
from tests.support import wait_until
from tests.tasks import in_partition, make_task
from tests.workers import Workers

pytestmark = pytest.mark.timeout(180)

READY = KafkaSettings().ready_topic("low")
WEEK_MS = 7 * 86_400_000


def test_the_dispatcher_purges_expired_tasks_and_messages(embedded: tuple[Fleet, Workers], tmp_path: Path) -> None:
    fleet, _workers = embedded
    db = tmp_path / "db" / "tasks.db"
    now = time.time_ns() // 1_000_000
    gone_bucket = minute_bucket(now) - 10 * BUCKET_MS  # expired 8 minutes ago with a minute's retention
    # The rows are written as they were then, on time: kept until their minute plus the retention.
    with closing(SqliteTaskStore(db, clock_ms=lambda: gone_bucket)) as store, \
            closing(SqliteQueue(db.with_name("queue.db"))) as queue:
        store.set_retention(MIN_RETENTION_S)
        old = in_partition(store.shard_count, gone_bucket, 0, 3) + in_partition(store.shard_count, gone_bucket, 9, 2)
        later = make_task(now + 3_600_000)
        assert store.insert([*old, later]) == []
        store.record_status([StatusReport(task.id, 1, TaskStatus.DONE) for task in old])
        queue.write([(READY, 0, [b"a", b"b", b"c"])], stamps=[now - WEEK_MS - 60_000])

        dispatcher = fleet.start("a")
        wait_until(lambda: store.count() == 1 and len(queue.read_from(READY, 0, 0, 10)) == 1, timeout_s=130,
                   what="the dispatcher to purge the expired rows")
        assert store.get(later.id) is not None
        assert queue.read_from(READY, 0, 0, 10) == [(2, b"c")]
        wait_until(lambda: dispatcher.stats().get("stats", {}).get("rows_purged") == 7, timeout_s=10,
                   what="the stats file to count the purged rows")
        assert dispatcher.alive()
