from __future__ import annotations

import tracemalloc
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import scheduler.wheel as wheel_module
from scheduler.errors import ConfigError
from scheduler.wheel import Entry, TimingWheel

T0 = 1_796_202_000_000
"""2026-12-02T09:00:00.000Z, a slot boundary for every tick used here."""


def item(n: int, size: int = 4) -> bytes:
    return n.to_bytes(4, "big") + bytes(size - 4)


def number(entry: Entry) -> int:
    return int.from_bytes(entry[2][:4], "big")


def numbers(entries: list[Entry]) -> list[int]:
    return [number(entry) for entry in entries]


def wheel(tick_ms: int = 100, slots: int = 16, start_ms: int = T0) -> TimingWheel:
    return TimingWheel(start_ms=start_ms, tick_ms=tick_ms, slots=slots)


# --- firing on time ---------------------------------------------------------------


def test_an_entry_never_fires_before_its_slot_has_passed() -> None:
    w = wheel()
    w.add(T0 + 250, 3, b"task")
    for now in range(T0 - 5, T0 + 299):
        assert w.poll(now) == []
    assert w.poll(T0 + 299) == [(T0 + 250, 3, b"task")]
    assert len(w) == 0
    assert w.fired_through_ms == T0 + 299


def test_every_entry_of_a_slot_fires_within_one_tick_of_its_time() -> None:
    w = wheel()
    for offset in (200, 201, 250, 299):
        w.add(T0 + offset, 0, item(offset))
    assert w.poll(T0 + 298) == []
    assert numbers(w.poll(T0 + 299)) == [200, 201, 250, 299]


def test_a_late_poll_fires_every_slot_passed_in_order() -> None:
    w = wheel()
    for offset in (950, 120, 430, 121, 999, 0):
        w.add(T0 + offset, 1, item(offset))
    assert numbers(w.poll(T0 + 500)) == [0, 120, 121, 430]
    assert w.fired_through_ms == T0 + 499
    assert numbers(w.poll(T0 + 10_000)) == [950, 999]
    assert w.fired_through_ms == T0 + 9_999


def test_entries_of_one_tick_fire_in_run_at_order_and_equal_times_in_insertion_order() -> None:
    w = wheel()
    w.add(T0 + 170, 0, b"c")
    w.add(T0 + 110, 0, b"a")
    w.add(T0 + 170, 1, b"d")
    w.add(T0 + 110, 2, b"b")
    w.add(T0 + 100, 3, b"first")
    assert w.poll(T0 + 199) == [
        (T0 + 100, 3, b"first"),
        (T0 + 110, 0, b"a"),
        (T0 + 110, 2, b"b"),
        (T0 + 170, 0, b"c"),
        (T0 + 170, 1, b"d"),
    ]


def test_tag_and_item_come_back_unchanged() -> None:
    w = wheel()
    w.add(T0, 255, b"")
    w.add(T0, 0, bytes(range(256)) * 300)
    assert w.poll(T0 + 99) == [(T0, 255, b""), (T0, 0, bytes(range(256)) * 300)]


def test_a_tag_outside_a_byte_is_refused_and_nothing_is_added() -> None:
    w = wheel()
    with pytest.raises(ValueError, match="0 to 255"):
        w.add(T0 + 500, 256, b"x")
    with pytest.raises(ValueError, match="0 to 255"):
        w.add(T0 + 500, -1, b"x")
    assert len(w) == 0
    assert w.next_due_ms() is None


@pytest.mark.parametrize(("tick_ms", "slots"), [(0, 16), (-1, 16), (100, 0)])
def test_a_wheel_needs_a_positive_tick_and_slot_count(tick_ms: int, slots: int) -> None:
    with pytest.raises(ConfigError):
        TimingWheel(start_ms=T0, tick_ms=tick_ms, slots=slots)


def test_a_slot_holding_more_than_a_chunk_fires_whole_and_in_order() -> None:
    w = wheel()
    sizes = [4, 5_000, 40_000, 100, 16_000, 4, 70_000] * 20
    for n, size in enumerate(sizes):
        w.add(T0 + 199 - n % 100, n % 256, item(n, size))
    expected = sorted(range(len(sizes)), key=lambda n: 199 - n % 100)
    assert numbers(list(w.items_in_slot(T0 + 100))) == list(range(len(sizes)))
    assert w.next_due_ms() == T0 + 199
    fired = w.poll(T0 + 199)
    assert numbers(fired) == expected
    assert [len(entry[2]) for entry in fired] == [sizes[n] for n in expected]
    assert [entry[1] for entry in fired] == [n % 256 for n in expected]
    assert len(w) == 0


def test_overdue_entries_beyond_a_chunk_are_reported_due_and_fire_together() -> None:
    w = wheel()
    w.poll(T0 + 999)
    for n in range(10):
        w.add(T0 + 900 - n, 0, item(n, 3_000))
    assert w.next_due_ms() == T0 + 999
    assert numbers(list(w.items_in_slot(T0))) == list(range(10))
    assert numbers(w.poll(T0)) == list(range(9, -1, -1))
    assert w.next_due_ms() is None


# --- overdue entries ----------------------------------------------------------------


def test_an_overdue_entry_fires_at_the_next_poll_whatever_its_time() -> None:
    w = wheel()
    w.poll(T0 + 999)
    w.add(T0 + 999, 0, b"due now")
    w.add(T0 + 10, 0, b"long due")
    w.add(T0 + 1_000, 0, b"next slot")
    assert w.poll(T0) == [(T0 + 10, 0, b"long due"), (T0 + 999, 0, b"due now")]
    assert w.poll(T0 + 1_099) == [(T0 + 1_000, 0, b"next slot")]


def test_overdue_entries_come_before_the_slots_of_the_same_poll() -> None:
    w = wheel()
    w.poll(T0 + 99)
    w.add(T0 + 150, 0, b"slot")
    w.add(T0 + 50, 0, b"overdue")
    assert w.poll(T0 + 199) == [(T0 + 50, 0, b"overdue"), (T0 + 150, 0, b"slot")]


def test_start_ms_sets_what_is_overdue_from_the_outset() -> None:
    w = wheel(start_ms=T0 + 250)
    assert w.fired_through_ms == T0 + 249
    w.add(T0 + 249, 0, b"before the start")
    w.add(T0 + 250, 0, b"at the start")
    assert w.poll(T0) == [(T0 + 249, 0, b"before the start")]
    assert w.fired_through_ms == T0 + 249
    assert w.poll(T0 + 298) == []
    assert w.poll(T0 + 299) == [(T0 + 250, 0, b"at the start")]


def test_a_poll_with_an_earlier_time_fires_only_overdue_entries_and_keeps_the_cursor() -> None:
    w = wheel()
    w.add(T0 + 150, 0, b"a")
    assert w.poll(T0 + 1_000) == [(T0 + 150, 0, b"a")]
    w.add(T0 + 1_050, 0, b"b")
    w.add(T0 + 900, 0, b"c")
    assert w.poll(T0 + 500) == [(T0 + 900, 0, b"c")]
    assert w.fired_through_ms == T0 + 999
    assert w.poll(T0 + 1_099) == [(T0 + 1_050, 0, b"b")]


# --- overflow -----------------------------------------------------------------------


def test_entries_beyond_the_ring_wait_in_the_overflow_and_fire_on_time() -> None:
    w = wheel(slots=4)  # the ring spans 400 ms
    w.add(T0 + 5_050, 0, b"far")
    w.add(T0 + 450, 0, b"just beyond")
    w.add(T0 + 350, 0, b"last ring slot")
    w.add(T0 + 5_010, 0, b"far, earlier")
    assert w.next_due_ms() == T0 + 399
    assert w.poll(T0 + 399) == [(T0 + 350, 0, b"last ring slot")]
    assert w.poll(T0 + 499) == [(T0 + 450, 0, b"just beyond")]
    w.add(T0 + 5_070, 0, b"far, added late")
    assert w.next_due_ms() == T0 + 5_099
    assert w.poll(T0 + 5_098) == []
    assert w.poll(T0 + 5_099) == [
        (T0 + 5_010, 0, b"far, earlier"),
        (T0 + 5_050, 0, b"far"),
        (T0 + 5_070, 0, b"far, added late"),
    ]


def test_a_slot_added_to_in_the_overflow_and_again_in_the_ring_keeps_insertion_order() -> None:
    w = wheel(slots=4)
    w.add(T0 + 1_000, 0, b"first")
    w.poll(T0 + 799)  # slot 10 is now within the ring
    w.add(T0 + 1_000, 0, b"second")
    assert list(w.items_in_slot(T0 + 1_099)) == [(T0 + 1_000, 0, b"first"), (T0 + 1_000, 0, b"second")]
    assert w.poll(T0 + 1_099) == [(T0 + 1_000, 0, b"first"), (T0 + 1_000, 0, b"second")]


def test_after_hours_without_a_poll_everything_due_fires_in_order() -> None:
    w = wheel(slots=8)
    hour = 3_600_000
    offsets = [7 * hour + 5, 1, hour, 2 * hour + 50, 350, 3 * hour, 90 * hour]
    for offset in offsets:
        w.add(T0 + offset, 0, item(offset))
    assert numbers(w.poll(T0 + 8 * hour)) == sorted(offsets)[:-1]
    assert w.fired_through_ms == T0 + 8 * hour - 1
    assert len(w) == 1
    assert w.next_due_ms() == T0 + 90 * hour + 99
    assert numbers(w.poll(T0 + 100 * hour)) == [90 * hour]


@pytest.mark.timeout(10)
def test_a_jump_over_billions_of_empty_slots_costs_no_more_than_the_slots_holding_entries() -> None:
    w = TimingWheel(start_ms=0, tick_ms=1, slots=2048)
    far = 10**15
    for offset in (5, 2_000, 3_000, far // 2, far - 1):
        w.add(offset, 0, item(offset % 2**32))
    w.add(far + 1, 0, b"later")
    assert [entry[0] for entry in w.poll(far)] == [5, 2_000, 3_000, far // 2, far - 1]
    assert w.poll(far + 1) == [(far + 1, 0, b"later")]


# --- inspection -------------------------------------------------------------------


def test_items_in_slot_lists_the_waiting_entries_sharing_the_slot() -> None:
    w = wheel(slots=4)
    w.add(T0 + 210, 1, b"a")
    w.add(T0 + 290, 2, b"b")
    w.add(T0 + 205, 3, b"c")
    w.add(T0 + 310, 0, b"next slot")
    w.add(T0 + 2_010, 0, b"overflow")
    assert list(w.items_in_slot(T0 + 200)) == [(T0 + 210, 1, b"a"), (T0 + 290, 2, b"b"), (T0 + 205, 3, b"c")]
    assert list(w.items_in_slot(T0 + 2_099)) == [(T0 + 2_010, 0, b"overflow")]
    assert list(w.items_in_slot(T0 + 1_900)) == []
    w.poll(T0 + 299)
    assert list(w.items_in_slot(T0 + 250)) == []
    w.add(T0 + 10, 0, b"overdue")
    assert list(w.items_in_slot(T0 + 299)) == [(T0 + 10, 0, b"overdue")]


def test_items_in_slot_reads_a_copy_so_the_wheel_may_change_meanwhile() -> None:
    w = wheel()
    w.add(T0 + 10, 0, b"a")
    listing = w.items_in_slot(T0)
    w.add(T0 + 20, 0, b"b")
    w.poll(T0 + 99)
    assert list(listing) == [(T0 + 10, 0, b"a")]


def test_len_counts_waiting_entries_and_clear_drops_them_but_keeps_the_cursor() -> None:
    w = wheel(slots=4)
    assert len(w) == 0
    w.add(T0 + 50, 0, b"a")
    w.add(T0 + 5_000, 0, b"b")
    w.poll(T0 + 99)
    w.add(T0 + 1, 0, b"c")
    w.add(T0 + 150, 0, b"d")
    assert len(w) == 3
    w.clear()
    assert len(w) == 0
    assert w.next_due_ms() is None
    assert w.fired_through_ms == T0 + 99
    assert w.poll(T0 + 10_000) == []
    w.add(T0 + 10_050, 0, b"e")
    assert w.poll(T0 + 10_099) == [(T0 + 10_050, 0, b"e")]


def test_next_due_ms_is_the_end_of_the_first_slot_holding_entries() -> None:
    w = wheel(slots=4)
    assert w.next_due_ms() is None
    w.add(T0 + 3_030, 0, b"overflow")
    assert w.next_due_ms() == T0 + 3_099
    w.add(T0 + 260, 0, b"ring")
    assert w.next_due_ms() == T0 + 299
    assert w.poll(T0 + 298) == []
    assert len(w.poll(T0 + 299)) == 1
    assert w.next_due_ms() == T0 + 3_099
    w.add(T0 + 5, 0, b"overdue")
    assert w.next_due_ms() == w.fired_through_ms == T0 + 299
    w.poll(T0 + 299)
    assert w.next_due_ms() == T0 + 3_099


def test_poll_started_takes_the_slot_under_way_whose_entries_may_not_be_due_yet() -> None:
    w = wheel()
    w.add(T0 + 120, 0, item(1))
    w.add(T0 + 250, 0, item(2))
    w.add(T0 + 205, 0, item(3))
    w.add(T0 + 300, 0, item(4))
    assert w.poll_started(T0 + 199) == [(T0 + 120, 0, item(1))]  # the slot of T0 + 100 .. 199, ended
    assert w.fired_through_ms == T0 + 199
    assert numbers(w.poll_started(T0 + 200)) == [3, 2]  # begun at T0 + 200: taken whole, in run_at order
    assert w.fired_through_ms == T0 + 299
    assert w.poll_started(T0 + 299) == []
    w.add(T0 + 280, 0, item(5))  # at or before the frontier: the caller's to hold, taken by the next poll
    assert numbers(w.poll_started(T0 + 250)) == [5]
    assert numbers(w.poll_started(T0 + 300)) == [4]
    assert len(w) == 0


# --- properties ---------------------------------------------------------------------


@dataclass
class Added:
    run_at_ms: int
    tag: int
    overdue: bool
    fired_at_poll: int | None = None


TICK_MS = 10
SLOTS = 8  # a ring of 80 ms; run_at spreads over several spans
START_MS = 1_000

adds = st.tuples(st.just("add"), st.integers(-30, 400), st.integers(0, 255), st.sampled_from([4, 100, 3_000, 9_000]))
polls = st.tuples(st.just("poll"), st.integers(0, 60), st.just(0), st.just(0))
probes = st.tuples(st.just("probe"), st.integers(-30, 400), st.just(0), st.just(0))
operations = st.lists(st.one_of(adds, polls, probes), max_size=120)
"""Steps `(kind, time, tag, item size)`: an add at `now + time`, a poll at `now + time`
(time moves on), or a look at `items_in_slot(now + time)`. Items of 3000 bytes fill
the open buffer and make slots join chunks; items of 9000 bytes do not fit in it."""


@settings(max_examples=300, deadline=None)
@given(operations, st.integers(0, TICK_MS * 3))
def test_every_entry_fires_exactly_once_in_order_never_early_and_at_most_a_tick_late(
    steps: list[tuple[str, int, int, int]], start_offset: int
) -> None:
    start_ms = START_MS + start_offset
    w = TimingWheel(start_ms=start_ms, tick_ms=TICK_MS, slots=SLOTS)
    now = start_ms - 1
    added: list[Added] = []
    poll_times: list[int] = []

    def poll(at: int) -> None:
        due = w.next_due_ms()
        fired = w.poll(at)
        poll_times.append(at)
        assert (due is not None and at >= due) == bool(fired)
        order = [(entry[0], number(entry)) for entry in fired]
        assert order == sorted(order)
        for entry in fired:
            record = added[number(entry)]
            assert record.fired_at_poll is None, "fired twice"
            assert entry[0] == record.run_at_ms
            assert entry[1] == record.tag
            record.fired_at_poll = len(poll_times) - 1
            assert record.run_at_ms <= max(at, start_ms - 1), "fired early"
        assert w.fired_through_ms <= max(at, start_ms - 1)

    for kind, value, tag, size in steps:
        if kind == "add":
            run_at = now + value
            added.append(Added(run_at, tag, overdue=run_at <= w.fired_through_ms))
            w.add(run_at, tag, item(len(added) - 1, size))
        elif kind == "poll":
            now += value
            poll(now)
        else:
            probe = now + value
            expected = sorted(
                n for n, record in enumerate(added) if record.fired_at_poll is None and (
                    record.overdue and probe <= w.fired_through_ms
                    or not record.overdue and probe > w.fired_through_ms
                    and record.run_at_ms // TICK_MS == probe // TICK_MS
                )
            )
            assert sorted(numbers(list(w.items_in_slot(probe)))) == expected
        assert len(w) == sum(record.fired_at_poll is None for record in added)
    poll(now + 10 * SLOTS * TICK_MS + 1_000)
    assert len(w) == 0

    adds_seen = 0
    polls_seen = 0
    for kind, *_ in steps:
        if kind == "add":
            record = added[adds_seen]
            adds_seen += 1
            fired_at = record.fired_at_poll
            assert fired_at is not None, "lost"
            assert fired_at >= polls_seen
            if record.overdue:
                assert fired_at == polls_seen, "overdue entry not fired by the next poll"
            else:
                deadline = next(
                    p for p in range(polls_seen, len(poll_times))
                    if poll_times[p] >= record.run_at_ms + TICK_MS - 1
                )
                assert fired_at <= deadline, "fired more than a tick late"
        elif kind == "poll":
            polls_seen += 1


# --- memory -------------------------------------------------------------------------


def wheel_allocations() -> int:
    """Bytes traced to the wheel's own code. Not tracemalloc's total: threads left by other
    tests (Kafka, ZooKeeper clients) allocate meanwhile, and the total counts them too."""
    snapshot = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(True, wheel_module.__file__)])
    return sum(stat.size for stat in snapshot.statistics("filename"))


def test_waiting_entries_cost_their_bytes_plus_a_small_fixed_overhead() -> None:
    count = 100_000
    size = 100
    items = [n.to_bytes(4, "big") * (size // 4) for n in range(count)]
    run_ats = [T0 + (n * 7_919) % 120_000 for n in range(count)]  # two minutes; the ring spans 51.2 s
    tracemalloc.start()
    try:
        w = TimingWheel(start_ms=T0, tick_ms=100, slots=512)
        for run_at, payload in zip(run_ats, items, strict=True):
            w.add(run_at, 1, payload)
        added = wheel_allocations()
    finally:
        tracemalloc.stop()
    assert added < count * (size + 24)
    assert abs(w.nbytes - added) <= 0.2 * added
    assert len(w) == count


def test_large_items_in_one_slot_cost_little_more_than_their_bytes() -> None:
    count = 1_000
    size = 10_000
    items = [n.to_bytes(4, "big") * (size // 4) for n in range(count)]
    w = TimingWheel(start_ms=T0)
    empty = w.nbytes
    tracemalloc.start()
    try:
        for n, payload in enumerate(items):
            w.add(T0 + n % 100, 1, payload)
        added = wheel_allocations()
    finally:
        tracemalloc.stop()
    assert added < count * (size + 64)
    assert abs(w.nbytes - empty - added) <= 0.2 * added


def test_a_load_in_run_at_order_costs_a_few_bytes_an_entry_even_with_few_entries_a_slot() -> None:
    # A 60 s spread of 5,000 tasks a second over 64 shards: 78 entries a second per
    # shard, 8 a slot, 150-byte items, read in run_at order as a bucket load sends them.
    count = 4_700
    w = TimingWheel(start_ms=T0 - 60_000)
    empty = w.nbytes
    for n in range(count):
        w.add(T0 + n * 60_000 // count, 9, item(n, 150))
    per_entry = (w.nbytes - empty) / count - 150
    assert per_entry <= 12, per_entry  # a 4-byte header and the slot's chunk, shared by its 8 entries
    fired = [entry for now in range(T0, T0 + 60_100, 100) for entry in w.poll(now)]
    assert numbers(fired) == list(range(count))


def test_adds_alternating_between_slots_keep_their_order_and_cost_no_more_than_in_order() -> None:
    w = wheel(slots=64)
    empty = w.nbytes
    count = 3_000
    for n in range(count):
        w.add(T0 + (n % 3) * 1_000 + n % 7, n % 256, item(n, 100))
    assert (w.nbytes - empty) / count - 100 <= 12
    fired = w.poll(T0 + 3_000)
    assert [entry[0] for entry in fired] == sorted(entry[0] for entry in fired)
    assert len(fired) == count
    for run_at in {entry[0] for entry in fired}:  # equal times come in the order they were added
        same = [number(entry) for entry in fired if entry[0] == run_at]
        assert same == sorted(same)

def test_a_tick_longer_than_two_bytes_of_offset_keeps_whole_times() -> None:
    w = TimingWheel(start_ms=0, tick_ms=100_000, slots=4)
    w.add(99_999, 3, b"late in the slot")
    w.add(1, 4, b"early in the slot")
    assert w.poll(99_999) == [(1, 4, b"early in the slot"), (99_999, 3, b"late in the slot")]
