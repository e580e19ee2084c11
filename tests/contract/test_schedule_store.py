"""The `ScheduleStore` contract (`scheduler.ports`), run against every adapter: the
embedded SQLite store (in the task store's file) and the Cassandra store on the real
server (fresh keyspace, on the task store's session)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from scheduler.adapters.embedded.schedules import SqliteScheduleStore
from scheduler.adapters.embedded.store import SqliteTaskStore
from scheduler.model import Priority
from scheduler.ports import AdvanceOutcome, ScheduleStore
from scheduler.recurring.schedule import MisfirePolicy, Schedule, new_schedule, schedule_id
from tests.support import all_at_once

pytestmark = pytest.mark.timeout(120)

NOW_MS = 1_790_000_000_000  # 2026-09-21T...Z


@pytest.fixture(params=["sqlite", pytest.param("cassandra", marks=pytest.mark.integration)])
def schedules(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ScheduleStore]:
    if request.param == "sqlite":
        tasks = SqliteTaskStore(tmp_path / "tasks.db")
        store: ScheduleStore = SqliteScheduleStore(tmp_path / "tasks.db")
        close = tasks.close
    else:
        from scheduler.adapters.cassandra.schedules import CassandraScheduleStore
        from scheduler.adapters.cassandra.store import CassandraTaskStore

        cassandra = CassandraTaskStore.open(request.getfixturevalue("keyspace"))
        store = CassandraScheduleStore.for_store(cassandra)
        close = cassandra.close
    try:
        yield store
    finally:
        store.close()
        close()


def make(name: str = "nightly", tenant: str = "college", **changes: object) -> Schedule:
    options: dict[str, object] = {
        "cron": "0 2 * * *", "zone": "Asia/Kolkata", "type": "report", "payload": {"kind": "daily"},
        "priority": "high", "max_attempts": 5, "misfire": "all", "grace_s": 120, "jitter_s": 30,
    }
    options.update(changes)
    return new_schedule(tenant=tenant, name=name, now_ms=NOW_MS, **options)  # type: ignore[arg-type]


def test_a_schedule_reads_back_as_stored_and_lands_in_its_shard(schedules: ScheduleStore) -> None:
    schedule = make()
    assert schedules.create(schedule)
    assert schedules.get(schedule.id) == schedule
    assert schedule.template.priority is Priority.HIGH and schedule.misfire is MisfirePolicy.ALL
    assert schedules.list_shard(schedule.shard(schedules.shard_count)) == [schedule]
    other = (schedule.shard(schedules.shard_count) + 1) % schedules.shard_count
    assert schedule not in schedules.list_shard(other)


def test_creating_a_schedule_again_changes_nothing(schedules: ScheduleStore) -> None:
    first = make()
    assert schedules.create(first)
    assert not schedules.create(make(cron="*/5 * * * *"))
    assert schedules.get(first.id) == first


def test_list_all_filters_by_tenant_and_orders_by_name(schedules: ScheduleStore) -> None:
    for tenant, name in (("college", "b"), ("college", "a"), ("board", "a")):
        assert schedules.create(make(name, tenant))
    assert [(s.tenant, s.name) for s in schedules.list_all()] == [("board", "a"), ("college", "a"), ("college", "b")]
    assert [s.name for s in schedules.list_all("college")] == ["a", "b"]
    assert schedules.get(schedule_id("nobody", "a")) is None


def test_advance_applies_only_from_the_slot_read(schedules: ScheduleStore) -> None:
    schedule = make()
    schedules.create(schedule)
    later = schedule.next_slot_ms + 86_400_000
    assert schedules.advance(schedule, later, token=7) is AdvanceOutcome.APPLIED
    assert schedules.advance(schedule, later + 1, token=7) is AdvanceOutcome.CHANGED  # stale read
    stored = schedules.get(schedule.id)
    assert stored is not None and stored.next_slot_ms == later
    assert schedules.advance(stored, later + 86_400_000, token=7) is AdvanceOutcome.APPLIED


def test_a_race_of_advances_from_one_read_has_one_winner(schedules: ScheduleStore) -> None:
    schedule = make()
    schedules.create(schedule)
    outcomes = all_at_once([lambda: schedules.advance(schedule, schedule.next_slot_ms + 60_000, token=3)] * 4)
    assert outcomes.count(AdvanceOutcome.APPLIED) == 1
    assert outcomes.count(AdvanceOutcome.CHANGED) == 3


def test_an_older_token_is_fenced_out_of_the_whole_shard(schedules: ScheduleStore) -> None:
    schedule = make()
    schedules.create(schedule)
    sibling = next(s for s in (make(f"s{i}") for i in range(500))
                   if s.shard(schedules.shard_count) == schedule.shard(schedules.shard_count))
    schedules.create(sibling)
    assert schedules.advance(schedule, schedule.next_slot_ms + 60_000, token=10) is AdvanceOutcome.APPLIED
    assert schedules.advance(sibling, sibling.next_slot_ms + 60_000, token=9) is AdvanceOutcome.FENCED
    assert schedules.get(sibling.id) == sibling  # unchanged
    assert schedules.advance(sibling, sibling.next_slot_ms + 60_000, token=11) is AdvanceOutcome.APPLIED


def test_a_paused_schedule_does_not_advance_until_resumed(schedules: ScheduleStore) -> None:
    schedule = make()
    schedules.create(schedule)
    assert schedules.pause(schedule.id)
    assert not schedules.pause(schedule.id)  # already paused
    assert schedules.advance(schedule, schedule.next_slot_ms + 60_000, token=1) is AdvanceOutcome.CHANGED
    paused = schedules.get(schedule.id)
    assert paused is not None and paused.paused and paused.next_slot_ms == schedule.next_slot_ms
    resumed_at = schedule.next_slot_ms + 7 * 86_400_000
    assert schedules.resume(schedule.id, resumed_at)
    assert not schedules.resume(schedule.id, resumed_at)  # not paused
    assert schedules.get(schedule.id) == replace(schedule, next_slot_ms=resumed_at)


def test_delete_removes_the_schedule_and_stops_its_advances(schedules: ScheduleStore) -> None:
    schedule = make()
    schedules.create(schedule)
    assert schedules.delete(schedule.id)
    assert not schedules.delete(schedule.id)
    assert schedules.get(schedule.id) is None
    assert schedules.list_shard(schedule.shard(schedules.shard_count)) == []
    assert schedules.advance(schedule, schedule.next_slot_ms + 60_000, token=1) is AdvanceOutcome.CHANGED
    assert not schedules.pause(schedule.id) and not schedules.resume(schedule.id, 0)


def test_a_schedule_deleted_and_added_again_is_not_advanced_from_the_old_read(schedules: ScheduleStore) -> None:
    old = make()
    schedules.create(old)
    assert schedules.delete(old.id)
    again = replace(make(cron="0 9 * * *"), next_slot_ms=old.next_slot_ms, created_ms=old.created_ms + 1)
    assert schedules.create(again)  # same tenant and name, same id, and here even the same next slot
    assert schedules.advance(old, old.next_slot_ms + 3_600_000, token=1) is AdvanceOutcome.CHANGED
    assert schedules.get(again.id) == again
    assert schedules.advance(again, again.next_slot_ms + 86_400_000, token=1) is AdvanceOutcome.APPLIED


def test_an_advance_past_skipped_slots_counts_them_with_the_schedule(schedules: ScheduleStore) -> None:
    schedule = make()
    schedules.create(schedule)
    fresh = schedules.get(schedule.id)
    assert fresh is not None and (fresh.skipped, fresh.last_skipped_ms) == (0, None)
    day = 86_400_000
    assert schedules.advance(schedule, schedule.next_slot_ms + 3 * day, token=1, skipped=2,
                             last_skipped_ms=schedule.next_slot_ms + day) is AdvanceOutcome.APPLIED
    once = schedules.get(schedule.id)
    assert once is not None and (once.skipped, once.last_skipped_ms) == (2, schedule.next_slot_ms + day)
    assert schedules.advance(once, once.next_slot_ms + day, token=1) is AdvanceOutcome.APPLIED  # none skipped
    kept = schedules.get(schedule.id)
    assert kept is not None and (kept.skipped, kept.last_skipped_ms) == (2, schedule.next_slot_ms + day)
    assert schedules.advance(kept, kept.next_slot_ms + 2 * day, token=1, skipped=1,
                             last_skipped_ms=kept.next_slot_ms) is AdvanceOutcome.APPLIED
    assert schedules.list_shard(schedule.shard(schedules.shard_count)) == [
        replace(schedule, next_slot_ms=kept.next_slot_ms + 2 * day, skipped=3, last_skipped_ms=kept.next_slot_ms)]
