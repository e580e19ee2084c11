"""The fire loop between its ticks, on the embedded backend's real adapters in this
process, on a manual clock (tests/dispatcher_rig.py): the loop sleeps as `_wait_ms` says,
applies its inbox and makes a pass, as `Dispatcher._fire_loop` does, but without
sleeping. A task is published at its own time, up to the gap between passes late
(`fire_gap_ms`, longer only while flushes take long), not up to a tick; never before it; the ticks keep their pace however many passes come between
them; and a held task of a shard whose lease ended is not published.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from scheduler.model import Task, encode_message
from tests.dispatcher_rig import SESSION_S, SHARDS, ManualClock, Rig, SecondsClock, task_in
from tests.tasks import NINE_OCLOCK_MS

pytestmark = pytest.mark.timeout(120)

T0 = NINE_OCLOCK_MS
GAP_MS = 5


@pytest.fixture
def coordinator_clock() -> SecondsClock:
    return SecondsClock(1_000.0)


@pytest.fixture
def rig(tmp_path: Path, coordinator_clock: SecondsClock) -> Iterator[Rig]:
    rig = Rig(tmp_path, "a", ManualClock(T0 - 500), coordinator_clock, fire_gap_ms=GAP_MS)
    for shard in range(SHARDS):  # a previous owner fired through T0 - 1: only minute T0 is read
        assert rig.store.take_shard(shard, "gone", 0) and rig.store.advance_shard(shard, 0, T0 - 1)
    rig.take()
    yield rig
    rig.close()


def seed(rig: Rig) -> list[Task]:
    """Tasks in every shard, due at odd milliseconds through two seconds of minute T0."""
    tasks = [task_in(shard, T0 + 3 + n * 37 + shard) for shard in range(SHARDS) for n in range(54)]
    assert rig.store.insert(tasks) == []
    return tasks


class Loop:
    """The fire loop's turns on the manual clock (see the module docstring)."""

    def __init__(self, rig: Rig) -> None:
        self.rig = rig
        self.ticks: list[int] = []
        self.passes: list[int] = []
        """When each pass between ticks was made."""
        self.gaps: list[int] = []
        """The gap between passes in force at each turn: `fire_gap_ms`, or longer when the
        last flush took long in real time (a busy machine), as the design allows."""
        rig.dispatcher.start_ticking(rig.clock.now_ms)

    def run_until(self, until_ms: int) -> None:
        dispatcher, clock = self.rig.dispatcher, self.rig.clock
        turns = 0
        while clock.now_ms < until_ms:
            turns += 1
            assert turns < 10 * (until_ms - T0 + 1_000), "the loop does not move on"
            self.gaps.append(dispatcher._gap_ms())
            clock.now_ms += dispatcher._wait_ms(clock.now_ms)
            self.rig.drain()
            (self.ticks if clock.now_ms >= dispatcher._next_tick_ms else self.passes).append(clock.now_ms)
            dispatcher._pass()


def test_each_task_is_published_at_its_own_time_within_the_gap_never_before(rig: Rig) -> None:
    tasks = seed(rig)
    loop = Loop(rig)
    loop.run_until(T0 + 2_500)

    acked = rig.publisher.acked
    lateness = sorted(acked[task.id] - task.run_at_ms for task in tasks)
    assert len(lateness) == len(tasks)  # every one published
    assert lateness[0] >= 0, "published before its time"
    # Not up to a tick late: at most the gap between passes, which is GAP_MS unless a
    # flush took long on a busy machine (then three times that flush, by design).
    assert min(loop.gaps) == GAP_MS
    assert lateness[-1] <= max(loop.gaps), (lateness[-10:], max(loop.gaps))
    assert sorted(at for at, _ in rig.publisher.sent) == [at for at, _ in rig.publisher.sent]


def test_the_ticks_keep_their_pace_and_passes_come_no_closer_than_the_gap(rig: Rig) -> None:
    seed(rig)
    loop = Loop(rig)
    loop.run_until(T0 + 2_500)

    assert loop.ticks == list(range(T0 - 400, T0 + 2_501, 100))  # every tick, on its boundary
    wakes = sorted(loop.ticks + loop.passes)
    assert min(b - a for a, b in zip(wakes, wakes[1:], strict=False) if b in loop.passes) >= GAP_MS
    assert len(loop.passes) <= 2_500 // GAP_MS  # a pass fires what fell due since the last: a batch


def test_a_held_task_of_a_shard_whose_lease_ended_is_not_published(rig: Rig,
                                                                   coordinator_clock: SecondsClock) -> None:
    [task] = [task_in(1, T0 + 250)]
    assert rig.store.insert([task]) == []
    loop = Loop(rig)
    loop.run_until(T0 + 200)  # the tick at T0 + 200 took the slot T0 + 200 .. 299 from the wheel
    assert rig.dispatcher.shards[1].soon and task.id not in rig.publisher.acked

    coordinator_clock.now_s += SESSION_S + 1  # the session, and with it every lease, has expired
    rig.clock.now_ms = T0 + 250
    rig.dispatcher._fire_held(rig.clock.now_ms)
    assert task.id not in rig.publisher.acked
    assert 1 not in rig.dispatcher.shards  # dropped, with what it held


def test_a_wall_clock_stepped_back_does_not_hold_the_ticks_back(rig: Rig) -> None:
    Loop(rig).run_until(T0 + 1_000)
    dispatcher = rig.dispatcher
    back = T0 - 30_000  # the wall clock steps back 31 s
    wait = dispatcher._wait_ms(back)
    assert 0 < wait <= dispatcher.config.tick_ms, wait  # the next tick, not 31 s away
    rig.clock.now_ms = back + wait
    dispatcher._pass()
    assert dispatcher._next_tick_ms == back + wait + dispatcher.config.tick_ms  # that was a tick


def test_a_task_held_behind_the_fired_point_after_a_clock_step_back_holds_the_cursor(rig: Rig) -> None:
    Loop(rig).run_until(T0 + 1_500)
    owned = rig.dispatcher.shards[1]
    late = task_in(1, T0 + 1_400)  # a hand-off for a moment the shard has already fired through
    owned._add(late.run_at_ms, 0, encode_message(late, 1))
    owned.fire(T0 + 1_000)  # the wall clock stepped back 500 ms: not due yet by it, so held
    assert [run_at for run_at, _, _ in owned.soon] == [late.run_at_ms]
    assert owned.cursor_candidate() < late.run_at_ms


def test_slow_flushes_space_the_passes_out(rig: Rig) -> None:
    firing = rig.dispatcher.firing
    firing.send_ms = 1.0  # an idle Kafka: the configured gap
    assert rig.dispatcher._gap_ms() == GAP_MS
    firing.send_ms = 30.0  # a busy one: a pass at most every three flushes' time
    assert rig.dispatcher._gap_ms() == 90
    rig.clock.now_ms = T0 + 1
    rig.dispatcher.start_ticking(T0 + 1)
    owned = rig.dispatcher.shards[1]
    owned.soon.append((T0 + 5, 0, b""))  # held, due before the next tick
    assert rig.dispatcher._wait_ms(T0 + 1) == 90  # not at T0 + 5, nor a gap after the last pass
