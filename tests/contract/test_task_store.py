"""The `TaskStore` contract (`scheduler.ports`), run against every adapter."""

from __future__ import annotations

import sqlite3
import time
from collections import Counter
from contextlib import closing
from dataclasses import replace
from functools import partial
from pathlib import Path

import pytest

from scheduler.adapters.embedded.store import SCHEMA, SqliteTaskStore
from scheduler.errors import ConfigError, InvalidTask
from scheduler.model import BUCKET_MS, MAX_COST, Partition, Priority, Task, TaskId, decode_payload, minute_bucket
from scheduler.ports import BadRow, CancelOutcome, HomeStatus, StatusReport, StoredTask, TaskStatus, TaskStore
from scheduler.retention import (
    DEFAULT_RETENTION_S,
    MAX_RETENTION_S,
    MIN_RETENTION_S,
    cancel_kept_s,
    expires_ms,
    task_expires_ms,
)
from tests.support import all_at_once
from tests.tasks import NINE_OCLOCK_MS, in_partition, make_task


def test_an_inserted_task_is_readable_by_id_and_by_partition(store: TaskStore) -> None:
    task = make_task(NINE_OCLOCK_MS + 250, payload={"to": "+919800000001"}, priority=Priority.HIGH, key="sms-1")
    assert store.insert([task]) == []

    found = store.get(task.id)
    assert found is not None
    assert found.task == task
    assert found.status is TaskStatus.SCHEDULED
    assert decode_payload(found.task.payload) == {"to": "+919800000001"}

    listed = list(store.read_partition(task.partition(store.shard_count)))
    assert [stored.task for stored in listed] == [task]


def test_a_tasks_cost_is_stored_and_read_back_by_every_read(store: TaskStore) -> None:
    costly = replace(make_task(NINE_OCLOCK_MS + 250, key="bulk-sms-1"), cost=500)
    most = replace(make_task(NINE_OCLOCK_MS + 500), cost=MAX_COST)
    plain = make_task(NINE_OCLOCK_MS + 750)
    assert store.insert([costly, most, plain]) == []

    found = store.get_many([costly.id, most.id, plain.id])
    for task in (costly, most, plain):
        stored = store.get(task.id)
        assert stored is not None and stored.task == task
        listed = {row.task.id: row.task for row in store.read_partition(task.partition(store.shard_count))}
        assert listed[task.id] == task
        assert found[task.id].task == task
    assert [found[task.id].task.cost for task in (costly, most, plain)] == [500, MAX_COST, 1]


def test_a_cost_is_replaced_by_a_new_insert_and_kept_by_retry_copies_and_fenced_writes(store: TaskStore) -> None:
    task = replace(make_task(NINE_OCLOCK_MS + 250, key="bulk-sms-2"), cost=500)
    store.insert([task])
    retry = replace(task, run_at_ms=task.run_at_ms + 5000, attempt=2)  # what a worker stores for a retry
    store.insert([retry])
    assert {row.task.attempt: row.task.cost for row in store.read_partition(task.partition(store.shard_count))} \
        == {1: 500, 2: 500}

    store.insert([replace(task, cost=1)])  # the same task submitted again, now of cost 1
    assert store.get(task.id).task.cost == 1  # type: ignore[union-attr]

    next_minute = NINE_OCLOCK_MS + BUCKET_MS  # a partition of its own
    fenced = [replace(each, cost=7) for each in in_partition(store.shard_count, next_minute, 6, 2)]
    assert store.write_fenced(Partition(next_minute, 6), 3, fenced)
    assert [row.task for row in store.read_partition(Partition(next_minute, 6))] == fenced


def test_a_partition_reads_in_run_at_order_across_pages(store: TaskStore) -> None:
    shard = 5
    tasks = in_partition(store.shard_count, NINE_OCLOCK_MS, shard, 23)
    assert store.insert(list(reversed(tasks))) == []

    read = [stored.task for stored in store.read_partition(Partition(NINE_OCLOCK_MS, shard), page_size=4)]
    assert read == sorted(tasks, key=lambda task: (task.run_at_ms, task.id.uuid))
    other = list(store.read_partition(Partition(NINE_OCLOCK_MS, shard + 1)))
    assert other == []


def test_a_range_read_is_after_exclusive_through_inclusive(store: TaskStore) -> None:
    tasks = in_partition(store.shard_count, NINE_OCLOCK_MS, 3, 12)
    assert store.insert(tasks) == []
    times = sorted(task.run_at_ms for task in tasks)
    after, through = times[2], times[8]

    read = store.read_partition(Partition(NINE_OCLOCK_MS, 3), after_ms=after, through_ms=through, page_size=2)
    assert [stored.task.run_at_ms for stored in read] == [t for t in times if after < t <= through]


def test_a_range_count_matches_the_range_read_and_ignores_stray_reports(store: TaskStore) -> None:
    tasks = in_partition(store.shard_count, NINE_OCLOCK_MS, 5, 20)
    assert store.insert(tasks) == []
    partition = Partition(NINE_OCLOCK_MS, 5)
    store.cancel(tasks[0].id, tasks[0].tenant)
    missing = next(t for t in in_partition(store.shard_count, NINE_OCLOCK_MS, 5, 1))
    store.record_status([StatusReport(missing.id, 1, TaskStatus.DONE)])  # a report for a task never stored
    times = sorted(task.run_at_ms for task in tasks)

    for after, through in [(times[0] - 1, times[-1]), (times[3], times[15]), (times[-1], times[-1] + 5000)]:
        read = list(store.read_partition(partition, after_ms=after, through_ms=through))
        assert store.count_partition(partition, after_ms=after, through_ms=through) == len(read)
    assert store.count_partition(partition, after_ms=times[0] - 1, through_ms=times[-1]) == 20


def test_many_tasks_over_many_partitions_are_all_stored(store: TaskStore) -> None:
    tasks = [make_task(NINE_OCLOCK_MS + (n * 37) % (3 * BUCKET_MS), tenant=f"college-{n % 7}") for n in range(1500)]
    assert store.insert(tasks) == []

    expected = Counter(task.partition(store.shard_count) for task in tasks)
    for partition, count in expected.items():
        read = list(store.read_partition(partition))
        assert len(read) == count
        assert all(stored.task.partition(store.shard_count) == partition for stored in read)


def test_inserts_from_several_threads_at_once_all_land(store: TaskStore) -> None:
    batches = [[make_task(NINE_OCLOCK_MS + n, tenant=f"t{thread}") for n in range(200)] for thread in range(4)]
    failures = all_at_once([partial(store.insert, batch) for batch in batches])
    assert failures == [[], [], [], []]
    for batch in batches:
        assert all(store.get(task.id) is not None for task in batch)


def test_inserting_a_task_again_replaces_its_fields_but_keeps_its_status(store: TaskStore) -> None:
    task = make_task(key="order-17", payload={"v": 1})
    store.insert([task])
    assert store.cancel(task.id, task.tenant) is CancelOutcome.CANCELLED

    again = make_task(key="order-17", payload={"v": 2})
    assert again.id == task.id
    store.insert([again])

    found = store.get(task.id)
    assert found is not None
    assert decode_payload(found.task.payload) == {"v": 2}
    assert found.status is TaskStatus.CANCELLED


def test_cancel_answers_for_each_case_and_only_the_owner_can_cancel(store: TaskStore) -> None:
    task = make_task(tenant="college")
    finished = make_task(tenant="college")
    store.insert([task, finished])
    store.record_status([StatusReport(finished.id, 1, TaskStatus.DONE)])

    assert store.cancel(task.id, "board") is CancelOutcome.NOT_FOUND
    assert store.get(task.id).status is TaskStatus.SCHEDULED  # type: ignore[union-attr]
    assert store.cancel(TaskId.new(NINE_OCLOCK_MS), "college") is CancelOutcome.NOT_FOUND
    assert store.cancel(finished.id, "college") is CancelOutcome.FINISHED
    assert store.get(finished.id).status is TaskStatus.DONE  # type: ignore[union-attr]

    assert store.cancel(task.id, "college") is CancelOutcome.CANCELLED
    assert store.get(task.id).status is TaskStatus.CANCELLED  # type: ignore[union-attr]
    assert store.cancel(task.id, "college") is CancelOutcome.ALREADY_CANCELLED


def test_a_stale_attempts_report_never_overwrites_a_newer_one(store: TaskStore) -> None:
    task = make_task()
    store.insert([task])

    def report(attempt: int, status: TaskStatus) -> None:
        store.record_status([StatusReport(task.id, attempt, status)])

    def status() -> tuple[TaskStatus, int]:
        found = store.get(task.id)
        assert found is not None
        return found.status, found.status_attempt

    report(3, TaskStatus.RUNNING)
    report(2, TaskStatus.FAILED)  # attempt 2 failing late
    report(1, TaskStatus.RUNNING)
    assert status() == (TaskStatus.RUNNING, 3)
    report(3, TaskStatus.FAILED)
    report(3, TaskStatus.RUNNING)  # a duplicate delivery of attempt 3 starting again
    assert status() == (TaskStatus.FAILED, 3)
    report(4, TaskStatus.RUNNING)
    assert status() == (TaskStatus.RUNNING, 4)


def test_what_has_finished_stays_finished_whichever_attempt_reports_after(store: TaskStore) -> None:
    """`done` and `dead` stand above every attempt (`report_order`): a copy of attempt 1
    that succeeded late, while a retry of another copy's failure runs, ended the task;
    the retry's reports do not make it look unfinished, and its check skips it."""
    task = make_task()
    store.insert([task])
    store.record_status([StatusReport(task.id, 2, TaskStatus.RUNNING)])
    store.record_status([StatusReport(task.id, 1, TaskStatus.DONE)])
    store.record_status([StatusReport(task.id, 2, TaskStatus.FAILED), StatusReport(task.id, 3, TaskStatus.RUNNING)])
    assert store.statuses([task.id]) == {task.id: HomeStatus(TaskStatus.DONE, 1)}
    store.record_status([StatusReport(task.id, 3, TaskStatus.DEAD)])  # dead outranks done, as within an attempt
    assert store.statuses([task.id]) == {task.id: HomeStatus(TaskStatus.DEAD, 3)}


def test_a_report_for_a_missing_task_creates_nothing_readable(store: TaskStore) -> None:
    ghost = make_task()
    store.record_status([StatusReport(ghost.id, 1, TaskStatus.DONE)])
    assert store.get(ghost.id) is None
    assert list(store.read_partition(ghost.partition(store.shard_count))) == []


def test_a_shard_is_taken_only_by_a_token_at_least_as_new(store: TaskStore) -> None:
    assert store.read_shard(7).lease_token is None
    assert store.take_shard(7, "dispatcher-a", 10)
    assert not store.take_shard(7, "dispatcher-b", 9)
    state = store.read_shard(7)
    assert (state.owner, state.lease_token) == ("dispatcher-a", 10)
    assert store.take_shard(7, "dispatcher-a", 10)
    assert store.take_shard(7, "dispatcher-b", 12)
    assert (store.read_shard(7).owner, store.read_shard(7).lease_token) == ("dispatcher-b", 12)


def test_the_cursor_advances_only_under_the_current_token_and_never_back(store: TaskStore) -> None:
    store.take_shard(1, "a", 10)
    assert not store.advance_shard(1, 9, NINE_OCLOCK_MS)
    assert store.read_shard(1).fired_through_ms is None
    assert store.advance_shard(1, 10, NINE_OCLOCK_MS + 1000)
    assert store.advance_shard(1, 10, NINE_OCLOCK_MS + 2000)
    assert not store.advance_shard(1, 10, NINE_OCLOCK_MS + 1500)
    assert store.read_shard(1).fired_through_ms == NINE_OCLOCK_MS + 2000

    store.take_shard(1, "b", 11)
    assert not store.advance_shard(1, 10, NINE_OCLOCK_MS + 3000)  # the paused old owner
    assert store.read_shard(1).fired_through_ms == NINE_OCLOCK_MS + 2000
    assert store.advance_shard(1, 11, NINE_OCLOCK_MS + 3000)


def test_a_fenced_write_with_a_lower_token_is_refused_and_changes_nothing(store: TaskStore) -> None:
    partition = Partition(NINE_OCLOCK_MS, 9)
    first, second, stale = (in_partition(store.shard_count, NINE_OCLOCK_MS, 9, 3)[i:i + 1] for i in range(3))
    assert store.partition_fence(partition) is None

    assert store.write_fenced(partition, 20, first)  # the first fenced write: fence was null
    assert store.partition_fence(partition) == 20
    assert store.write_fenced(partition, 20, second)
    assert not store.write_fenced(partition, 19, stale)

    assert store.partition_fence(partition) == 20
    assert store.get(stale[0].id) is None
    assert {stored.task.id for stored in store.read_partition(partition)} == {first[0].id, second[0].id}
    assert store.write_fenced(partition, 21, [])
    assert store.partition_fence(partition) == 21


def test_a_fenced_write_refuses_a_task_of_another_partition(store: TaskStore) -> None:
    task = in_partition(store.shard_count, NINE_OCLOCK_MS, 2, 1)[0]
    with pytest.raises(ValueError, match="belongs to"):
        store.write_fenced(Partition(NINE_OCLOCK_MS, 3), 5, [task])
    assert store.get(task.id) is None


def test_a_cancel_overrides_the_status_of_the_latest_reported_attempt(store: TaskStore) -> None:
    task = make_task(tenant="college")
    store.insert([task])
    store.record_status([StatusReport(task.id, 2, TaskStatus.RUNNING)])

    assert store.cancel(task.id, "college") is CancelOutcome.CANCELLED
    found = store.get(task.id)
    assert found is not None
    assert (found.status, found.status_attempt) == (TaskStatus.CANCELLED, 2)


def test_racing_first_fenced_writes_leave_the_newest_token_in_charge(store: TaskStore) -> None:
    """During a take-over the old and new owner may both make the first fenced write of
    a partition; whatever the interleaving, the newest token must win and be told so."""
    tokens = list(range(1, 7))
    for shard in range(20, 25):
        partition = Partition(NINE_OCLOCK_MS, shard)
        tasks = in_partition(store.shard_count, NINE_OCLOCK_MS, shard, len(tokens))
        applied = all_at_once([partial(store.write_fenced, partition, token, [task])
                               for token, task in zip(tokens, tasks, strict=True)])
        answers = dict(zip(tokens, applied, strict=True))
        assert answers[max(tokens)] is True
        assert store.partition_fence(partition) == max(tokens)
        written = {stored.task.id for stored in store.read_partition(partition)}
        assert written == {task.id for task, applied_here in zip(tasks, applied, strict=True) if applied_here}


def test_racing_first_advances_keep_the_furthest_cursor(store: TaskStore) -> None:
    store.take_shard(30, "a", 7)
    targets = [NINE_OCLOCK_MS + n * 1000 for n in range(1, 7)]
    answers = dict(zip(targets, all_at_once([partial(store.advance_shard, 30, 7, target) for target in targets]),
                       strict=True))
    assert answers[max(targets)] is True
    assert store.read_shard(30).fired_through_ms == max(targets)


def test_a_cancel_outranks_every_later_attempt_whatever_the_order_of_the_writes(store: TaskStore) -> None:
    """Attempt 1 failed and its retry (attempt 2) was starting when the cancel came: the
    cancel knew of attempt 1 only. Attempt 2's `running` and `failed`, written after the
    cancel, do not undo it, nor do a third attempt's; the retry's check reads `cancelled`."""
    task = make_task(tenant="college")
    store.insert([task])
    store.record_status([StatusReport(task.id, 1, TaskStatus.FAILED, "timeout")])

    assert store.cancel(task.id, "college") is CancelOutcome.CANCELLED
    store.record_status([StatusReport(task.id, 2, TaskStatus.RUNNING)])
    store.record_status([StatusReport(task.id, 2, TaskStatus.FAILED, "timeout")])
    store.record_status([StatusReport(task.id, 3, TaskStatus.RUNNING), StatusReport(task.id, 3, TaskStatus.FAILED)])

    assert store.statuses([task.id])[task.id].status is TaskStatus.CANCELLED
    found = store.get(task.id)
    assert found is not None and found.status is TaskStatus.CANCELLED and found.error is None
    assert store.cancel(task.id, "college") is CancelOutcome.ALREADY_CANCELLED


def test_a_later_attempts_reports_written_before_the_cancel_are_outranked_too(store: TaskStore) -> None:
    task = make_task(tenant="college")
    store.insert([task])
    store.record_status([StatusReport(task.id, 1, TaskStatus.FAILED), StatusReport(task.id, 2, TaskStatus.FAILED)])
    assert store.cancel(task.id, "college") is CancelOutcome.CANCELLED
    store.record_status([StatusReport(task.id, 3, TaskStatus.RUNNING)])
    assert store.get(task.id).status is TaskStatus.CANCELLED  # type: ignore[union-attr]
    store.record_status([StatusReport(task.id, 3, TaskStatus.DONE)])  # an attempt already running ran: done
    assert store.get(task.id).status is TaskStatus.DONE  # type: ignore[union-attr]


def test_a_cancel_gives_way_to_done_but_not_to_a_late_running(store: TaskStore) -> None:
    finishing, running = make_task(tenant="college"), make_task(tenant="college")
    store.insert([finishing, running])
    assert store.cancel(finishing.id, "college") is CancelOutcome.CANCELLED
    store.record_status([StatusReport(finishing.id, 1, TaskStatus.DONE)])
    assert store.get(finishing.id).status is TaskStatus.DONE  # type: ignore[union-attr]

    assert store.cancel(running.id, "college") is CancelOutcome.CANCELLED
    store.record_status([StatusReport(running.id, 1, TaskStatus.RUNNING)])
    store.record_status([StatusReport(running.id, 1, TaskStatus.FAILED)])
    assert store.get(running.id).status is TaskStatus.CANCELLED  # type: ignore[union-attr]


def test_inserting_a_task_again_without_its_key_keeps_the_key(store: TaskStore) -> None:
    keyed = make_task(key="order-3")
    store.insert([keyed])
    store.insert([Task(id=keyed.id, tenant=keyed.tenant, type=keyed.type, payload=keyed.payload,
                       run_at_ms=keyed.run_at_ms)])
    assert store.get(keyed.id).task.idempotency_key == "order-3"  # type: ignore[union-attr]


def test_a_page_size_below_one_is_refused(store: TaskStore) -> None:
    with pytest.raises(ValueError, match="page_size"):
        list(store.read_partition(Partition(NINE_OCLOCK_MS, 0), page_size=0))


def test_the_store_records_when_it_was_created(store: TaskStore) -> None:
    import time

    created = store.created_ms
    assert created is not None
    assert 0 <= time.time_ns() // 1_000_000 - created < 3_600_000


# get_many and statuses: the worker's check of a polled batch.


def as_statuses(found: dict[TaskId, StoredTask]) -> dict[TaskId, HomeStatus]:
    return {task_id: HomeStatus(stored.status, stored.status_attempt) for task_id, stored in found.items()}


def test_get_many_returns_exactly_the_existing_home_rows_with_their_statuses(store: TaskStore) -> None:
    shards = store.shard_count
    here = in_partition(shards, NINE_OCLOCK_MS, 4, 6, tenant="college")
    elsewhere = [make_task(NINE_OCLOCK_MS + BUCKET_MS * m + n * 101, tenant="college") for m in range(3) for n in range(5)]
    store.insert(here + elsewhere)
    cancelled, done, failed = here[0], here[1], elsewhere[0]
    assert store.cancel(cancelled.id, "college") is CancelOutcome.CANCELLED
    store.record_status([StatusReport(done.id, 1, TaskStatus.DONE),
                         StatusReport(failed.id, 1, TaskStatus.FAILED, error="gateway said 503")])
    missing_here = in_partition(shards, NINE_OCLOCK_MS, 4, 8)[6:]  # same partition, never stored
    missing_elsewhere = [TaskId.new(NINE_OCLOCK_MS + 7 * BUCKET_MS + n) for n in range(3)]  # partitions never written
    ghost = make_task(NINE_OCLOCK_MS + 250)
    store.record_status([StatusReport(ghost.id, 1, TaskStatus.DONE)])  # a report for a task never stored

    wanted = [task.id for task in here + elsewhere] + [t.id for t in missing_here] + missing_elsewhere + [ghost.id]
    found = store.get_many(wanted + [here[2].id, elsewhere[3].id])  # repeats are harmless
    statuses = store.statuses(wanted + [here[2].id, elsewhere[3].id])

    assert set(found) == {task.id for task in here + elsewhere}
    for task in here + elsewhere:
        assert found[task.id] == store.get(task.id)
        assert found[task.id].task == task
    assert found[cancelled.id].status is TaskStatus.CANCELLED
    assert (found[done.id].status, found[done.id].status_attempt) == (TaskStatus.DONE, 1)
    assert (found[failed.id].status, found[failed.id].error) == (TaskStatus.FAILED, "gateway said 503")
    assert found[here[3].id].status is TaskStatus.SCHEDULED and found[here[3].id].error is None
    assert store.get_many([]) == {}
    assert store.get_many([t.id for t in missing_here]) == {}
    # The same verdicts, read without the rest of the row; a report on a row that holds
    # nothing else (Cassandra keeps one: a report is a write) still says what it says.
    ghost_says = statuses.pop(ghost.id, None)
    assert ghost_says in (None, HomeStatus(TaskStatus.DONE, 1))
    assert statuses == as_statuses(found)
    assert store.statuses([]) == {} and store.statuses([t.id for t in missing_here]) == {}


def test_get_many_reads_the_home_row_never_a_retry_copy(store: TaskStore) -> None:
    home = make_task(NINE_OCLOCK_MS + 1000)
    store.insert([home])
    store.record_status([StatusReport(home.id, 1, TaskStatus.FAILED, error="timeout")])
    # Copies for later attempts, at later times: one in the home row's own partition, one a minute on.
    same_partition = replace(home, run_at_ms=home.run_at_ms + 5000, attempt=2)
    next_minute = replace(home, run_at_ms=home.run_at_ms + BUCKET_MS, attempt=3)
    assert same_partition.partition(store.shard_count) == home.partition(store.shard_count)
    store.insert([same_partition, next_minute])
    # A task whose only row is a copy has no home row: it is not found.
    orphan = make_task(NINE_OCLOCK_MS + 2000)
    store.insert([replace(orphan, run_at_ms=orphan.run_at_ms + 3000, attempt=2)])

    found = store.get_many([home.id, orphan.id])

    assert store.statuses([home.id, orphan.id]) == {home.id: HomeStatus(TaskStatus.FAILED, 1)}
    assert set(found) == {home.id}
    assert found[home.id].task == home
    assert (found[home.id].status, found[home.id].error) == (TaskStatus.FAILED, "timeout")
    assert found[home.id] == store.get(home.id)


def test_get_many_reads_big_batches_over_many_partitions(store: TaskStore) -> None:
    crowded = in_partition(store.shard_count, NINE_OCLOCK_MS, 11, 230)  # more than one query's worth of ids
    spread = [make_task(NINE_OCLOCK_MS + (n * 113) % (2 * BUCKET_MS)) for n in range(400)]
    assert store.insert(crowded + spread) == []
    store.record_status([StatusReport(task.id, 1, TaskStatus.RUNNING) for task in crowded[::7]])
    missing = [TaskId.new(task.run_at_ms) for task in spread[::5]]

    found = store.get_many([task.id for task in crowded + spread] + missing)
    assert store.statuses([task.id for task in crowded + spread] + missing) == as_statuses(found)

    assert {task_id: stored.task for task_id, stored in found.items()} == {task.id: task for task in crowded + spread}
    assert {task_id for task_id, stored in found.items() if stored.status is TaskStatus.RUNNING} == {
        task.id for task in crowded[::7]
    }


# Errors reported with a status.


def test_a_failed_report_keeps_its_error_for_every_read(store: TaskStore) -> None:
    task = make_task()
    store.insert([task])
    store.record_status([StatusReport(task.id, 1, TaskStatus.FAILED, error="SMS gateway: invalid number +1")])

    by_id = store.get(task.id)
    assert by_id is not None
    assert (by_id.status, by_id.status_attempt, by_id.error) == (TaskStatus.FAILED, 1, "SMS gateway: invalid number +1")
    assert store.get_many([task.id])[task.id] == by_id
    assert list(store.read_partition(task.partition(store.shard_count))) == [by_id]


def test_a_later_attempts_report_replaces_the_status_and_the_error(store: TaskStore) -> None:
    task = make_task()
    store.insert([task])

    def state() -> tuple[TaskStatus, int, str | None]:
        found = store.get(task.id)
        assert found is not None
        return found.status, found.status_attempt, found.error

    store.record_status([StatusReport(task.id, 1, TaskStatus.FAILED, error="first failure")])
    store.record_status([StatusReport(task.id, 2, TaskStatus.RUNNING)])
    assert state() == (TaskStatus.RUNNING, 2, None)
    store.record_status([StatusReport(task.id, 2, TaskStatus.FAILED, error="second failure")])
    assert state() == (TaskStatus.FAILED, 2, "second failure")
    store.record_status([StatusReport(task.id, 3, TaskStatus.DEAD, error="gave up")])
    assert state() == (TaskStatus.DEAD, 3, "gave up")


def test_a_stale_report_with_an_error_changes_neither_status_nor_error(store: TaskStore) -> None:
    task, finished = make_task(), make_task()
    store.insert([task, finished])
    store.record_status([StatusReport(task.id, 2, TaskStatus.FAILED, error="attempt 2 failed")])
    store.record_status([StatusReport(finished.id, 1, TaskStatus.DONE)])

    store.record_status([StatusReport(task.id, 1, TaskStatus.FAILED, error="attempt 1, late")])
    store.record_status([StatusReport(task.id, 2, TaskStatus.RUNNING, error="a duplicate start")])
    store.record_status([StatusReport(finished.id, 1, TaskStatus.FAILED, error="late failure of a done attempt")])

    found, done = store.get(task.id), store.get(finished.id)
    assert found is not None and done is not None
    assert (found.status, found.status_attempt, found.error) == (TaskStatus.FAILED, 2, "attempt 2 failed")
    assert (done.status, done.error) == (TaskStatus.DONE, None)


def test_a_cancel_clears_the_error_of_the_status_it_replaces(store: TaskStore) -> None:
    task = make_task(tenant="college")
    store.insert([task])
    store.record_status([StatusReport(task.id, 1, TaskStatus.FAILED, error="boom")])
    assert store.cancel(task.id, "college") is CancelOutcome.CANCELLED
    found = store.get(task.id)
    assert found is not None
    assert (found.status, found.error) == (TaskStatus.CANCELLED, None)


def test_a_long_error_is_kept_cut_to_a_bound_and_says_so(store: TaskStore) -> None:
    task = make_task()
    store.insert([task])
    error = "Traceback (most recent call last):\n" + "  File 'handler.py', line 1\n" * 2000
    store.record_status([StatusReport(task.id, 1, TaskStatus.FAILED, error=error)])
    found = store.get(task.id)
    assert found is not None and found.error is not None
    assert len(found.error) <= 2000
    assert found.error.startswith(error[:1500])
    assert f"[{len(error)} characters, cut]" in found.error


def test_an_embedded_store_made_before_errors_existed_gains_the_column_when_opened(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    old = sqlite3.connect(path)
    old_schema = SCHEMA.replace("    last_error      TEXT,\n", "")
    assert old_schema != SCHEMA
    old.executescript(old_schema)
    old.close()
    task = make_task()
    with closing(SqliteTaskStore(path)) as store:
        store.insert([task])
        store.record_status([StatusReport(task.id, 1, TaskStatus.FAILED, error="after the upgrade")])
        assert store.get(task.id).error == "after the upgrade"  # type: ignore[union-attr]
    with closing(SqliteTaskStore(path)) as again:  # opening it again changes nothing
        assert again.get_many([task.id])[task.id].error == "after the upgrade"


def test_an_embedded_store_made_before_costs_existed_gains_the_column_and_reads_old_rows_as_cost_1(
    tmp_path: Path,
) -> None:
    path = tmp_path / "old.db"
    old = sqlite3.connect(path)
    old_schema = SCHEMA.replace("    cost            INTEGER,\n", "")
    assert old_schema != SCHEMA
    old.executescript(old_schema)
    task = make_task()
    old.execute(  # a row as the store wrote it before tasks had a cost
        "INSERT INTO tasks (minute_bucket, shard, run_at, task_id, tenant, type, priority, payload, attempt, "
        "max_attempts, idempotency_key) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (task.minute_bucket, task.id.shard(64), task.run_at_ms, task.id.bytes, task.tenant, task.type,
         task.priority.code, task.payload, task.attempt, task.max_attempts, task.idempotency_key),
    )
    old.commit()
    old.close()
    costly = replace(make_task(), cost=500)
    with closing(SqliteTaskStore(path)) as store:
        assert store.get(task.id).task == task  # type: ignore[union-attr]
        assert store.get_many([task.id])[task.id].task.cost == 1
        store.insert([costly])
        assert store.get(costly.id).task.cost == 500  # type: ignore[union-attr]
    with closing(SqliteTaskStore(path)) as again:  # opening it again changes nothing
        assert [again.get(t.id).task.cost for t in (task, costly)] == [1, 500]  # type: ignore[union-attr]


# The dispatcher's safety net and definite cancels.


def write_unreadable_row(store: TaskStore, task: Task, priority: int = 9) -> None:
    """A row no `Task` can be made of (priority code 9), written around the store, as another
    tool or a hand-written CQL INSERT could."""
    bucket, shard = task.minute_bucket, task.id.shard(store.shard_count)
    if isinstance(store, SqliteTaskStore):
        with closing(sqlite3.connect(store.path)) as db, db:
            db.execute("INSERT INTO tasks (minute_bucket, shard, run_at, task_id, tenant, type, priority, payload, "
                       "attempt, max_attempts) VALUES (?, ?, ?, ?, ?, ?, ?, ?, 1, 5)",
                       (bucket, shard, task.run_at_ms, task.id.bytes, task.tenant, task.type, priority, task.payload))
        return
    from scheduler.adapters.cassandra.store import CassandraTaskStore
    from scheduler.model import from_ms

    assert isinstance(store, CassandraTaskStore)
    store.connection.session.execute(
        f"INSERT INTO {store.keyspace}.tasks_by_bucket (minute_bucket, shard, run_at, task_id, tenant, type, "
        "priority, payload, attempt, max_attempts) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, 1, 5)",
        (from_ms(bucket), shard, from_ms(task.run_at_ms), task.id.uuid, task.tenant, task.type, priority,
         task.payload))


def test_a_row_that_is_not_a_task_is_reported_in_its_place_and_the_others_are_read(store: TaskStore) -> None:
    good = in_partition(store.shard_count, NINE_OCLOCK_MS, 4, 5)
    assert store.insert(good[:2] + good[3:]) == []
    write_unreadable_row(store, good[2])
    partition = Partition(NINE_OCLOCK_MS, 4)
    with pytest.raises(InvalidTask, match="priority"):
        list(store.read_partition(partition))
    bad: list[BadRow] = []
    read = [stored.task for stored in store.read_partition(partition, on_bad_row=bad.append, page_size=2)]
    assert read == good[:2] + good[3:]
    [row] = bad
    assert (row.partition, row.run_at_ms, row.task_id) == (partition, good[2].run_at_ms, good[2].id.bytes)
    assert row.fields["priority"] == 9 and row.fields["tenant"] == "board" and "priority" in row.reason
    assert store.count_partition(partition, after_ms=NINE_OCLOCK_MS - 1, through_ms=NINE_OCLOCK_MS + BUCKET_MS) == 5


def test_buckets_are_counted_through_a_cursor_in_one_request(store: TaskStore) -> None:
    buckets = [NINE_OCLOCK_MS + n * BUCKET_MS for n in range(4)]
    first = in_partition(store.shard_count, buckets[0], 2, 3)
    third = in_partition(store.shard_count, buckets[2], 2, 4)
    elsewhere = in_partition(store.shard_count, buckets[0], 3, 2)
    assert store.insert(first + third + elsewhere) == []
    assert store.cancel(first[0].id, "board") is CancelOutcome.CANCELLED  # cancelled rows count: they are rows
    assert store.count_buckets(2, buckets, buckets[3]) == {buckets[0]: 3, buckets[2]: 4}
    through = sorted(task.run_at_ms for task in third)[1]
    assert store.count_buckets(2, buckets, through) == {buckets[0]: 3, buckets[2]: 2}
    assert store.count_buckets(2, [], through) == {}
    after = sorted(task.run_at_ms for task in first)[0]  # a range: only what is after the first
    assert store.count_buckets(2, buckets, through, after) == {buckets[0]: 2, buckets[2]: 2}
    assert store.count_buckets(2, buckets, through, through) == {}


def test_baselines_are_written_with_the_cursor_and_kept_when_none_are_given(store: TaskStore) -> None:
    assert store.take_shard(5, "a", 10)
    assert store.read_shard(5).baselines is None
    assert store.advance_shard(5, 10, NINE_OCLOCK_MS, {NINE_OCLOCK_MS - BUCKET_MS: 7, NINE_OCLOCK_MS: 0})
    assert store.read_shard(5).baselines == {NINE_OCLOCK_MS - BUCKET_MS: 7, NINE_OCLOCK_MS: 0}
    assert store.advance_shard(5, 10, NINE_OCLOCK_MS + 1000)
    assert store.read_shard(5).baselines == {NINE_OCLOCK_MS - BUCKET_MS: 7, NINE_OCLOCK_MS: 0}
    assert store.advance_shard(5, 10, NINE_OCLOCK_MS + 2000, {NINE_OCLOCK_MS: 3})
    assert store.take_shard(5, "b", 11)
    assert not store.advance_shard(5, 10, NINE_OCLOCK_MS + 3000, {NINE_OCLOCK_MS: 99})  # the old owner: refused
    state = store.read_shard(5)
    assert (state.fired_through_ms, state.baselines) == (NINE_OCLOCK_MS + 2000, {NINE_OCLOCK_MS: 3})


def test_a_cancel_of_a_task_that_may_be_in_flight_raises_its_shards_mark(store: TaskStore) -> None:
    now = int(time.time() * 1000)
    soon, later, far = make_task(now + 5_000), make_task(now - 30_000, key="past"), make_task(now + 3_600_000)
    assert store.insert([soon, later, far]) == []
    before = store.read_cancel_marks()
    assert store.cancel(far.id, "board") is CancelOutcome.CANCELLED  # in no wheel yet: no mark
    assert store.read_cancel_marks() == before
    assert store.cancel(soon.id, "board") is CancelOutcome.CANCELLED
    marks = store.read_cancel_marks()
    shard = soon.id.shard(store.shard_count)
    assert now - 1_000 <= marks.at[shard] <= int(time.time() * 1000)
    assert marks.counts[shard] == before.counts.get(shard, 0) + 1
    assert store.cancel(soon.id, "board") is CancelOutcome.ALREADY_CANCELLED  # asked again: marked again
    assert store.read_cancel_marks().counts[shard] == marks.counts[shard] + 1
    assert store.cancel(later.id, "board") is CancelOutcome.CANCELLED
    assert store.read_cancel_marks().counts.get(later.id.shard(store.shard_count), 0) >= 1
    assert store.cancel(soon.id, "college") is CancelOutcome.NOT_FOUND


def test_each_attempts_record_is_kept_beside_the_status_and_never_erased_by_a_report_without_one(
        store: TaskStore) -> None:
    task = make_task()
    store.insert([task])
    assert store.attempts(task.id) == {}
    store.record_status([StatusReport(task.id, 1, TaskStatus.RUNNING)])
    store.record_status([StatusReport(task.id, 1, TaskStatus.FAILED, "timed out", '{"outcome":"failed"}')])
    store.record_status([StatusReport(task.id, 2, TaskStatus.RUNNING)])
    store.record_status([StatusReport(task.id, 2, TaskStatus.DONE, None, '{"outcome":"done"}'),
                         StatusReport(task.id, 1, TaskStatus.RUNNING)])  # a late repeat of attempt 1 starting
    assert store.attempts(task.id) == {1: '{"outcome":"failed"}', 2: '{"outcome":"done"}'}
    found = store.get(task.id)
    assert found is not None and (found.status, found.status_attempt) == (TaskStatus.DONE, 2)
    assert store.attempts(make_task().id) == {}


# Retention: how long a partition's rows are kept (`scheduler.retention`).

DAY_MS = 86_400_000


def test_the_retention_is_seven_days_unless_set(store: TaskStore) -> None:
    assert store.retention_s == DEFAULT_RETENTION_S == 7 * 86_400


@pytest.mark.parametrize("bad", [0, MIN_RETENTION_S - 1, MAX_RETENTION_S + 1, True, -60, 3600.0])
def test_a_retention_that_is_not_one_is_refused_and_changes_nothing(store: TaskStore, bad: object) -> None:
    store.set_retention(3_600)
    with pytest.raises(ConfigError):
        store.set_retention(bad)  # type: ignore[arg-type]
    assert store.retention_s == 3_600


def test_a_retention_set_is_the_stores_at_once(store: TaskStore) -> None:
    store.set_retention(MIN_RETENTION_S)
    assert store.retention_s == MIN_RETENTION_S
    store.set_retention(MAX_RETENTION_S)
    assert store.retention_s == MAX_RETENTION_S


def test_a_purge_keeps_every_partition_not_yet_expired(store: TaskStore) -> None:
    now = time.time_ns() // 1_000_000
    soon = make_task(now + 60_000)
    later = make_task(now + 30 * DAY_MS)
    store.insert([soon, later])
    store.record_status([StatusReport(soon.id, 1, TaskStatus.DONE)])

    removed = store.purge_expired(now, 1_000)

    assert isinstance(removed, int) and removed >= 0
    assert set(store.get_many([soon.id, later.id])) == {soon.id, later.id}
    assert store.get(soon.id).status is TaskStatus.DONE  # type: ignore[union-attr]


# On the embedded store the purge deletes (Cassandra's TTLs need none: tested with its adapter).

SOON_MS = minute_bucket(time.time_ns() // 1_000_000 + DAY_MS)
"""A minute tomorrow: its rows, written now, are written before their minute ends, so
they are kept until it ends plus the retention."""


def test_an_embedded_purge_with_a_limit_below_one_is_refused(tmp_path: Path) -> None:
    with closing(SqliteTaskStore(tmp_path / "tasks.db")) as store, pytest.raises(ValueError, match="limit"):
        store.purge_expired(time.time_ns() // 1_000_000, 0)


def finished_partition(store: SqliteTaskStore, bucket_ms: int, shard: int, count: int) -> list[Task]:
    tasks = in_partition(store.shard_count, bucket_ms, shard, count)
    assert store.insert(tasks) == []
    store.record_status([StatusReport(task.id, 1, TaskStatus.DONE) for task in tasks])
    return tasks


def rows_of(store: SqliteTaskStore, bucket_ms: int, shard: int) -> int:
    return sum(1 for _ in store.read_partition(Partition(bucket_ms, shard)))


def test_an_expired_partition_is_purged_whole_and_a_live_one_is_kept(tmp_path: Path) -> None:
    with closing(SqliteTaskStore(tmp_path / "tasks.db")) as store:
        old = finished_partition(store, SOON_MS, 3, 5)
        unfinished = in_partition(store.shard_count, SOON_MS, 7, 2)
        store.insert(unfinished)
        live = finished_partition(store, SOON_MS + BUCKET_MS, 3, 4)
        expired_at = expires_ms(SOON_MS, DEFAULT_RETENTION_S)
        assert task_expires_ms(old[0].id, store.retention_s) == expired_at

        assert store.purge_expired(expired_at - 1, 1_000) == 0  # a millisecond early: all kept
        assert store.count() == 11

        assert store.purge_expired(expired_at, 1_000) == 7  # both partitions of nine o'clock, whatever their status
        assert store.get(old[0].id) is None
        assert store.get_many([task.id for task in old + unfinished]) == {}
        assert rows_of(store, SOON_MS, 3) == rows_of(store, SOON_MS, 7) == 0
        assert {stored.task.id for stored in store.read_partition(Partition(SOON_MS + BUCKET_MS, 3))} \
            == {task.id for task in live}
        assert store.purge_expired(expired_at, 1_000) == 0


def test_a_purge_deletes_at_most_its_limit_oldest_partition_first(tmp_path: Path) -> None:
    with closing(SqliteTaskStore(tmp_path / "tasks.db")) as store:
        first = finished_partition(store, SOON_MS, 2, 5)
        second = finished_partition(store, SOON_MS + BUCKET_MS, 2, 5)
        now = expires_ms(SOON_MS + BUCKET_MS, store.retention_s)

        assert store.purge_expired(now, 3) == 3
        assert rows_of(store, SOON_MS, 2) == 2 and rows_of(store, SOON_MS + BUCKET_MS, 2) == 5
        assert store.purge_expired(now, 3) == 3
        assert rows_of(store, SOON_MS, 2) == 0 and rows_of(store, SOON_MS + BUCKET_MS, 2) == 4
        assert store.purge_expired(now, 100) == 4
        assert store.get_many([task.id for task in first + second]) == {}
        assert store.count() == 0


def test_a_purged_partitions_fence_goes_with_it(tmp_path: Path) -> None:
    with closing(SqliteTaskStore(tmp_path / "tasks.db")) as store:
        old, live = Partition(SOON_MS, 1), Partition(SOON_MS + 10 * BUCKET_MS, 1)
        assert store.write_fenced(old, 4, in_partition(store.shard_count, old.minute_bucket, 1, 3))
        assert store.write_fenced(live, 4, in_partition(store.shard_count, live.minute_bucket, 1, 1))
        now = expires_ms(old.minute_bucket, store.retention_s)

        assert store.purge_expired(now, 3) == 3  # the limit is spent on the rows: the fence waits
        assert store.partition_fence(old) == 4
        assert store.purge_expired(now, 3) == 1
        assert store.partition_fence(old) is None
        assert store.partition_fence(live) == 4 and rows_of(store, live.minute_bucket, 1) == 1


def test_a_changed_retention_applies_to_rows_written_after_it_and_a_longer_one_to_all(tmp_path: Path) -> None:
    """As on Cassandra, a row keeps the end its write gave it; a longer retention set
    later keeps rows already stored longer too (the purge reads the file's)."""
    with closing(SqliteTaskStore(tmp_path / "tasks.db")) as store:
        before = finished_partition(store, SOON_MS, 5, 3)
        store.set_retention(3_000)  # 50 minutes
        after = finished_partition(store, SOON_MS, 6, 2)
        hour_later = SOON_MS + 60 * BUCKET_MS
        assert store.purge_expired(hour_later, 100) == 2  # written with 50 minutes
        assert all(store.get(task.id) is not None for task in before)  # written with 7 days
        assert all(store.get(task.id) is None for task in after)
        store.set_retention(8 * 86_400)
        assert store.purge_expired(expires_ms(SOON_MS, DEFAULT_RETENTION_S), 100) == 0
        assert store.purge_expired(expires_ms(SOON_MS, 8 * 86_400), 100) == 3


def test_a_task_written_after_its_minute_is_kept_the_retention_from_its_write(tmp_path: Path) -> None:
    with closing(SqliteTaskStore(tmp_path / "tasks.db")) as store:
        now = time.time_ns() // 1_000_000
        late = make_task(now - 30 * DAY_MS)  # its partition expired 23 days ago
        assert store.insert([late]) == []
        assert store.purge_expired(now + DEFAULT_RETENTION_S * 1000 - 60_000, 100) == 0
        assert store.get(late.id) is not None
        assert store.purge_expired(now + DEFAULT_RETENTION_S * 1000 + 60_000, 100) == 1


def test_a_cancelled_task_is_kept_as_long_as_a_retry_it_stops_may_wait(tmp_path: Path) -> None:
    with closing(SqliteTaskStore(tmp_path / "tasks.db")) as store:
        store.set_retention(MIN_RETENTION_S)
        now = time.time_ns() // 1_000_000
        task = make_task(now + 60 * BUCKET_MS)
        store.insert([task])
        assert store.cancel(task.id, task.tenant) is CancelOutcome.CANCELLED
        assert store.purge_expired(expires_ms(task.minute_bucket, MIN_RETENTION_S) + DAY_MS, 100) == 0
        assert store.get(task.id).status is TaskStatus.CANCELLED  # type: ignore[union-attr]
        assert store.purge_expired(now + (cancel_kept_s(MIN_RETENTION_S) + 60) * 1000, 100) == 1


def test_a_retention_is_recorded_in_the_file_and_a_purge_follows_another_processes_change(tmp_path: Path) -> None:
    path = tmp_path / "tasks.db"
    with closing(SqliteTaskStore(path)) as purger, closing(SqliteTaskStore(path)) as other:
        tasks = finished_partition(purger, SOON_MS, 6, 2)
        other.set_retention(14 * 86_400)
        assert purger.retention_s == DEFAULT_RETENTION_S  # as read when it was opened
        assert purger.purge_expired(expires_ms(SOON_MS, DEFAULT_RETENTION_S), 100) == 0  # the purge reads the file's
        assert purger.retention_s == 14 * 86_400
        assert purger.purge_expired(expires_ms(SOON_MS, 14 * 86_400), 100) == 2
        assert purger.get(tasks[0].id) is None
    with closing(SqliteTaskStore(path)) as reopened:
        assert reopened.retention_s == 14 * 86_400


def test_a_refused_retention_leaves_the_file_as_it_was(tmp_path: Path) -> None:
    path = tmp_path / "tasks.db"
    with closing(SqliteTaskStore(path)) as store:
        store.set_retention(7_200)
        with pytest.raises(ConfigError):
            store.set_retention(59)
    with closing(SqliteTaskStore(path)) as reopened:
        assert reopened.retention_s == 7_200


def test_an_embedded_store_made_before_retention_existed_keeps_the_default(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    with closing(SqliteTaskStore(path)) as store:
        task = make_task()
        store.insert([task])
    with closing(sqlite3.connect(path)) as db, db:  # as the store left files before it recorded a retention
        db.execute("DELETE FROM meta WHERE name = 'retention_s'")
    with closing(SqliteTaskStore(path)) as store:
        assert store.retention_s == DEFAULT_RETENTION_S
        assert store.purge_expired(expires_ms(task.minute_bucket, DEFAULT_RETENTION_S) - 1, 10) == 0
        assert store.get(task.id) is not None


def test_a_recorded_retention_that_is_not_one_is_refused_when_the_store_opens(tmp_path: Path) -> None:
    path = tmp_path / "tasks.db"
    SqliteTaskStore(path).close()
    with closing(sqlite3.connect(path)) as db, db:
        db.execute("UPDATE meta SET value = '5' WHERE name = 'retention_s'")
    with pytest.raises(ConfigError, match="retention"):
        SqliteTaskStore(path)


def test_a_partition_no_shard_has_fired_through_is_never_purged(tmp_path: Path) -> None:
    """A machine switched off for longer than the retention: its dispatchers' cursors are
    far behind, and the tasks they have not fired yet stay until they have."""
    with closing(SqliteTaskStore(tmp_path / "tasks.db", clock_ms=lambda: SOON_MS - 60_000)) as store:
        tasks = in_partition(store.shard_count, SOON_MS, 4, 3)
        assert store.insert(tasks) == []
        later = expires_ms(SOON_MS, store.retention_s) + DAY_MS
        for shard in range(store.shard_count - 1):
            assert store.take_shard(shard, "d", 1) and store.advance_shard(shard, 1, later)
        assert store.take_shard(store.shard_count - 1, "d", 1)  # taken, never fired
        assert store.purge_expired(later, 100) == 0
        assert store.advance_shard(store.shard_count - 1, 1, SOON_MS - 1)  # behind the minute still
        assert store.purge_expired(later, 100) == 0
        assert store.advance_shard(store.shard_count - 1, 1, SOON_MS + BUCKET_MS - 1)  # fired through it
        assert store.purge_expired(later, 100) == 3
