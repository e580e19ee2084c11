"""`ScheduleRunner` on the embedded stores with a manual clock: runs created once per
slot through crashes and races, each misfire policy after an outage, DST days walked
minute by minute, pause and resume, fencing."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from pathlib import Path

import pytest

from scheduler.adapters.embedded.schedules import SqliteScheduleStore
from scheduler.adapters.embedded.store import SqliteTaskStore
from scheduler.model import Task, TaskId, to_ms
from scheduler.ports import AdvanceOutcome, TaskStatus
from scheduler.producer import Client
from scheduler.recurring.jitter import jitter_ms
from scheduler.recurring.runner import ScheduleRunner
from scheduler.recurring.schedule import Schedule, new_schedule, run_key
from tests.support import all_at_once

pytestmark = pytest.mark.timeout(120)

MINUTE_MS = 60_000


def utc_ms(text: str) -> int:
    return to_ms(datetime.fromisoformat(text).replace(tzinfo=UTC))


@dataclass
class ManualClock:
    now_ms: int

    def __call__(self) -> int:
        return self.now_ms


@dataclass
class RecordingHandoff:
    tasks: list[Task] = field(default_factory=list)

    def submitted(self, tasks: Sequence[Task]) -> None:
        self.tasks.extend(tasks)

    def cancelled(self, task_id: TaskId) -> None:
        raise AssertionError("the runner cancels nothing")

    def completed(self, task_ids: Sequence[bytes]) -> None:
        raise AssertionError("the runner finishes no attempt")


class Crash(BaseException):
    """The process dies here (not an error anyone handles)."""


@dataclass
class Rig:
    path: Path
    tasks: SqliteTaskStore
    schedules: SqliteScheduleStore
    clock: ManualClock
    handoff: RecordingHandoff

    def runner(self, schedules: SqliteScheduleStore | None = None) -> ScheduleRunner:
        client = Client(self.tasks, handoff=self.handoff, now_ms=self.clock)
        return ScheduleRunner(schedules or self.schedules, client, clock=self.clock)

    def add(self, name: str = "job", cron: str = "0 * * * *", zone: str = "UTC", **options: object) -> Schedule:
        schedule = new_schedule(tenant="college", name=name, cron=cron, zone=zone, type="report",
                                payload={"n": name}, now_ms=self.clock.now_ms, **options)  # type: ignore[arg-type]
        assert self.schedules.create(schedule)
        return schedule

    def runs(self) -> list[tuple[int, str]]:
        """(run_at, idempotency key) of every task row, sorted."""
        with sqlite3.connect(self.path) as db:
            return sorted(db.execute("SELECT run_at, idempotency_key FROM tasks").fetchall())

    def pass_(self, token: int = 1, runner: ScheduleRunner | None = None) -> None:
        schedule_shards = {s.shard(self.schedules.shard_count) for s in self.schedules.list_all()}
        for shard in schedule_shards:
            (runner or self.runner()).run_shard(shard, token)


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    path = tmp_path / "tasks.db"
    tasks = SqliteTaskStore(path)
    schedules = SqliteScheduleStore(path)
    try:
        yield Rig(path, tasks, schedules, ManualClock(utc_ms("2026-12-01T08:55")), RecordingHandoff())
    finally:
        schedules.close()
        tasks.close()


def test_runs_are_created_a_lookahead_ahead_as_keyed_tasks_and_handed_off(rig: Rig) -> None:
    schedule = rig.add(jitter_s=30)
    rig.pass_()
    assert rig.runs() == []  # 09:00 is 5 minutes away
    rig.clock.now_ms = utc_ms("2026-12-01T08:58:45")
    rig.pass_()
    slot = utc_ms("2026-12-01T09:00")
    run_at = slot + jitter_ms(schedule.id, slot, 30)
    assert rig.runs() == [(run_at, run_key(schedule.id, slot))]
    task_id = TaskId.for_key(run_at, "college", run_key(schedule.id, slot))
    stored = rig.tasks.get(task_id)
    assert stored is not None and stored.task.type == "report" and stored.status is TaskStatus.SCHEDULED
    assert [task.id for task in rig.handoff.tasks] == [task_id]  # due within two minutes
    advanced = rig.schedules.get(schedule.id)
    assert advanced is not None and advanced.next_slot_ms == utc_ms("2026-12-01T10:00")
    rig.pass_()
    assert len(rig.runs()) == 1  # a second pass creates nothing more


def test_a_crash_between_creating_a_run_and_advancing_leaves_one_task_per_slot(rig: Rig) -> None:
    schedule = rig.add()
    rig.clock.now_ms = utc_ms("2026-12-01T08:59")

    class CrashingAdvance(SqliteScheduleStore):
        def advance(self, schedule: Schedule, next_slot_ms: int, token: int, *, skipped: int = 0,
                    last_skipped_ms: int | None = None) -> AdvanceOutcome:
            raise Crash

    crashing = CrashingAdvance(rig.path)
    try:
        with pytest.raises(Crash):
            rig.runner(crashing).run_shard(schedule.shard(64), token=1)
    finally:
        crashing.close()
    assert len(rig.runs()) == 1  # the run was written, the schedule not advanced
    stored = rig.schedules.get(schedule.id)
    assert stored is not None and stored.next_slot_ms == utc_ms("2026-12-01T09:00")
    rig.tasks.cancel(TaskId.for_key(utc_ms("2026-12-01T09:00"), "college", run_key(schedule.id,
                                                                                   utc_ms("2026-12-01T09:00"))),
                     "college")
    rig.pass_(token=2)  # the shard's next owner
    assert rig.runs() == [(utc_ms("2026-12-01T09:00"), run_key(schedule.id, utc_ms("2026-12-01T09:00")))]
    again = rig.tasks.get(TaskId.for_key(utc_ms("2026-12-01T09:00"), "college",
                                         run_key(schedule.id, utc_ms("2026-12-01T09:00"))))
    assert again is not None and again.status is TaskStatus.CANCELLED  # re-creating kept its status
    stored = rig.schedules.get(schedule.id)
    assert stored is not None and stored.next_slot_ms == utc_ms("2026-12-01T10:00")


def test_two_creators_racing_on_the_same_schedules_make_one_task_per_slot(rig: Rig) -> None:
    schedules = [rig.add(f"job{i}", cron="*/5 * * * *") for i in range(20)]
    shards = {s.shard(64) for s in schedules}
    both_read = threading.Barrier(2)

    class ReadThenWait(SqliteScheduleStore):
        """Both creators read every schedule before either advances one."""

        def list_shard(self, shard: int) -> list[Schedule]:
            found = super().list_shard(shard)
            both_read.wait(timeout=30)
            return found

    stores = [ReadThenWait(rig.path), ReadThenWait(rig.path)]
    try:
        for step in range(6):  # 09:00 to 09:25, a pass every 5 minutes, both creators each time
            rig.clock.now_ms = utc_ms("2026-12-01T09:00") + step * 5 * MINUTE_MS
            for shard in sorted(shards):
                results = all_at_once([partial(rig.runner(store).run_shard, shard, 1) for store in stores])
                assert sum(r.advanced for r in results) == sum(1 for s in schedules if s.shard(64) == shard)
    finally:
        for store in stores:
            store.close()
    runs = rig.runs()
    assert len(runs) == len(set(runs)) == 20 * 6  # 09:00 .. 09:25 every 5 minutes, once each
    for schedule in schedules:
        stored = rig.schedules.get(schedule.id)
        assert stored is not None and stored.next_slot_ms == utc_ms("2026-12-01T09:30")


@pytest.mark.parametrize(("policy", "expected"), [
    ("all", ["09:00", "10:00", "11:00", "12:00"]),
    ("once", ["09:00"]),
    ("skip", []),
])
def test_each_misfire_policy_after_an_outage(rig: Rig, policy: str, expected: list[str]) -> None:
    schedule = rig.add(misfire=policy, grace_s=120)
    rig.clock.now_ms = utc_ms("2026-12-01T12:10")  # down from 08:55 to 12:10: 09:00 .. 12:00 missed
    rig.pass_()
    assert [run_at for run_at, _ in rig.runs()] == [utc_ms(f"2026-12-01T{hhmm}") for hhmm in expected]
    stored = rig.schedules.get(schedule.id)
    assert stored is not None and stored.next_slot_ms == utc_ms("2026-12-01T13:00")
    rig.clock.now_ms = utc_ms("2026-12-01T12:59")
    rig.pass_()
    assert rig.runs()[-1][0] == utc_ms("2026-12-01T13:00")  # and on time again after


def test_a_slot_late_within_the_grace_runs_whatever_the_policy(rig: Rig) -> None:
    rig.add(misfire="skip", grace_s=120)
    rig.clock.now_ms = utc_ms("2026-12-01T09:01:30")
    rig.pass_()
    assert [run_at for run_at, _ in rig.runs()] == [utc_ms("2026-12-01T09:00")]


def test_a_paused_schedule_creates_nothing_and_resumes_from_now(rig: Rig) -> None:
    schedule = rig.add(misfire="all")
    assert rig.schedules.pause(schedule.id)
    rig.clock.now_ms = utc_ms("2026-12-01T11:59")
    rig.pass_()
    assert rig.runs() == []
    assert rig.schedules.resume(schedule.id, schedule.rule.next_slot(rig.clock.now_ms))
    rig.pass_()
    assert [run_at for run_at, _ in rig.runs()] == [utc_ms("2026-12-01T12:00")]  # no catch-up for the pause


def test_a_creator_with_an_older_token_is_fenced_out(rig: Rig) -> None:
    schedule = rig.add()
    rig.clock.now_ms = utc_ms("2026-12-01T08:59")
    assert rig.runner().run_shard(schedule.shard(64), token=10).advanced == 1
    rig.clock.now_ms = utc_ms("2026-12-01T09:59")
    result = rig.runner().run_shard(schedule.shard(64), token=9)
    assert result.fenced_out and result.advanced == 0
    stored = rig.schedules.get(schedule.id)
    assert stored is not None and stored.next_slot_ms == utc_ms("2026-12-01T10:00")


def test_a_creator_that_is_no_longer_owner_stops(rig: Rig) -> None:
    schedule = rig.add()
    rig.clock.now_ms = utc_ms("2026-12-01T08:59")
    assert rig.runner().run_shard(schedule.shard(64), token=1, still_owner=lambda: False).advanced == 0
    assert rig.runs() == []


def walk(rig: Rig, start: str, end: str, step_ms: int = MINUTE_MS) -> None:
    """Passes every `step_ms` from `start` to `end` (UTC), as a dispatcher would make them."""
    rig.clock.now_ms = utc_ms(start)
    while rig.clock.now_ms <= utc_ms(end):
        rig.pass_()
        rig.clock.now_ms += step_ms


def local_runs(rig: Rig, zone: str) -> list[str]:
    from zoneinfo import ZoneInfo

    return [datetime.fromtimestamp(run_at / 1000, ZoneInfo(zone)).isoformat() for run_at, _ in rig.runs()]


@pytest.mark.parametrize(("zone", "cron", "start", "end", "expected"), [
    ("America/New_York", "30 2 * * *", "2026-03-07T12:00", "2026-03-09T12:00",
     ["2026-03-08T03:00:00-04:00", "2026-03-09T02:30:00-04:00"]),
    ("America/New_York", "30 1 * * *", "2026-10-31T12:00", "2026-11-02T12:00",
     ["2026-11-01T01:30:00-04:00", "2026-11-02T01:30:00-05:00"]),
    ("Europe/London", "30 1 * * *", "2026-03-28T12:00", "2026-03-30T12:00",
     ["2026-03-29T02:00:00+01:00", "2026-03-30T01:30:00+01:00"]),
    ("Europe/London", "30 1 * * *", "2026-10-24T12:00", "2026-10-26T12:00",
     ["2026-10-25T01:30:00+01:00", "2026-10-26T01:30:00+00:00"]),
    ("Australia/Lord_Howe", "15 2 * * *", "2026-10-03T00:00", "2026-10-05T00:00",
     ["2026-10-04T02:30:00+11:00", "2026-10-05T02:15:00+11:00"]),
    ("Australia/Lord_Howe", "45 1 * * *", "2026-04-04T00:00", "2026-04-06T00:00",
     ["2026-04-05T01:45:00+11:00", "2026-04-06T01:45:00+10:30"]),
])
def test_dst_days_walked_pass_by_pass_create_each_fixed_time_run_once(
        rig: Rig, zone: str, cron: str, start: str, end: str, expected: list[str]) -> None:
    rig.clock.now_ms = utc_ms(start)
    rig.add(cron=cron, zone=zone)
    walk(rig, start, end, step_ms=5 * MINUTE_MS)
    assert local_runs(rig, zone) == expected


def test_an_interval_schedule_walked_across_fall_back_runs_by_elapsed_time(rig: Rig) -> None:
    rig.clock.now_ms = utc_ms("2026-11-01T04:20")
    rig.add(cron="*/30 * * * *", zone="America/New_York")
    walk(rig, "2026-11-01T04:20", "2026-11-01T06:59")
    assert local_runs(rig, "America/New_York") == [
        "2026-11-01T00:30:00-04:00", "2026-11-01T01:00:00-04:00", "2026-11-01T01:30:00-04:00",
        "2026-11-01T01:00:00-05:00", "2026-11-01T01:30:00-05:00", "2026-11-01T02:00:00-05:00"]


def test_an_outage_under_all_is_caught_up_one_batch_a_pass_and_a_lost_lease_stops_it(rig: Rig) -> None:
    schedule = rig.add("minutely", cron="* * * * *", misfire="all")
    rig.clock.now_ms += 250 * MINUTE_MS  # ~250 slots missed
    runner = rig.runner()
    asked: list[bool] = []

    def owner_once() -> bool:
        asked.append(True)
        return len(asked) == 1

    first = runner.run_shard(schedule.shard(64), token=1, still_owner=owner_once)
    assert (first.created, first.advanced) == (runner.limit, 1)  # one batch, then the next pass
    second = runner.run_shard(schedule.shard(64), token=1, still_owner=owner_once)
    assert second.created == 0  # no longer the owner: nothing more
    passes = 0
    while (stored := rig.schedules.get(schedule.id)) is not None and stored.next_slot_ms <= rig.clock.now_ms:
        runner.run_shard(schedule.shard(64), token=1)
        passes += 1
        assert passes < 10
    keys = [key for _, key in rig.runs()]
    assert len(keys) == len(set(keys)) and len(keys) >= 250 and passes >= 2


def test_deleting_a_schedule_cancels_its_runs_ahead_so_adding_it_again_runs_no_slot_twice(rig: Rig) -> None:
    from scheduler.recurring.runner import run_id, runs_ahead

    schedule = rig.add("hourly", jitter_s=30)
    rig.clock.now_ms = utc_ms("2026-12-01T08:59")
    rig.pass_()
    slot = utc_ms("2026-12-01T09:00")
    (ahead,) = runs_ahead(rig.schedules.get(schedule.id) or schedule, rig.clock.now_ms)
    assert ahead == run_id(schedule, slot)
    assert rig.schedules.delete(schedule.id)
    client = Client(rig.tasks, now_ms=rig.clock)
    client.cancel(ahead, "college")
    again = rig.add("hourly", jitter_s=600)  # another jitter: the 09:00 run gets another id
    assert again.next_slot_ms == slot
    rig.pass_()
    fresh = run_id(again, slot)
    assert fresh != ahead
    statuses = {task_id: stored.status for task_id in (ahead, fresh) if (stored := rig.tasks.get(task_id))}
    assert statuses == {ahead: TaskStatus.CANCELLED, fresh: TaskStatus.SCHEDULED}  # one live run for 09:00
