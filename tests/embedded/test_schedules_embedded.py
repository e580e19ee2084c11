"""A recurring schedule on the embedded backend: added with `scheduler schedule add`, its
next minute's run is created by a real `scheduler dispatcher` process and fired once; a
file made before schedules counted skipped slots gets the columns when opened."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest

from scheduler.adapters.embedded.queue import SqliteQueue
from scheduler.adapters.embedded.schedules import SCHEMA, SqliteScheduleStore
from scheduler.adapters.embedded.store import SqliteTaskStore
from scheduler.cli import Exit
from scheduler.model import TaskId, decode_message
from scheduler.recurring.schedule import run_key, schedule_id, schedule_shard
from scheduler.settings import READY_TOPICS, KafkaSettings
from tests.dispatchers import Fleet
from tests.support import run_cli, wait_until

pytestmark = pytest.mark.timeout(180)


def test_a_minutely_schedule_fires_its_next_slot_once(tmp_path: Path) -> None:
    db = tmp_path / "tasks.db"
    env = {"SCHEDULER_BACKEND": "embedded", "SCHEDULER_DB": str(db), "SCHEDULER_LEASE_TIMEOUT_S": "2"}
    added = run_cli("schedule", "add", "tick", "--tenant", "college", "--cron", "* * * * *", "--zone", "UTC",
                    "--type", "ping", env={**os.environ, **env})
    assert added.returncode == Exit.OK, added.stderr
    store, schedules = SqliteTaskStore(db), SqliteScheduleStore(db)
    queue = SqliteQueue(db.with_name("queue.db"))
    fleet = Fleet(env, tmp_path)
    try:
        schedule = schedules.get(schedule_id("college", "tick"))
        assert schedule is not None
        slot = schedule.next_slot_ms
        run = TaskId.for_key(slot, "college", run_key(schedule.id, slot))
        fleet.start("a")
        settings = KafkaSettings()

        def published() -> list[TaskId]:
            return [decode_message(value).task.id for name in READY_TOPICS
                    for value in queue.read(settings.ready_topic(name))]

        wait_until(lambda: run in published(), timeout_s=90, what="the run of the next minute to fire")
        fleet.stop_all()  # then count: a repeat published after the first would be there too
        assert published().count(run) == 1
        stored = store.get(run)
        assert stored is not None and stored.task.type == "ping" and stored.task.run_at_ms == slot
        advanced = schedules.get(schedule.id)
        assert advanced is not None and advanced.next_slot_ms > slot
    finally:
        fleet.stop_all()
        queue.close()
        schedules.close()
        store.close()


def test_a_file_made_before_skipped_slots_were_counted_gets_the_columns(tmp_path: Path) -> None:
    db = tmp_path / "tasks.db"
    old = "\n".join(line for line in SCHEMA.splitlines() if "skipped" not in line)
    with sqlite3.connect(db) as opened:
        opened.executescript(old)
        made = schedule_id("college", "old")
        opened.execute("INSERT INTO schedules VALUES (?, ?, 'college', 'old', '0 * * * *', 'UTC', 'report', ?, 1, 3, "
                       "'once', 60, 0, 1790000000000, 0, 1789000000000)", (schedule_shard(made, 64), made.bytes,
                                                                           b"\xc0"))
    schedules = SqliteScheduleStore(db)
    try:
        stored = schedules.get(schedule_id("college", "old"))
        assert stored is not None and (stored.skipped, stored.last_skipped_ms) == (0, None)
    finally:
        schedules.close()
    SqliteScheduleStore(db).close()  # opened again: nothing to add, no error
