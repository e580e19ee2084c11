"""The dispatcher's purge (`scheduler.dispatcher.purge`) on the embedded backend's real
files, in this process, on a manual clock (tests/dispatcher_rig.py): the holder of shard
0 deletes what is past its retention, a bounded number of rows a pass, sooner again
while more is left; a failing purger is counted and tried again, never fatal."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from scheduler.adapters.embedded.queue import SqliteQueue
from scheduler.adapters.embedded.store import SqliteTaskStore
from scheduler.dispatcher.purge import AGAIN_S, CHECK_S, INTERVAL_S, PurgePass
from scheduler.errors import StoreError
from scheduler.model import Task
from scheduler.ports import StatusReport, TaskStatus
from tests.dispatcher_rig import KAFKA, SHARDS, ManualClock, Rig, SecondsClock, task_in
from tests.support import wait_until
from tests.tasks import NINE_OCLOCK_MS

pytestmark = pytest.mark.timeout(60)

DAY_MS = 86_400_000
NOW = NINE_OCLOCK_MS + 8 * DAY_MS
"""A day after the nine o'clock partitions expired (7 days' retention)."""
READY = KAFKA.ready_topic("normal")


@pytest.fixture
def files(tmp_path: Path) -> Iterator[tuple[SqliteTaskStore, SqliteQueue]]:
    # Written a minute before nine: on time, so kept until their minute plus the retention.
    store = SqliteTaskStore(tmp_path / "tasks.db", shard_count=SHARDS, clock_ms=lambda: NINE_OCLOCK_MS - 60_000)
    queue = SqliteQueue(tmp_path / "queue.db", handoff_topic=KAFKA.handoff_topic)
    try:
        yield store, queue
    finally:
        queue.close()
        store.close()


def seed(store: SqliteTaskStore, queue: SqliteQueue) -> tuple[list[Task], Task]:
    """Every shard's cursor just behind `NOW` (nothing for the rig to catch up on); 20
    finished tasks at nine o'clock, 5 a shard; one task due tomorrow; three messages
    published at nine o'clock."""
    for shard in range(SHARDS):
        assert store.take_shard(shard, "gone", 0) and store.advance_shard(shard, 0, NOW - 1)
    old = [task_in(shard, NINE_OCLOCK_MS + 1_000 * n) for shard in range(SHARDS) for n in range(5)]
    future = task_in(2, NOW + DAY_MS)
    assert store.insert([*old, future]) == []
    store.record_status([StatusReport(task.id, 1, TaskStatus.DONE) for task in old])
    queue.write([(READY, 0, [b"m0", b"m1", b"m2"])], stamps=[NINE_OCLOCK_MS])
    return old, future


def rig_on(tmp_path: Path, store: SqliteTaskStore, queue: SqliteQueue, **config: Any) -> Rig:
    rig = Rig(tmp_path, "a", ManualClock(NOW), SecondsClock(1_000.0), store=store,
              purgers={"task store": store.purge_expired, "queue": queue.purge_expired}, **config)
    rig.take()
    return rig


def test_the_holder_of_shard_0_purges_the_task_store_and_the_queue_on_its_clock(
    tmp_path: Path, files: tuple[SqliteTaskStore, SqliteQueue],
) -> None:
    store, queue = files
    old, future = seed(store, queue)
    rig = rig_on(tmp_path, store, queue)
    try:
        assert 0 in rig.dispatcher.shards
        purge = rig.dispatcher.purge
        assert purge is not None

        assert purge.run_once() == INTERVAL_S  # nothing more left: the next pass in a minute

        assert store.get_many([task.id for task in old]) == {}
        assert store.get(future.id) is not None
        assert queue.read_from(READY, 0, 0, 10) == [(2, b"m2")]  # the partition's last message stays
        assert rig.dispatcher.stats.rows_purged == 22
        assert rig.dispatcher.stats.purge_failures == 0
    finally:
        rig.close()


def test_passes_come_sooner_while_more_is_left_and_each_deletes_at_most_its_rows(
    tmp_path: Path, files: tuple[SqliteTaskStore, SqliteQueue],
) -> None:
    store, queue = files
    seed(store, queue)
    rig = rig_on(tmp_path, store, queue)
    try:
        purge = PurgePass(rig.dispatcher.ctx, {"task store": store.purge_expired}, rows=8)
        counts = []
        waits = []
        for _ in range(3):
            waits.append(purge.run_once())
            counts.append(store.count())
        assert counts == [13, 5, 1]
        assert waits == [AGAIN_S, AGAIN_S, INTERVAL_S]
    finally:
        rig.close()


def test_a_dispatcher_without_shard_0_purges_nothing(tmp_path: Path,
                                                     files: tuple[SqliteTaskStore, SqliteQueue]) -> None:
    store, queue = files
    seed(store, queue)
    rig = rig_on(tmp_path, store, queue, shards=[1, 2, 3])
    try:
        assert sorted(rig.dispatcher.shards) == [1, 2, 3]
        purge = rig.dispatcher.purge
        assert purge is not None

        assert purge.run_once() == CHECK_S

        assert store.count() == 21
        assert len(queue.read_from(READY, 0, 0, 10)) == 3
        assert rig.dispatcher.stats.rows_purged == 0
    finally:
        rig.close()


def test_a_failing_purge_is_counted_and_tried_again_and_the_others_still_run(
    tmp_path: Path, files: tuple[SqliteTaskStore, SqliteQueue], caplog: pytest.LogCaptureFixture,
) -> None:
    store, queue = files
    seed(store, queue)
    failures = [StoreError("database is locked"), RuntimeError("a bug")]

    def flaky_queue(now_ms: int, limit: int) -> int:
        if failures:
            raise failures.pop(0)
        return queue.purge_expired(now_ms, limit)

    rig = rig_on(tmp_path, store, queue)
    try:
        purge = PurgePass(rig.dispatcher.ctx, {"queue": flaky_queue, "task store": store.purge_expired})
        stats = rig.dispatcher.stats
        with caplog.at_level(logging.WARNING, logger="scheduler.dispatcher.purge"):
            assert purge.run_once() == INTERVAL_S
        assert stats.purge_failures == 1
        assert "purging the expired rows of the queue failed: database is locked" in caplog.text
        assert store.count() == 1  # the task store's purge ran all the same
        assert len(queue.read_from(READY, 0, 0, 10)) == 3

        assert purge.run_once() == INTERVAL_S  # an unexpected error: logged, not raised
        assert stats.job_errors == 1 and stats.purge_failures == 1

        purge.run_once()
        assert queue.read_from(READY, 0, 0, 10) == [(2, b"m2")]
        assert stats.rows_purged == 22
    finally:
        rig.close()


def test_the_purge_thread_runs_passes_by_itself_and_ends_with_the_dispatcher(
    tmp_path: Path, files: tuple[SqliteTaskStore, SqliteQueue],
) -> None:
    store, queue = files
    old, future = seed(store, queue)
    rig = rig_on(tmp_path, store, queue)
    try:
        purge = PurgePass(rig.dispatcher.ctx, {"task store": store.purge_expired}, rows=3,
                          interval_s=0.05, again_s=0.05, check_s=0.05)
        purge.start()
        wait_until(lambda: store.count() == 1, timeout_s=20, what="the purge thread to delete the old rows")
        assert store.get(future.id) is not None
        rig.dispatcher.ctx.stopping.set()
        purge.stop()
        assert purge._thread is not None and not purge._thread.is_alive()
    finally:
        rig.close()
