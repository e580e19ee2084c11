"""A queue that refuses a dispatcher's flushes while it catches up, on the embedded
backend's real adapters, in this process, on a manual clock (tests/dispatcher_rig.py).

The dispatcher takes over shards whose cursor is 4.5 minutes behind: the catch-up reads
the past buckets late, so their rows go straight into the wheel's overdue list and fire
at once. The queue refuses every flush holding a row of one of those buckets for a
while. After every turn of the fire loop the cursor as written must not pass a task the
queue has not acknowledged: that is what a kill -9 at that moment leaves the next owner.
Later, rows are written around any hand-off behind the cursor, into slices that fired
(the look or the sweep finds them), and the queue refuses them for good: the cursor
cannot move back below them, so it must not move on either, nor write counts that call
them handled. Then the dispatcher is abandoned without any shutdown (kill -9), or gives
its shards back after `publish_give_up_s`, and a second dispatcher with a working queue
publishes every task, the late ones too, none before its time. Last, a row that is not a
task among those the catch-up reads, whose dead letter the queue refuses: the cursor
stays short of it until a next owner's letter is acknowledged.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from scheduler.model import BUCKET_MS, Task, TaskId, minute_bucket
from scheduler.ports import Delivery
from scheduler.worker.dead_letters import UNREADABLE_ROW, DeadLetter, decode_record
from tests.contract.test_task_store import write_unreadable_row
from tests.dispatcher_rig import (
    KAFKA,
    SESSION_S,
    SHARDS,
    Failing,
    FlakyPublisher,
    ManualClock,
    Rig,
    SecondsClock,
    cursors,
    passed_unacknowledged,
    published_ids,
    task_in,
)
from tests.tasks import NINE_OCLOCK_MS

pytestmark = pytest.mark.timeout(120)

T0 = NINE_OCLOCK_MS
PAST = [T0 + n * BUCKET_MS for n in range(4)]
"""Buckets behind the take-over, read late by the catch-up."""
TAKEOVER_MS = T0 + 4 * BUCKET_MS + 30_000
"""The cursor left by the previous owner is T0 - 1: 4.5 minutes behind."""
HEAL_MS = TAKEOVER_MS + 1_500
"""Until then the queue refuses any flush holding a row of `PAST[1]`."""
GIVE_UP_S = 4.0


def seed(rig: Rig) -> list[Task]:
    """Every shard's cursor at T0 - 1 (an owner that is gone), and tasks in each of its
    buckets since: 30 in each past bucket, 30 in the current one before the take-over,
    and 15 due in the 15 s after it."""
    store = rig.store
    for shard in range(SHARDS):
        assert store.take_shard(shard, "gone", 0) and store.advance_shard(shard, 0, T0 - 1)
    tasks = []
    for shard in range(SHARDS):
        for bucket in PAST:
            tasks += [task_in(shard, bucket + 1 + n * 1999) for n in range(30)]
        tasks += [task_in(shard, T0 + 4 * BUCKET_MS + 1 + n * 997) for n in range(30)]
        tasks += [task_in(shard, TAKEOVER_MS + 1_000 + n * 1_000) for n in range(15)]
    assert store.insert(tasks) == []
    return tasks


def refusing(late: set[TaskId]) -> Failing:
    def failing(tasks: list[Task], now: int) -> bool:
        if any(task.id in late for task in tasks):
            return True
        return now < HEAL_MS and any(minute_bucket(task.run_at_ms) == PAST[1] for task in tasks)

    return failing


@pytest.fixture
def clocks() -> tuple[ManualClock, SecondsClock]:
    return ManualClock(TAKEOVER_MS), SecondsClock(1_000.0)


@pytest.fixture
def rigs() -> Iterator[list[Rig]]:
    made: list[Rig] = []
    try:
        yield made
    finally:
        for rig in made:
            rig.close()


def first_owner(tmp_path: Path, clocks: tuple[ManualClock, SecondsClock], rigs: list[Rig],
                **config: Any) -> tuple[Rig, list[Task], list[Task]]:
    """Dispatcher `a` through the catch-up (refused until `HEAL_MS`) and up to the moment
    the late rows were refused; the cursor rule checked after every turn. Returns it, the
    tasks written before the take-over, and the late ones."""
    clock, coordinator_clock = clocks
    late_ids: set[TaskId] = set()
    a = Rig(tmp_path, "a", clock, coordinator_clock, failing=refusing(late_ids), **config)
    rigs.append(a)
    tasks = seed(a)

    def rule() -> None:
        missed = passed_unacknowledged(a.store, tasks, a.publisher.acked)
        assert not missed, f"at {clock.now_ms}, the cursor passed tasks the queue never acknowledged: {missed[:5]}"

    a.checks.append(rule)
    a.take()
    assert sorted(a.dispatcher.shards) == list(range(SHARDS))

    a.pump_until(lambda: a.publisher.failures, max_pumps=30, what="a flush of the catch-up to be refused")
    assert clock.now_ms < HEAL_MS
    a.pump_until(lambda: all(t.id in a.publisher.acked for t in tasks if t.run_at_ms <= TAKEOVER_MS),
                 max_pumps=300, what="the catch-up to be acknowledged once the queue healed")
    assert a.dispatcher.stats.publish_failures >= 1 and a.dispatcher.stats.loaded >= len(tasks) // 2

    # Rows written into the past, behind the cursor, around any hand-off (a bulk load, a
    # hand-written INSERT): this owner's second look or sweep finds them; the queue refuses them.
    a.pump(1_000)
    through = cursors(a.store)
    late = [task_in(shard, (through[shard] or 0) - 500 - n) for shard in range(SHARDS) for n in range(2)]
    assert all(task.run_at_ms > T0 + 4 * BUCKET_MS for task in late)  # in the current bucket, well within the horizon
    assert a.store.insert(late) == []
    late_ids.update(task.id for task in late)
    a.pump_until(lambda: late_ids <= a.publisher.refused, max_pumps=200,
                 what="the late rows to be found by a look or a sweep, fired, and refused")
    return a, tasks, late


def second_owner(tmp_path: Path, clocks: tuple[ManualClock, SecondsClock], rigs: list[Rig], a: Rig,
                 tasks: list[Task], late: list[Task]) -> Rig:
    """Dispatcher `b`, with a working queue, until every task was acknowledged (by `a`
    before, or by `b`) and the last one's time passed; the cursor rule checked throughout
    (for the tasks written ahead of the cursor: the late ones were written behind it)."""
    everything = tasks + late
    clock, coordinator_clock = clocks
    b = Rig(tmp_path, "b", clock, coordinator_clock)
    rigs.append(b)

    def acked() -> set[TaskId]:
        return set(a.publisher.acked) | set(b.publisher.acked)

    def rule() -> None:
        missed = passed_unacknowledged(b.store, tasks, acked())
        assert not missed, f"at {clock.now_ms}, the cursor passed tasks never acknowledged: {missed[:5]}"

    rule()  # the cursors as the first owner left them
    b.checks.append(rule)
    b.take()
    assert sorted(b.dispatcher.shards) == list(range(SHARDS))
    last = max(task.run_at_ms for task in everything)
    b.pump_until(lambda: {t.id for t in everything} <= acked() and clock.now_ms > last + 2_000, max_pumps=400,
                 what=lambda: f"every task to be published: {[str(t.id) for t in everything if t.id not in acked()]}")
    return b


def assert_all_published_in_time(a: Rig, b: Rig, everything: list[Task], late: list[Task]) -> None:
    assert {task.id for task in late} <= set(b.publisher.acked), "the refused rows were left to the next owner"
    assert {task.id for task in everything} <= set(published_ids(b.queue)), "read from the ready topics"
    early = [(at, task.run_at_ms) for at, task in a.publisher.sent + b.publisher.sent if at < task.run_at_ms]
    assert not early, f"published before their time: {early[:5]}"


def test_a_dispatcher_killed_while_the_queue_refuses_its_catch_up_loses_nothing(
    tmp_path: Path, clocks: tuple[ManualClock, SecondsClock], rigs: list[Rig],
) -> None:
    a, tasks, late = first_owner(tmp_path, clocks, rigs)
    for _ in range(20):  # two more seconds of refusals: any cursor advance has its chance
        a.pump()
    assert not {task.id for task in late} & set(a.publisher.acked)
    a.kill()
    clocks[1].now_s += SESSION_S + 1  # the coordinator forgets the dead member's session
    b = second_owner(tmp_path, clocks, rigs, a, tasks, late)
    assert b.dispatcher.stats.taken == SHARDS and b.dispatcher.stats.rows_swept >= len(late)
    assert_all_published_in_time(a, b, tasks + late, late)


def test_a_dispatcher_that_cannot_publish_gives_its_shards_back_short_of_what_was_refused(
    tmp_path: Path, clocks: tuple[ManualClock, SecondsClock], rigs: list[Rig],
) -> None:
    a, tasks, late = first_owner(tmp_path, clocks, rigs, publish_give_up_s=GIVE_UP_S)
    assert not a.dispatcher.ctx.stopping.is_set(), "the catch-up's refusals were shorter than the give-up"
    a.pump_until(a.dispatcher.ctx.stopping.is_set, max_pumps=int(GIVE_UP_S * 10) + 80, what="the dispatcher to give up")
    assert a.dispatcher.failed is not None and "nothing could be published" in a.dispatcher.failed
    a.dispatcher._shutdown()  # what run() does once its loop ends: give every shard back
    assert a.dispatcher.stats.given_back == SHARDS and not a.dispatcher.shards
    assert a.coordinator.lease_holders() == {}, "the leases were released, not left to expire"
    missed = passed_unacknowledged(a.store, tasks, a.publisher.acked)
    assert not missed, f"the cursor given back passed tasks never acknowledged: {missed[:5]}"
    assert not {task.id for task in late} & set(a.publisher.acked)
    a.close()  # the process exits, leaving the coordinator
    b = second_owner(tmp_path, clocks, rigs, a, tasks, late)  # no session to expire: it takes over at once
    assert b.dispatcher.stats.rows_swept >= len(late)
    assert_all_published_in_time(a, b, tasks + late, late)


def test_a_dispatcher_giving_up_mid_catch_up_gives_back_no_cursor_past_rows_waiting_in_its_wheel(
    tmp_path: Path, clocks: tuple[ManualClock, SecondsClock], rigs: list[Rig],
) -> None:
    clock, coordinator_clock = clocks
    current = T0 + 4 * BUCKET_MS
    a = Rig(tmp_path, "a", clock, coordinator_clock, publish_give_up_s=GIVE_UP_S,
            failing=lambda tasks, now: any(minute_bucket(task.run_at_ms) == current for task in tasks))
    rigs.append(a)
    tasks = seed(a)

    def rule() -> None:
        missed = passed_unacknowledged(a.store, tasks, a.publisher.acked)
        assert not missed, f"at {clock.now_ms}, the cursor passed tasks the queue never acknowledged: {missed[:5]}"

    a.checks.append(rule)
    a.take()
    # The current bucket is read first; its overdue rows are refused, and the past buckets
    # read meanwhile wait behind the wheel's frontier, unfired, while the flush is retried.
    a.pump_until(a.dispatcher.ctx.stopping.is_set, max_pumps=int(GIVE_UP_S * 10) + 80, what="the dispatcher to give up")
    waiting = [owned.overdue_floor_ms for owned in a.dispatcher.shards.values()]
    assert all(floor is not None and floor < current for floor in waiting), waiting
    a.dispatcher._shutdown()
    assert a.dispatcher.stats.given_back == SHARDS
    missed = passed_unacknowledged(a.store, tasks, a.publisher.acked)
    assert not missed, f"the cursor given back passed tasks never acknowledged: {missed[:5]}"
    assert not a.publisher.acked
    a.close()
    b = second_owner(tmp_path, clocks, rigs, a, tasks, [])
    assert_all_published_in_time(a, b, tasks, [])


def lettered(publisher: FlakyPublisher, task_id: TaskId) -> bool:
    """Whether the queue acknowledged a dead letter of the row with `task_id`."""
    letters = [decode_record(Delivery(KAFKA.dead_letter_topic, 0, 0, value, 0)) for value in publisher.letters]
    return any(isinstance(letter, DeadLetter) and letter.task_id == task_id and letter.reason == UNREADABLE_ROW
               for letter in letters)


def test_an_unreadable_row_in_the_catch_up_holds_the_cursor_until_its_dead_letter_is_acknowledged(
    tmp_path: Path, clocks: tuple[ManualClock, SecondsClock], rigs: list[Rig],
) -> None:
    clock, coordinator_clock = clocks
    a = Rig(tmp_path, "a", clock, coordinator_clock, letters_failing=lambda letters, now: bool(letters))
    rigs.append(a)
    tasks = seed(a)
    bad = task_in(0, PAST[1] + 30_500)
    write_unreadable_row(a.store, bad)  # among the rows the catch-up reads late

    def rule() -> None:
        missed = passed_unacknowledged(a.store, tasks, a.publisher.acked)
        assert not missed, f"at {clock.now_ms}, the cursor passed tasks the queue never acknowledged: {missed[:5]}"
        cursor = a.store.read_shard(0).fired_through_ms or 0
        assert cursor < bad.run_at_ms or lettered(a.publisher, bad.id), \
            f"the cursor {cursor} passed the unreadable row before its dead letter was acknowledged"

    a.checks.append(rule)
    a.take()
    a.pump_until(lambda: a.dispatcher.stats.bad_rows and a.publisher.failures, max_pumps=30,
                 what="the unreadable row's dead letter to be refused")
    for _ in range(30):
        a.pump()
    assert not lettered(a.publisher, bad.id)
    a.kill()
    coordinator_clock.now_s += SESSION_S + 1
    b = second_owner(tmp_path, clocks, rigs, a, tasks, [])
    assert lettered(b.publisher, bad.id), "the next owner did not dead-letter the row"
    assert (b.store.read_shard(0).fired_through_ms or 0) > bad.run_at_ms
    assert_all_published_in_time(a, b, tasks, [])
