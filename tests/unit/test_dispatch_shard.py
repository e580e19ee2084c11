"""One shard's firing state, driven by hand with a manual clock: no threads, no I/O."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.dispatcher.rows import (
    SLICE_MS,
    Row,
    Sweep,
    priority_of_tag,
    rows_from,
    should_fire,
    tag_for,
    topic_tags,
    type_slot_of_tag,
)
from scheduler.dispatcher.shard import OwnedShard
from scheduler.model import BUCKET_MS, Priority, Task, decode_message
from scheduler.ports import Lease, StoredTask, TaskStatus
from scheduler.visibility.labels import TypeLabels
from tests.tasks import NINE_OCLOCK_MS, make_task

T0 = NINE_OCLOCK_MS
SHARDS = 4
TOKEN = 77


def owned(start_ms: int = T0 - 30_000, shard: int = 1) -> OwnedShard:
    return OwnedShard(shard=shard, lease=Lease(shard, TOKEN, 1), start_ms=start_ms, shard_count=SHARDS,
                      long_types=frozenset({"report"}), tick_ms=100, verify_grace_ms=1000)


def tasks_at(*offsets_ms: int, shard: int = 1, **fields: object) -> list[Task]:
    found = []
    for offset in offsets_ms:
        while True:
            task = make_task(T0 + offset, **fields)  # type: ignore[arg-type]
            if task.id.shard(SHARDS) == shard:
                found.append(task)
                break
    return found


def load(state: OwnedShard, tasks: list[Task], bucket: int = T0, read_started_ms: int = T0 - 60_000) -> None:
    state.requested_buckets.add(bucket)
    state.add_rows(rows_from([StoredTask(t, TaskStatus.SCHEDULED) for t in tasks], TOKEN, state.long_types))
    state.bucket_loaded(bucket, read_started_ms)


def verify_all(state: OwnedShard, through_ms: int) -> None:
    k = (state.verified_through_ms + 1) // SLICE_MS
    while k * SLICE_MS <= through_ms:
        state.ask_count(k)
        assert not state.slice_counted(k, len(state.slice_keys(k)))
        k += 1


def look_all(state: OwnedShard, now_ms: int) -> None:
    """Every second look due at `now_ms`, answered with what the shard knows (no late rows)."""
    for k in state.slices_to_look(now_ms):
        state.ask_look(k)
        assert not state.slice_looked(k, len(state.slice_keys(k)))


def fired_ids(state: OwnedShard, now_ms: int) -> list[bytes]:
    batch = state.fire(now_ms)
    state.flushed(batch)
    return [decode_message(v).task.id.bytes for values in batch.by_tag.values() for v in values]


def test_loaded_tasks_fire_at_their_time_never_before_and_carry_the_token() -> None:
    state = owned()
    early, late = tasks_at(250, 40_000)
    load(state, [early, late])
    verify_all(state, T0 + BUCKET_MS)

    assert fired_ids(state, T0 + 200) == []
    batch = state.fire(T0 + 299)
    [[value]] = batch.by_tag.values()
    assert decode_message(value).task.id == early.id and decode_message(value).fence == TOKEN
    assert fired_ids(state, T0 + 39_998) == []
    assert fired_ids(state, T0 + 40_099) == [late.id.bytes]


def test_a_task_fires_at_its_own_millisecond_not_at_the_end_of_its_slot() -> None:
    state = owned(start_ms=T0 - 1)
    first, second, third = tasks_at(250, 250, 290)  # one slot of the wheel: T0 + 200 .. 299
    load(state, [first, second, third])
    verify_all(state, T0 + 1_000)

    assert fired_ids(state, T0 + 200) == []  # the slot has begun: taken from the wheel and held, none due
    assert state.waiting == 3 and state.next_due_ms() == T0 + 250
    assert fired_ids(state, T0 + 249) == []
    assert fired_ids(state, T0 + 250) == [first.id.bytes, second.id.bytes]  # equal times: in the order loaded
    assert state.fired_through_ms == T0 + 250 == state.cursor_candidate()
    assert fired_ids(state, T0 + 289) == []
    assert fired_ids(state, T0 + 290) == [third.id.bytes]
    assert state.waiting == 0 and state.next_due_ms() is None


def test_a_held_task_waits_for_a_slice_being_verified_like_the_wheel() -> None:
    state = owned(start_ms=T0 - 1)
    [task] = tasks_at(1_050)
    load(state, [task], read_started_ms=T0 - 60_000)
    verify_all(state, T0 + 999)  # the slice of T0 + 1_000 .. 1_999 is not counted yet
    assert fired_ids(state, T0 + 1_060) == []
    assert state.fired_through_ms == T0 + 999 and state.next_due_ms() is None  # its slot stays in the wheel
    verify_all(state, T0 + 1_999)
    assert fired_ids(state, T0 + 1_061) == [task.id.bytes]


def test_a_cancel_that_comes_while_its_task_is_held_keeps_it_from_firing() -> None:
    state = owned()
    kept, cancelled = tasks_at(250, 260)
    load(state, [kept, cancelled])
    verify_all(state, T0 + 1_000)
    assert fired_ids(state, T0 + 210) == [] and state.waiting == 2  # both held
    state.handed_cancel(cancelled.id.bytes, cancelled.run_at_ms)

    batch = state.fire(T0 + 300)
    assert batch.skipped_cancelled == 1
    assert [decode_message(v).task.id for vs in batch.by_tag.values() for v in vs] == [kept.id]


def test_a_task_handed_into_the_slot_under_way_waits_for_its_time_and_is_counted() -> None:
    state = owned(start_ms=T0 - 1)
    [loaded] = tasks_at(250)
    load(state, [loaded])
    verify_all(state, T0 + 1_000)
    assert fired_ids(state, T0 + 210) == []
    [handed] = tasks_at(230)
    assert state.handed_task(handed)
    assert state.handed_task(loaded)  # a second copy of a held row (a hand-off replayed)
    keys = state.slice_keys(T0 // SLICE_MS)  # what a verify count expects
    assert {(handed.run_at_ms, handed.id.bytes), (loaded.run_at_ms, loaded.id.bytes)} <= keys
    assert state.cursor_candidate() == T0 + 210  # neither holds the cursor back: both are after it

    assert fired_ids(state, T0 + 229) == []
    assert fired_ids(state, T0 + 230) == [handed.id.bytes]
    batch = state.fire(T0 + 260)
    assert [decode_message(v).task.id for vs in batch.by_tag.values() for v in vs] == [loaded.id]
    assert batch.duplicates == 1


passes = st.tuples(st.just("pass"), st.integers(1, 150))
handoffs = st.tuples(st.just("hand"), st.integers(0, 2_999))
copies = st.tuples(st.just("copy"), st.integers(0, 9))
cancels = st.tuples(st.just("cancel"), st.integers(0, 9))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 2_999), min_size=1, max_size=10),
       st.lists(st.one_of(passes, passes, handoffs, copies, cancels), max_size=80))
def test_every_task_fires_once_at_the_first_pass_at_or_after_its_time_never_before(
    loaded_at: list[int], steps: list[tuple[str, int]]
) -> None:
    state = owned()
    loaded = tasks_at(*loaded_at)
    load(state, loaded)
    verify_all(state, T0 + 5_000)
    now = T0 - 50
    passes: list[int] = []
    present: dict[bytes, tuple[int, int]] = {task.id.bytes: (task.run_at_ms, 0) for task in loaded}
    """id -> (run_at, how many passes had been made when it reached the shard)."""
    cancelled: dict[bytes, int] = {}
    """id -> passes made when its cancel came."""
    fired: dict[bytes, int] = {}

    def fire_pass(at: int) -> None:
        batch = state.fire(at)
        state.flushed(batch)
        passes.append(at)
        assert batch.run_ats == sorted(batch.run_ats)  # in run_at order
        for values in batch.by_tag.values():
            for value in values:
                task = decode_message(value).task
                assert task.run_at_ms <= at, "fired before its time"
                assert task.id.bytes not in fired, "fired twice"
                fired[task.id.bytes] = at

    for kind, value in steps:
        if kind == "pass":
            now += value
            fire_pass(now)
        elif kind == "hand":
            [task] = tasks_at(value)
            assert state.handed_task(task)
            present[task.id.bytes] = (task.run_at_ms, len(passes))
        elif kind == "copy":
            task = loaded[value % len(loaded)]
            state.handed_task(task)
        else:
            task_id = loaded[value % len(loaded)].id.bytes
            state.handed_cancel(task_id, T0)
            cancelled.setdefault(task_id, len(passes))
    now = max(now, T0 + 3_000)
    fire_pass(now)

    for task_id, (run_at, reached) in present.items():
        on_time = next(at for at in passes[reached:] if at >= run_at)
        if task_id in cancelled and cancelled[task_id] < passes.index(on_time) + 1:
            assert task_id not in fired
        else:
            assert fired.get(task_id) == on_time
    assert set(fired) <= set(present)
    assert state.waiting == 0


def test_a_handed_off_cancel_keeps_a_loaded_task_from_firing() -> None:
    state = owned()
    kept, cancelled = tasks_at(100, 100)
    load(state, [kept, cancelled])
    verify_all(state, T0 + 1000)
    state.handed_cancel(cancelled.id.bytes, cancelled.run_at_ms)

    batch = state.fire(T0 + 1000)
    assert batch.skipped_cancelled == 1
    assert [decode_message(v).task.id for vs in batch.by_tag.values() for v in vs] == [kept.id]


def test_a_task_both_loaded_and_handed_off_fires_once_whichever_comes_first() -> None:
    state = owned()
    first, second = tasks_at(5_000, 6_000)
    state.requested_buckets.add(T0)
    assert state.handed_task(first)  # the hand-off overtakes the bucket read
    load(state, [first, second])
    assert state.handed_task(second)  # and the other way round: the copy waits in the same slot

    assert len(state.slice_keys((T0 + 5_000) // SLICE_MS)) == 1  # two copies in the wheel, one row
    assert sorted(fired_ids(state, T0 + 10_000)) == sorted([first.id.bytes, second.id.bytes])


def test_an_overdue_hand_off_fires_at_the_next_pass_and_a_future_bucket_is_left_to_its_read() -> None:
    state = owned()
    load(state, [])
    verify_all(state, T0 + 3_000)
    assert fired_ids(state, T0 + 3_000) == []
    [overdue] = tasks_at(1_000)
    [next_minute_after_next] = tasks_at(3 * BUCKET_MS)
    assert state.handed_task(overdue)
    assert not state.handed_task(next_minute_after_next)
    assert fired_ids(state, T0 + 3_000) == [overdue.id.bytes]


def test_a_slice_waits_for_its_count_and_a_missing_row_is_merged_before_it_fires() -> None:
    state = owned()
    loaded, missed = tasks_at(2_100, 2_200)
    load(state, [loaded])
    verify_all(state, T0 + 1_999)

    assert fired_ids(state, T0 + 2_500) == []  # slice 2 s is not verified yet
    k = (T0 + 2_000) // SLICE_MS
    state.ask_count(k)
    assert state.slice_counted(k, 2)  # the store holds one more row than the shard saw
    assert fired_ids(state, T0 + 2_500) == []
    state.slice_reread(k, rows_from([StoredTask(loaded, TaskStatus.SCHEDULED), StoredTask(missed, TaskStatus.SCHEDULED)],
                                    TOKEN, state.long_types))
    assert sorted(fired_ids(state, T0 + 2_500)) == sorted([loaded.id.bytes, missed.id.bytes])


def test_an_unverified_slice_fires_anyway_past_its_grace_but_the_cursor_waits() -> None:
    state = owned(start_ms=T0 - 1)
    [task] = tasks_at(2_100)
    load(state, [task])
    verify_all(state, T0 + 1_999)

    assert fired_ids(state, T0 + 3_000) == []  # within grace: wait for the count
    assert fired_ids(state, T0 + 4_000) == [task.id.bytes]  # past grace: on time matters more
    look_all(state, T0 + 4_000)
    assert state.looked_through_ms == T0 + 2_999
    assert state.cursor_candidate() == T0 + 1_999  # but the cursor does not pass the unverified slice


def test_the_cursor_is_the_least_of_flushed_loaded_verified_and_looked() -> None:
    state = owned(start_ms=T0 - 1)
    assert state.cursor_candidate() == T0 - 1
    load(state, tasks_at(10), read_started_ms=T0 + 5_000)  # read late: its past slices count as verified
    assert state.loaded_through_ms == T0 + BUCKET_MS - 1
    assert state.verified_through_ms == T0 + 4_999
    assert state.cursor_candidate() == T0 - 1  # nothing flushed yet
    fired_ids(state, T0 + 5_900)
    assert state.slices_to_look(T0 + 5_900) == []  # a second look comes a second after the read began
    assert state.cursor_candidate() == T0 + 4_999  # and the cursor need not wait for it (see baselines)


def test_buckets_load_from_the_cursor_through_one_minute_ahead() -> None:
    state = owned(start_ms=T0 - 2 * BUCKET_MS + 5)
    state.max_loading_buckets = 10
    assert state.buckets_to_load(T0 + 1, BUCKET_MS) == [T0, T0 + BUCKET_MS, T0 - 2 * BUCKET_MS, T0 - BUCKET_MS]
    state.requested_buckets.update(state.buckets_to_load(T0 + 1, BUCKET_MS))
    assert state.buckets_to_load(T0 + BUCKET_MS, BUCKET_MS) == [T0 + 2 * BUCKET_MS]


def test_rows_reported_on_or_finished_do_not_fire_but_count_as_seen() -> None:
    task = make_task()
    retry_copy = make_task(attempt=2)
    assert should_fire(StoredTask(task, TaskStatus.SCHEDULED))
    assert not should_fire(StoredTask(task, TaskStatus.RUNNING, 1))  # fired before, by a previous owner
    assert not should_fire(StoredTask(task, TaskStatus.CANCELLED, 1))
    assert should_fire(StoredTask(retry_copy, TaskStatus.FAILED, 1))  # the next attempt is due
    assert not should_fire(StoredTask(retry_copy, TaskStatus.DONE, 1))

    state = owned()
    done, waiting = tasks_at(100, 200)
    state.requested_buckets.add(T0)
    added = state.add_rows(rows_from([StoredTask(done, TaskStatus.DONE, 1), StoredTask(waiting, TaskStatus.SCHEDULED)],
                                     TOKEN, state.long_types))
    assert added == 1 and len(state.slice_keys(T0 // SLICE_MS)) == 2


def test_long_task_types_go_to_the_long_topic_and_others_by_priority() -> None:
    long_types = frozenset({"report"})
    topics = topic_tags({name: f"ready.{name}" for name in ("high", "normal", "low", "long")})
    assert topics[tag_for(make_task(type="report", priority=Priority.HIGH), long_types)] == "ready.long"
    assert topics[tag_for(make_task(priority=Priority.HIGH), long_types)] == "ready.high"
    assert topics[tag_for(make_task(priority=Priority.LOW), long_types)] == "ready.low"
    assert tag_for(make_task(priority=Priority.HIGH), long_types) == Priority.HIGH.code  # no labels: no type bits


def test_a_tag_carries_the_priority_and_the_type_s_label_slot_whatever_the_topic() -> None:
    """The fired counters read priority and type from the tag: nothing is decoded per task."""
    labels = TypeLabels(2)
    topics = topic_tags({name: name for name in ("high", "normal", "low", "long")})
    cases = [("sms", Priority.NORMAL, "normal", "sms"), ("report", Priority.LOW, "long", "report"),
             ("email", Priority.HIGH, "high", "other"), ("sms", Priority.HIGH, "high", "sms")]
    for type_, priority, topic, label in cases:
        tag = tag_for(make_task(type=type_, priority=priority), frozenset({"report"}), labels)
        assert 0 <= tag <= 255
        assert topics[tag] == topic
        assert priority_of_tag(tag) is priority
        assert labels.name(type_slot_of_tag(tag)) == label


def test_rows_at_or_before_the_start_cursor_are_ignored() -> None:
    state = owned(start_ms=T0 + 999)
    state.requested_buckets.add(T0)
    old, new = tasks_at(999, 1_000)
    rows = [Row(t.run_at_ms, t.id.bytes, 1, b"m") for t in (old, new)]
    assert state.add_rows(rows) == 1


def test_counts_through_a_cursor_between_slice_boundaries_count_the_part_of_the_slice_on_each_side() -> None:
    state = owned(start_ms=T0 + 500)
    before, after = tasks_at(400, 600)
    state.requested_buckets.add(T0)
    assert state.handed_task(before)  # into the past, behind the start: fired, but a previous owner's to count
    load(state, [after])
    verify_all(state, T0 + 999)
    fired_ids(state, T0 + 1_000)
    state.baseline[T0] = 3  # what the previous owner handled at or before 09:00:00.500
    assert state.expected(T0, T0 + 550) == 3
    assert state.expected(T0, T0 + 600) == 4


def test_a_count_is_compared_with_what_was_seen_when_it_was_asked_for() -> None:
    state = owned(start_ms=T0 - 1)
    present, missed, late = tasks_at(2_100, 2_200, 2_300)
    load(state, [present])
    verify_all(state, T0 + 1_999)
    k = (T0 + 2_000) // SLICE_MS
    state.ask_count(k)  # the shard knows 1 row; the store holds `present` and `missed`
    assert state.handed_task(late)  # a hand-off lands while the count is in flight
    assert state.slice_counted(k, 2)  # 2 > 1: read again, though the shard now knows 2 rows
    rows = rows_from([StoredTask(t, TaskStatus.SCHEDULED) for t in (present, missed, late)], TOKEN, state.long_types)
    assert state.slice_reread(k, rows) == 1  # only `missed` was new
    assert sorted(fired_ids(state, T0 + 3_000)) == sorted(t.id.bytes for t in (present, missed, late))


def test_a_retry_copy_is_a_row_of_its_own() -> None:
    state = owned(start_ms=T0 - 1)
    [home] = tasks_at(2_000)
    retry = Task(id=home.id, tenant=home.tenant, type=home.type, payload=home.payload, run_at_ms=T0 + 2_500,
                 attempt=2)
    state.requested_buckets.add(T0)
    assert state.handed_task(home)
    load(state, [retry])
    assert len(state.slice_keys((T0 + 2_000) // SLICE_MS)) == 2
    verify_all(state, T0 + 2_999)
    assert fired_ids(state, T0 + 3_000) == [home.id.bytes, home.id.bytes]


def test_a_slice_fired_before_its_count_is_not_fired_again_by_the_re_read() -> None:
    state = owned(start_ms=T0 - 1)
    present, missed = tasks_at(2_100, 2_200)
    load(state, [present])
    verify_all(state, T0 + 1_999)
    assert fired_ids(state, T0 + 4_000) == [present.id.bytes]  # past grace: fired unverified
    k = (T0 + 2_000) // SLICE_MS
    state.ask_count(k)
    assert state.slice_counted(k, 2)
    rows = rows_from([StoredTask(t, TaskStatus.SCHEDULED) for t in (present, missed)], TOKEN, state.long_types)
    assert state.slice_reread(k, rows) == 1
    assert fired_ids(state, T0 + 4_100) == [missed.id.bytes]
    look_all(state, T0 + 4_100)
    assert state.cursor_candidate() == T0 + 2_999  # slice 3 s is not counted yet


def test_a_shard_far_behind_reads_what_is_due_now_first_then_catches_up_in_order() -> None:
    state = owned(start_ms=T0 - 10 * BUCKET_MS)
    now_and_next = state.buckets_to_load(T0, BUCKET_MS)
    assert now_and_next == [T0, T0 + BUCKET_MS]  # whatever the lag
    state.requested_buckets.update(now_and_next)
    assert state.buckets_to_load(T0, BUCKET_MS) == []  # two reads in flight already
    for bucket in now_and_next:
        state.bucket_loaded(bucket, T0)
    behind = state.buckets_to_load(T0, BUCKET_MS)
    assert behind == [T0 - 10 * BUCKET_MS, T0 - 9 * BUCKET_MS]
    state.requested_buckets.update(behind)
    state.bucket_loaded(behind[0], T0)
    assert state.buckets_to_load(T0, BUCKET_MS) == [T0 - 8 * BUCKET_MS]
    assert state.loaded_through_ms == T0 - 9 * BUCKET_MS - 1
    assert state.verified_through_ms == T0 - 9 * BUCKET_MS - 1  # read after it was due: no re-count needed


def test_a_read_that_failed_part_way_resumes_after_what_reached_the_wheel() -> None:
    state = owned(start_ms=T0 - 1)
    first, second = tasks_at(1_000, 2_000)
    state.requested_buckets.add(T0)
    state.add_rows(rows_from([StoredTask(first, TaskStatus.SCHEDULED)], TOKEN, state.long_types))
    state.rows_posted(T0, first.run_at_ms)
    state.bucket_failed(T0, retry_at_ms=T0 + 500)
    assert state.buckets_to_load(T0 + 100, BUCKET_MS) == []  # backing off
    assert T0 in state.buckets_to_load(T0 + 500, BUCKET_MS)
    assert state.resume_after(T0) == first.run_at_ms


def test_what_was_handled_is_remembered_for_the_horizon_and_then_forgotten() -> None:
    state = owned(start_ms=T0 - 1)
    tasks = tasks_at(*range(500, 20_000, 500))
    load(state, tasks)
    verify_all(state, T0 + 19_999)
    fired_ids(state, T0 + 19_999)
    assert len(state.seen) == len(tasks) and state.seen.nbytes == 24 * len(tasks)
    state.forget(T0 + state.horizon_ms)
    assert len(state.seen) == len(tasks)  # still within the horizon
    state.forget(T0 + BUCKET_MS + state.horizon_ms)
    assert len(state.seen) == 0


def test_a_slice_that_never_verifies_holds_the_cursor_however_many_later_ones_do() -> None:
    state = owned(start_ms=T0 - 1)
    tasks = tasks_at(*range(500, 20_000, 500))
    load(state, tasks)
    verify_all(state, T0 + 1_999)
    stuck = (T0 + 2_000) // SLICE_MS
    for k in range(stuck + 1, stuck + 18):  # every later slice verifies, out of order
        state.ask_count(k)
        assert not state.slice_counted(k, len(state.slice_keys(k)))
    fired_ids(state, T0 + 19_500)
    look_all(state, T0 + 21_000)
    assert not state.verified_slices & set(range(stuck + 18, stuck + 100))
    assert state.cursor_candidate() == T0 + 1_999




# Behind the cursor: the second look, the sweep, the record of what was handled.


def test_a_row_written_after_its_slice_fired_is_found_by_the_second_look_and_fires_late_never_early() -> None:
    state = owned(start_ms=T0 - 1)
    on_time, late = tasks_at(1_200, 1_300)
    load(state, [on_time])
    verify_all(state, T0 + 1_999)
    assert fired_ids(state, T0 + 1_999) == [on_time.id.bytes]
    k = (T0 + 1_000) // SLICE_MS
    assert state.slices_to_look(T0 + 2_998) == [k - 1]  # a second after the slice ended, not before
    assert state.slices_to_look(T0 + 2_999) == [k - 1, k]
    state.ask_look(k - 1)
    assert not state.slice_looked(k - 1, 0)
    state.ask_look(k)
    assert state.slice_looked(k, 2)  # `late` was written after the verify count: the store has one more
    rows = rows_from([StoredTask(t, TaskStatus.SCHEDULED) for t in (on_time, late)], TOKEN, state.long_types)
    assert state.slice_reread(k, rows, look=True) == 1
    assert state.cursor_candidate() < late.run_at_ms  # behind the wheel's frontier, not yet fired: holds the cursor
    assert fired_ids(state, T0 + 3_000) == [late.id.bytes]
    assert state.looked_through_ms == T0 + 1_999


def test_a_late_copy_of_a_row_already_fired_is_not_published_again() -> None:
    state = owned(start_ms=T0 - 1)
    [task] = tasks_at(1_500)
    load(state, [task])
    verify_all(state, T0 + 1_999)
    assert fired_ids(state, T0 + 2_000) == [task.id.bytes]
    assert state.handed_task(task)  # a hand-off replayed after a take-over, or a slow one
    batch = state.fire(T0 + 2_100)
    assert batch.by_tag == {} and batch.duplicates == 1
    state.flushed(batch)


def test_the_cursor_never_passes_a_batch_the_queue_has_not_acknowledged() -> None:
    state = owned(start_ms=T0 - 1)
    load(state, [], read_started_ms=T0 - 60_000)
    verify_all(state, T0 + 9_999)
    assert fired_ids(state, T0 + 5_000) == []
    look_all(state, T0 + 7_000)
    assert state.cursor_candidate() == T0 + 5_000  # fired through the moment of the pass
    [late] = tasks_at(2_500)  # a late load, a hand-off into the past: behind every frontier
    state.handed_task(late)
    assert state.cursor_candidate() == T0 + 2_499  # in the wheel, not fired: the cursor stays below it
    batch = state.fire(T0 + 7_000)  # fired, and the queue fails to acknowledge it
    assert batch.floor_ms == late.run_at_ms
    fired_ids(state, T0 + 7_100)
    look_all(state, T0 + 9_000)
    assert state.cursor_candidate() == T0 + 2_499  # later batches acknowledged; this one is not
    state.flushed(batch)
    assert state.cursor_candidate() == T0 + 7_100


def test_a_sweep_finds_a_row_written_into_the_past_and_fires_only_it() -> None:
    state = owned(start_ms=T0 - 1)
    state.horizon_ms = 5 * BUCKET_MS
    first, second = tasks_at(10_000, 20_000)
    load(state, [first, second])
    verify_all(state, T0 + 59_999)
    assert len(fired_ids(state, T0 + 59_999)) == 2
    state.persisted_ms = T0 + 59_999
    state.next_sweep_ms = 0
    sweep = state.sweep_due(T0 + 70_000)  # the first one counts the whole horizon
    assert sweep == Sweep(T0 + 59_999, [T0 - 4 * BUCKET_MS, T0 - 3 * BUCKET_MS, T0 - 2 * BUCKET_MS,
                                        T0 - BUCKET_MS, T0], None)
    assert state.sweep_due(T0 + 70_001) is None  # one at a time
    assert state.swept(sweep, {T0: 2}) == []  # nothing new: no read
    [written_late] = tasks_at(15_000)  # e.g. a keyed task due 09:00:15 submitted at 09:01:10, no hand-off
    state.next_sweep_ms = 0
    recent = state.sweep_due(T0 + 80_000)
    # The next ones count the last 90 s behind the cursor; this close to the start, whole buckets.
    assert recent == Sweep(T0 + 59_999, [T0 - BUCKET_MS, T0], None)
    assert state.swept(recent, {T0: 3}) == [T0]
    rows = rows_from([StoredTask(t, TaskStatus.SCHEDULED) for t in (first, written_late, second)], TOKEN,
                     state.long_types)
    assert state.bucket_reread(T0, rows) == 1
    assert fired_ids(state, T0 + 80_000) == [written_late.id.bytes]
    assert state.expected(T0, recent.through_ms) == 3


def test_a_recent_sweep_counts_the_last_90_seconds_and_every_sixth_the_whole_horizon() -> None:
    state = owned(start_ms=T0 - 1)
    state.persisted_ms = T0 + 5 * BUCKET_MS
    kinds = []
    for n in range(13):
        state.next_sweep_ms = 0
        sweep = state.sweep_due(T0 + 5 * BUCKET_MS + 10_000 + n)
        assert sweep is not None
        kinds.append(sweep.after_ms is None)
        state.swept(sweep, {})
    assert kinds == [True] + [False] * 6 + [True] + [False] * 5
    state.next_sweep_ms = 0
    recent = state.sweep_due(T0 + 6 * BUCKET_MS)
    assert recent == Sweep(T0 + 5 * BUCKET_MS, [T0 + 3 * BUCKET_MS, T0 + 4 * BUCKET_MS, T0 + 5 * BUCKET_MS],
                           T0 + 5 * BUCKET_MS - 90_000)


def test_a_new_owner_sweeps_against_the_counts_written_with_the_cursor() -> None:
    old = owned(start_ms=T0 - 1)
    done, queued = tasks_at(10_000, 20_000)
    load(old, [done, queued])
    verify_all(old, T0 + 59_999)
    fired_ids(old, T0 + 59_999)
    baselines = old.baselines(T0 + 60_000, T0 + 59_999)
    assert baselines[T0] == 2 and T0 - BUCKET_MS not in baselines  # before its start, unknown: not claimed

    new = owned(start_ms=T0 + 59_999)
    new.inherited = baselines
    new.__post_init__()
    assert new.expected(T0, T0 + 59_999) == 2
    [late] = tasks_at(30_000)  # written after the old owner's last look, before the new owner's first
    new.next_sweep_ms = 0
    sweep = new.sweep_due(T0 + 70_000)
    assert sweep is not None and sweep.after_ms is None  # a new owner's first sweep counts the whole horizon
    assert new.swept(sweep, {T0: 3}) == [T0]
    stored = [StoredTask(done, TaskStatus.DONE, 1), StoredTask(late, TaskStatus.SCHEDULED),
              StoredTask(queued, TaskStatus.SCHEDULED)]
    # The new owner cannot tell `queued` (fired by the old owner, no report yet) from `late`: both fire.
    assert new.bucket_reread(T0, rows_from(stored, TOKEN, new.long_types)) == 2
    assert sorted(fired_ids(new, T0 + 70_000)) == sorted([late.id.bytes, queued.id.bytes])
    assert new.swept(sweep, {T0: 3}) == []  # and once read, the bucket matches again


def test_a_bucket_behind_a_cursor_without_counts_is_read_if_it_holds_any_row() -> None:
    state = owned(start_ms=T0 + 59_999)  # inherited None: written by a version without baselines
    state.next_sweep_ms = 0
    sweep = state.sweep_due(T0 + 70_000)
    assert sweep is not None
    assert state.swept(sweep, {T0: 1}) == [T0]
    assert state.expected(T0 - BUCKET_MS, sweep.through_ms) == 0  # an empty one is known from now on


def test_an_unreadable_row_is_dead_lettered_once_counts_as_handled_and_the_shard_goes_on() -> None:
    state = owned(start_ms=T0 - 1)
    good = tasks_at(*range(100, 2_000, 100))
    [bad] = tasks_at(1_050)
    state.requested_buckets.add(T0)
    rows = rows_from([StoredTask(t, TaskStatus.SCHEDULED) for t in good], TOKEN, state.long_types)
    rows.append(Row(bad.run_at_ms, bad.id.bytes, 0, None, letter=b"letter"))
    state.add_rows(rows)
    state.bucket_loaded(T0, T0 - 60_000)
    assert state.cursor_candidate() < bad.run_at_ms  # not dead-lettered yet: holds the cursor
    verify_all(state, T0 + 1_999)
    batch = state.fire(T0 + 2_000)
    assert batch.dead_letters == [b"letter"] and batch.count == len(good)
    state.flushed(batch)
    assert len(state.slice_keys((T0 + 1_000) // SLICE_MS)) == 11  # 10 good and the bad one
    state.add_rows([Row(bad.run_at_ms, bad.id.bytes, 0, None, letter=b"letter")])  # read again (a re-read)
    assert state.fire(T0 + 2_100).dead_letters == []
    look_all(state, T0 + 4_000)
    assert state.cursor_candidate() == T0 + 1_999


def test_a_hand_off_for_a_bucket_whose_read_failed_is_kept() -> None:
    state = owned(start_ms=T0 - 1)
    [task] = tasks_at(BUCKET_MS + 5_000)
    state.read_asked(T0 + BUCKET_MS)
    state.bucket_failed(T0 + BUCKET_MS, retry_at_ms=T0 + 2_000)
    assert state.handed_task(task)  # before: dropped while the read waited to be asked again
    assert T0 + BUCKET_MS in state.buckets_to_load(T0 + 2_000, BUCKET_MS)


def test_a_shard_never_fired_before_knows_nothing_was_handled_behind_its_start() -> None:
    fresh = OwnedShard(shard=1, lease=Lease(1, TOKEN, 1), start_ms=T0 + 59_999, shard_count=SHARDS, never_fired=True)
    fresh.persisted_ms = T0 + 59_999
    assert fresh.baselines(T0 + 60_000, T0 + 59_999)[T0] == 0  # so a next owner is not left guessing
    fresh.next_sweep_ms = 0
    sweep = fresh.sweep_due(T0 + 61_000)
    assert sweep is not None
    assert fresh.swept(sweep, {T0: 1}) == [T0]  # a row there was written behind it: fire it


def test_a_hand_off_of_a_task_already_finished_is_dropped_so_every_row_is_counted_once() -> None:
    state = owned(start_ms=T0 - 1)
    done, waiting = tasks_at(1_200, 1_300)
    state.requested_buckets.add(T0)
    state.add_rows(rows_from([StoredTask(done, TaskStatus.DONE, 1), StoredTask(waiting, TaskStatus.SCHEDULED)],
                             TOKEN, state.long_types))
    state.bucket_loaded(T0, T0 - 60_000)
    assert state.handed_task(done)  # e.g. a keyed submit of it again, after it ran
    verify_all(state, T0 + 1_999)
    assert fired_ids(state, T0 + 2_000) == [waiting.id.bytes]  # its row says finished: not published again
    k = (T0 + 1_000) // SLICE_MS
    assert state.seen.count(k) == 2
    state.ask_look(k)
    assert state.looking[k] == 2  # so a row written late there still shows as one more
    assert state.slice_looked(k, 3)
