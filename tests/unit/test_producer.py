"""The producer SDK on the embedded store: validation, due times, idempotency,
`submit_many` accounting, hand-off and cancel."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Sequence
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler import cancels
from scheduler.adapters.embedded.store import SqliteTaskStore
from scheduler.errors import HandoffFailed, InvalidPayload, InvalidTask, QueueAccessDenied, StoreError
from scheduler.model import (
    LATE_WRITE_LIMIT_MS,
    MAX_COST,
    MAX_NAME_CHARS,
    MAX_PAYLOAD_BYTES,
    Partition,
    Priority,
    Task,
    TaskId,
    decode_payload,
    from_ms,
    valid_name,
)
from scheduler.ports import CancelOutcome, InsertFailure, TaskStatus
from scheduler.producer import FLUSH_MS, URGENT_FLUSH_MS, Client, Submission, SubmitReport
from tests.tasks import NINE_OCLOCK_MS

NOW_MS = NINE_OCLOCK_MS - 30 * 60_000  # 08:30


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteTaskStore]:
    opened = SqliteTaskStore(tmp_path / "tasks.db")
    yield opened
    opened.close()


@pytest.fixture
def client(store: SqliteTaskStore) -> Client:
    return Client(store, tenant="board", now_ms=lambda: NOW_MS)


def partition_rows(store: SqliteTaskStore, task_id: TaskId) -> list[Any]:
    return list(store.read_partition(Partition(task_id.run_at_ms - task_id.run_at_ms % 60_000,
                                               task_id.shard(store.shard_count))))


def test_submit_stores_the_task_readable_by_id_and_in_its_partition(client: Client, store: SqliteTaskStore) -> None:
    task_id = client.submit("sms", {"to": "+919800000001"}, run_at=from_ms(NINE_OCLOCK_MS), priority="high")
    stored = client.get(task_id)
    assert stored is not None
    assert (stored.task.tenant, stored.task.type, stored.task.priority) == ("board", "sms", Priority.HIGH)
    assert decode_payload(stored.task.payload) == {"to": "+919800000001"}
    assert stored.task.run_at_ms == NINE_OCLOCK_MS
    assert [row.task.id for row in partition_rows(store, task_id)] == [task_id]
    assert client.get(str(task_id)) == stored


def test_delay_counts_from_now_and_no_time_means_now(client: Client) -> None:
    later = client.submit("reminder", delay=timedelta(minutes=15))
    assert later.run_at_ms == NOW_MS + 15 * 60_000
    assert client.submit("reminder", delay=90).run_at_ms == NOW_MS + 90_000
    assert client.submit("reminder").run_at_ms == NOW_MS


def test_a_run_at_in_the_past_is_due_now(client: Client) -> None:
    task_id = client.submit("sms", run_at=from_ms(NOW_MS - 3_600_000))
    assert task_id.run_at_ms == NOW_MS


def test_a_time_zone_run_at_is_the_same_instant() -> None:
    ist = timezone(timedelta(hours=5, minutes=30))
    client = Client(SqliteTaskStore(":memory:"), tenant="board", now_ms=lambda: NOW_MS)
    task_id = client.submit("sms", run_at=datetime(2026, 12, 2, 14, 30, tzinfo=ist))
    assert task_id.run_at_ms == NINE_OCLOCK_MS


@pytest.mark.parametrize(
    ("arguments", "error", "match"),
    [
        ({"run_at": datetime(2026, 12, 2, 9, 0)}, InvalidTask, "no time zone"),
        ({"priority": "urgent"}, InvalidTask, "unknown priority 'urgent'"),
        ({"tenant": ""}, InvalidTask, "needs a tenant"),
        ({"payload": {1, 2}}, InvalidPayload, "cannot be encoded as msgpack"),
        ({"payload": "x" * MAX_PAYLOAD_BYTES}, InvalidPayload, "over the 65536-byte limit"),
        ({"run_at": from_ms(NINE_OCLOCK_MS), "delay": 5}, InvalidTask, "not both"),
        ({"delay": -1}, InvalidTask, "not negative"),
        ({"idempotency_key": "order-1"}, InvalidTask, "needs an explicit run_at"),
        ({"idempotency_key": "order-1", "delay": 900}, InvalidTask, "needs an explicit run_at"),
        ({"max_attempts": 0}, InvalidTask, "max_attempts"),
        ({"cost": 0}, InvalidTask, "cost must be an integer from 1 to 1000000 .units of the tenant's rate limit"),
        ({"cost": MAX_COST + 1}, InvalidTask, "cost must be an integer from 1 to 1000000"),
        ({"cost": True}, InvalidTask, "cost must be .*, got True"),
        ({"cost": 500.0}, InvalidTask, "cost must be .*, got 500.0"),
        ({"cost": "500"}, InvalidTask, "cost must be .*, got '500'"),
        ({"cost": None}, InvalidTask, "cost must be .*, got None"),
    ],
)
def test_bad_input_is_refused_with_the_reason_and_nothing_is_written(
    store: SqliteTaskStore, arguments: dict[str, Any], error: type[Exception], match: str
) -> None:
    client = Client(store, now_ms=lambda: NOW_MS)
    arguments.setdefault("tenant", "board")
    with pytest.raises(error, match=match):
        client.submit("sms", **arguments)
    assert store.count() == 0


@pytest.mark.parametrize(
    ("tenant", "type_", "match"),
    [
        ("b" * (MAX_NAME_CHARS + 1), "sms", "a task's tenant is at most 100 characters, got 101"),
        ("board", "s" * 500, "a task's type is at most 100 characters, got 500: 'sssss"),
        ("board\n", "sms", r"tenant may hold only printable characters, got 'board\\n': a control character"),
        ("board", "sms\x00", r"type may hold only printable characters, got 'sms\\x00': a control character"),
        ("bo\x1bard", "sms", r"a control character \(U\+001B\) at position 2"),  # an escape sequence's start
        ("board", "\udc80", "a lone surrogate"),
        ("   ", "sms", "a task's tenant must not be only whitespace"),
        ("board", "\u3000", "a task's type must not be only whitespace"),
    ],
)
def test_a_tenant_or_type_too_long_or_not_printable_is_refused_and_nothing_is_written(
    store: SqliteTaskStore, tenant: str, type_: str, match: str
) -> None:
    client = Client(store, now_ms=lambda: NOW_MS)
    with pytest.raises(InvalidTask, match=match):
        client.submit(type_, tenant=tenant)
    report = client.submit_many([Submission(type=type_, tenant=tenant), Submission(type="sms", tenant="board")])
    assert [error.index for error in report.rejected] == [0] and report.stored == 1
    assert store.count() == 1


@pytest.mark.parametrize(("tenant", "type_"), [
    ("b" * MAX_NAME_CHARS, "s" * MAX_NAME_CHARS),  # exactly at the limits
    ("कॉलेज", "परिणाम.एसएमएस"),
    ("東京 board", "sms"),
])
def test_names_at_the_limit_or_in_any_script_are_stored_and_read_back(
    client: Client, store: SqliteTaskStore, tenant: str, type_: str
) -> None:
    task_id = client.submit(type_, tenant=tenant)
    stored = client.get(task_id, tenant)
    assert stored is not None and (stored.task.tenant, stored.task.type) == (tenant, type_)
    assert [row.task.tenant for row in partition_rows(store, task_id)] == [tenant]  # read through `Task`'s checks


def test_a_cost_is_stored_with_the_task_and_1_when_none_is_given(client: Client) -> None:
    costly = client.get(client.submit("sms", {"to": ["+9198"] * 500}, cost=500))
    plain = client.get(client.submit("sms"))
    assert costly is not None and plain is not None
    assert (costly.task.cost, plain.task.cost) == (500, 1)
    assert client.task("sms", cost=MAX_COST).cost == MAX_COST


def test_submit_many_takes_a_cost_per_item_and_rejects_a_bad_one_alone(client: Client, store: SqliteTaskStore) -> None:
    items: list[Any] = [
        Submission(type="sms", cost=500),
        {"type": "sms", "cost": 20},
        {"type": "sms", "cost": 0},
        Submission(type="sms", cost=MAX_COST + 1),
        {"type": "sms", "cost": "20"},
        {"type": "sms"},
    ]
    report = client.submit_many(items)
    assert [error.index for error in report.rejected] == [2, 3, 4]
    assert all("cost must be an integer from 1 to 1000000" in error.reason for error in report.rejected)
    assert report.ids is not None
    costs = [stored.task.cost for stored in map(client.get, filter(None, report.ids)) if stored]
    assert costs == [500, 20, 1]
    assert store.count() == 3


def test_without_a_tenant_the_client_default_is_used_and_missing_both_is_refused(store: SqliteTaskStore) -> None:
    assert Client(store, tenant="college").get(Client(store, tenant="college").submit("sms")).task.tenant == "college"  # type: ignore[union-attr]
    with pytest.raises(InvalidTask, match="needs a tenant"):
        Client(store).submit("sms")


def test_a_retried_idempotent_submit_writes_the_same_task_once(client: Client, store: SqliteTaskStore) -> None:
    run_at = from_ms(NINE_OCLOCK_MS + 15 * 60_000)
    first = client.submit("cancel_hold", {"order": 17}, run_at=run_at, idempotency_key="order-17")
    again = Client(store, tenant="board", now_ms=lambda: NOW_MS + 5000).submit(
        "cancel_hold", {"order": 17}, run_at=run_at, idempotency_key="order-17"
    )
    assert again == first
    assert len(partition_rows(store, first)) == 1
    other_tenant = client.submit("cancel_hold", {"order": 17}, run_at=run_at, idempotency_key="order-17",
                                 tenant="college")
    assert other_tenant != first


def test_a_keyed_run_at_in_the_past_is_kept_so_retries_still_agree(client: Client) -> None:
    past = from_ms(NOW_MS - 60_000)
    first = client.submit("sms", run_at=past, idempotency_key="late")
    assert first.run_at_ms == NOW_MS - 60_000
    assert client.submit("sms", run_at=past, idempotency_key="late") == first


def test_a_keyed_task_due_before_the_retention_is_refused_and_nothing_is_stored(store: SqliteTaskStore) -> None:
    """Its key named a task only for the retention: storing it again would run it again."""
    client = Client(store, tenant="board", now_ms=lambda: NOW_MS, handoff=RecordingHandoff())
    store.set_retention(86_400)
    kept = from_ms(NOW_MS - 86_400_000 + 60_000)  # its minute plus a day not over yet
    assert client.submit("sms", run_at=kept, idempotency_key="yesterday").run_at_ms == NOW_MS - 86_340_000
    gone = from_ms(NOW_MS - 2 * 86_400_000)
    with pytest.raises(InvalidTask, match=r"past the store's retention \(1d\)"):
        client.submit("sms", run_at=gone, idempotency_key="two-days-ago")
    assert store.count() == 1


def submissions(count: int, **overrides: Any) -> Iterator[Submission]:
    for n in range(count):
        yield Submission(type="sms", payload={"n": n}, run_at=from_ms(NINE_OCLOCK_MS + n), **overrides)


def test_submit_many_stores_everything_in_chunks_and_reports_progress(store: SqliteTaskStore) -> None:
    client = Client(store, tenant="board", now_ms=lambda: NOW_MS, chunk_size=100)
    seen: list[int] = []
    report = client.submit_many(submissions(250), progress=lambda r: seen.append(r.stored))
    assert report.complete
    assert (report.consumed, report.stored) == (250, 250)
    assert seen == [100, 200, 250]
    assert report.ids is not None and all(client.get(task_id) is not None for task_id in report.ids if task_id)


def test_submit_many_reports_each_invalid_item_and_stores_the_rest(client: Client) -> None:
    items: list[Any] = [
        {"type": "sms", "payload": {"n": 0}},
        {"type": "sms", "priority": "urgent"},
        Submission(type="sms", payload={"n": 2}),
        {"type": "sms", "colour": "red"},
        "not an item",
        InvalidTask("line 6 is not JSON"),
        Submission(type="sms", payload={"n": 6}, run_at=datetime(2026, 12, 2, 9, 0)),
        {"type": "sms", "payload": {"n": 7}},
    ]
    report = client.submit_many(items)
    assert [error.index for error in report.rejected] == [1, 3, 4, 5, 6]
    assert "unknown priority" in report.rejected[0].reason
    assert "unknown field(s) 'colour'" in report.rejected[1].reason
    assert report.rejected[3].reason == "line 6 is not JSON"
    assert (report.consumed, report.stored, report.failed, report.stopped_early) == (8, 3, [], False)
    assert report.ids is not None
    assert [index for index, task_id in enumerate(report.ids) if task_id] == [0, 2, 7]
    payloads = [client.get(task_id) for task_id in report.ids if task_id]
    assert [decode_payload(stored.task.payload)["n"] for stored in payloads if stored] == [0, 2, 7]


def test_submit_many_can_stop_at_the_first_invalid_item(client: Client) -> None:
    items = [*submissions(3), Submission(type=""), *submissions(3)]
    report = client.submit_many(items, on_invalid="stop")
    assert (report.consumed, report.stored, report.stopped_early) == (4, 3, True)
    assert [error.index for error in report.rejected] == [3]
    assert not report.complete


class FailingSecondInsert:
    """The real embedded store, except that in its second insert the group of the first
    three tasks is not acknowledged (and not written), as when one batch times out."""

    def __init__(self, store: SqliteTaskStore) -> None:
        self.store = store
        self.calls = 0
        self.shard_count = store.shard_count

    def insert(self, tasks: Sequence[Task]) -> list[InsertFailure]:
        self.calls += 1
        if self.calls == 2:
            return [*self.store.insert(tasks[3:]), InsertFailure(tasks[:3], "WriteTimeout: coordinator timed out")]
        return self.store.insert(tasks)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)


def test_a_write_the_store_does_not_acknowledge_is_reported_and_ends_the_stream(store: SqliteTaskStore) -> None:
    flaky = FailingSecondInsert(store)
    client = Client(flaky, tenant="board", now_ms=lambda: NOW_MS, chunk_size=10)
    report = client.submit_many(submissions(100))
    assert report.consumed == 20
    assert report.stopped_early and not report.complete
    assert [error.index for error in report.failed] == [10, 11, 12]
    assert "WriteTimeout" in report.failed[0].reason
    assert report.stored == 17
    assert report.ids is not None
    assert [index for index, task_id in enumerate(report.ids) if task_id is None] == [10, 11, 12]
    stored_ids = [task_id for task_id in report.ids if task_id]
    assert all(store.get(task_id) is not None for task_id in stored_ids)


def test_submit_raises_when_the_write_is_not_acknowledged(store: SqliteTaskStore) -> None:
    flaky = FailingSecondInsert(store)
    client = Client(flaky, tenant="board", now_ms=lambda: NOW_MS)
    client.submit("sms")
    with pytest.raises(StoreError, match="not acknowledged"):
        client.submit("sms")


class RecordingHandoff:
    def __init__(self, fail: bool = False) -> None:
        self.submitted_ids: list[TaskId] = []
        self.cancelled_ids: list[TaskId] = []
        self.fail = fail

    def submitted(self, tasks: Sequence[Task]) -> None:
        if self.fail:
            raise ConnectionError("hand-off topic unreachable")
        self.submitted_ids.extend(task.id for task in tasks)

    def cancelled(self, task_id: TaskId) -> None:
        if self.fail:
            raise ConnectionError("hand-off topic unreachable")
        self.cancelled_ids.append(task_id)

    def completed(self, task_ids: Sequence[bytes]) -> None:
        raise AssertionError("a producer finishes no attempt")


def test_only_tasks_due_within_the_window_are_handed_off_after_they_are_stored(store: SqliteTaskStore) -> None:
    handoff = RecordingHandoff()
    client = Client(store, tenant="board", handoff=handoff, handoff_window_s=120, now_ms=lambda: NOW_MS)
    soon = client.submit("sms", delay=119)
    later = client.submit("sms", delay=121)
    report = client.submit_many([Submission(type="sms", delay=5), Submission(type="sms", delay=3600)])
    assert handoff.submitted_ids == [soon, report.ids[0]]  # type: ignore[index]
    assert later not in handoff.submitted_ids
    assert all(store.get(task_id) is not None for task_id in handoff.submitted_ids)

    assert client.cancel(soon) is CancelOutcome.CANCELLED
    assert client.cancel(later) is CancelOutcome.CANCELLED
    assert handoff.cancelled_ids == [soon]


def test_a_failed_hand_off_of_a_task_due_soon_fails_the_submit(store: SqliteTaskStore) -> None:
    client = Client(store, tenant="board", handoff=RecordingHandoff(fail=True), now_ms=lambda: NOW_MS)
    with pytest.raises(HandoffFailed, match="is stored, but the hand-off to the dispatcher failed"):
        client.submit("sms")
    assert client.submit("sms", delay=3600)  # not due soon: no hand-off to fail

    report = client.submit_many([Submission(type="sms", delay=3600), Submission(type="sms", delay=1)])
    assert report.stored == 1
    assert [error.index for error in report.failed] == [1]
    assert "hand-off to the dispatcher failed" in report.failed[0].reason
    assert report.ids is not None and report.ids[1] is None and report.ids[0] is not None


class RefusedHandoff(RecordingHandoff):
    def submitted(self, tasks: Sequence[Task]) -> None:
        raise QueueAccessDenied("Kafka at k:9093 refused to let user 'scheduler' write to scheduler.handoff")


def test_a_hand_off_the_queue_refuses_says_the_task_stands_and_what_to_fix(store: SqliteTaskStore) -> None:
    client = Client(store, tenant="board", handoff=RefusedHandoff(), now_ms=lambda: NOW_MS)
    with pytest.raises(HandoffFailed) as failed:
        client.submit("sms")
    message = str(failed.value)
    assert "stored, but the queue refused its hand-off" in message
    assert "refused to let user 'scheduler' write to scheduler.handoff" in message
    assert "submit it again" not in message  # it would be refused again
    assert store.get(TaskId.parse(message.split()[1])) is not None  # "task <id> is stored, ..."


def test_a_cancel_of_a_task_that_may_be_in_flight_answers_after_the_settle_time_once_for_many(
    store: SqliteTaskStore
) -> None:
    slept: list[float] = []
    now = int(time.time() * 1000)  # the store marks by the wall clock
    handoff = RecordingHandoff()
    client = Client(store, tenant="board", handoff=handoff, now_ms=lambda: now, sleep=slept.append)
    soon = [client.submit("sms", delay=30) for _ in range(3)]
    far = client.submit("sms", delay=3600)
    assert client.cancel(far) is CancelOutcome.CANCELLED and slept == []  # in no wheel yet: definite at once
    assert client.cancel_many(soon) == dict.fromkeys(soon, CancelOutcome.CANCELLED)
    assert slept == [cancels.SETTLE_MS / 1000]  # once for the three
    assert client.cancel(TaskId.new(now), "board") is CancelOutcome.NOT_FOUND and len(slept) == 1
    assert handoff.cancelled_ids == soon  # and the dispatcher is told, so it need not publish them


def test_a_failed_hand_off_of_a_cancel_is_logged_not_raised_since_the_workers_skip_the_task_anyway(
    store: SqliteTaskStore, caplog: pytest.LogCaptureFixture
) -> None:
    slept: list[float] = []
    handoff = RecordingHandoff()
    client = Client(store, tenant="board", handoff=handoff, sleep=slept.append)
    task_id = client.submit("sms", delay=30)
    handoff.fail = True
    assert client.cancel(task_id) is CancelOutcome.CANCELLED
    assert slept == [cancels.SETTLE_MS / 1000]
    assert "the workers skip it all the same" in caplog.text
    assert store.read_cancel_marks().counts[task_id.shard(store.shard_count)] == 1


def test_a_client_without_a_hand_off_refuses_a_keyed_task_due_longer_ago_than_dispatchers_look_back(
    store: SqliteTaskStore
) -> None:
    bare = Client(store, tenant="board", now_ms=lambda: NOW_MS)
    at = datetime.fromtimestamp((NOW_MS - LATE_WRITE_LIMIT_MS + 1) / 1000, timezone.utc)
    assert bare.submit("hold", run_at=at, idempotency_key="order-7")  # within the look-back: found by a sweep
    too_old = datetime.fromtimestamp((NOW_MS - LATE_WRITE_LIMIT_MS - 1) / 1000, timezone.utc)
    with pytest.raises(InvalidTask, match="scheduler.connect"):
        bare.submit("hold", run_at=too_old, idempotency_key="order-8")
    assert bare.submit("sms", run_at=too_old)  # without a key a past run_at means now
    handed = Client(store, tenant="board", handoff=RecordingHandoff(), now_ms=lambda: NOW_MS)
    assert handed.submit("hold", run_at=too_old, idempotency_key="order-8")  # the hand-off fires it


def test_a_slow_stream_is_written_without_waiting_for_a_full_chunk(store: SqliteTaskStore) -> None:
    """A producer feeding items slowly: the first item that arrives FLUSH_MS (or
    URGENT_FLUSH_MS when due soon) after the chunk began has the chunk written, rather
    than everything being held until 50,000 items have come."""
    clock = [NOW_MS]
    client = Client(store, tenant="board", now_ms=lambda: clock[0])
    seen_by_store: list[int] = []

    def slow_items() -> Iterator[Submission]:
        for n in range(4):
            seen_by_store.append(store.count())
            yield Submission(type="sms", delay=5 if n >= 2 else 3600)
            clock[0] += FLUSH_MS if n < 2 else URGENT_FLUSH_MS

    report = client.submit_many(slow_items())
    assert report.complete and report.stored == 4
    # item 1 came 1 s after item 0: both written; item 3 came 50 ms after item 2, due soon
    assert seen_by_store == [0, 0, 2, 2]


def test_surrogates_and_impossible_delays_are_rejected_not_raised(client: Client) -> None:
    lone = json.loads('"\\udc80"')
    items: list[Any] = [
        {"type": lone}, {"type": "sms", "tenant": lone}, {"type": "sms", "payload": lone},
        {"type": "sms", "run_at": from_ms(NINE_OCLOCK_MS), "idempotency_key": lone},
        {"type": "sms", "delay": float("inf")}, {"type": "sms", "delay": float("nan")}, {"type": "sms", "delay": 1e300},
        {"type": "sms"},
    ]
    report = client.submit_many(items)
    assert [error.index for error in report.rejected] == list(range(7))
    assert report.stored == 1


def test_a_key_given_twice_in_a_failing_chunk_is_accounted_per_item(store: SqliteTaskStore) -> None:
    flaky = FailingSecondInsert(store)
    client = Client(flaky, tenant="shop", now_ms=lambda: NOW_MS, chunk_size=3)
    same = {"type": "cancel_hold", "run_at": from_ms(NINE_OCLOCK_MS), "idempotency_key": "order-1"}
    report = client.submit_many([{"type": "sms"}, {"type": "sms"}, {"type": "sms"}, same, same, {"type": "sms"}])
    assert report.stored == 3
    assert [error.index for error in report.failed] == [3, 4, 5]
    assert report.failed[0].task_id == report.failed[1].task_id


def test_a_tenant_cannot_cancel_another_tenants_task(client: Client) -> None:
    task_id = client.submit("sms", delay=600)
    assert client.cancel(task_id, tenant="college") is CancelOutcome.NOT_FOUND
    assert client.get(task_id).status is TaskStatus.SCHEDULED  # type: ignore[union-attr]
    assert client.cancel(task_id) is CancelOutcome.CANCELLED
    with pytest.raises(InvalidTask, match="needs the tenant"):
        Client(client.store).cancel(task_id)


def test_progress_sees_a_report_even_for_an_empty_stream(client: Client) -> None:
    reports: list[SubmitReport] = []
    report = client.submit_many([], progress=reports.append)
    assert report.complete and report.stored == 0
    assert reports == [report]


NAMES = st.one_of(
    st.text(max_size=5),
    st.text(min_size=MAX_NAME_CHARS - 2, max_size=MAX_NAME_CHARS + 2),
    st.sampled_from(["कॉलेज", " ", "\u3000", "sms\n", "\x00", "bo\u202eard", "a\u200db", "\udc80", "b" * MAX_NAME_CHARS]),
)
"""Tenant and type names on both sides of every rule of `check_name`."""


@settings(max_examples=300, deadline=None)
@given(
    type_=st.one_of(NAMES, st.none(), st.integers()),
    tenant=st.one_of(NAMES, st.none()),
    priority=st.one_of(st.sampled_from(["high", "normal", "low", "urgent", "", 1, None, ["high"]]),
                       st.sampled_from(list(Priority))),
    key=st.one_of(st.none(), st.text(max_size=5), st.integers()),
    max_attempts=st.one_of(st.none(), st.integers(-2, 102), st.booleans()),
    cost=st.one_of(st.integers(-2, 3), st.integers(MAX_COST - 1, MAX_COST + 1), st.booleans(),
                   st.sampled_from([None, 2.0, "2"])),
    offset_ms=st.integers(-10**6, 10**9),
)
def test_the_producers_own_checks_agree_with_the_tasks(
    type_: Any, tenant: Any, priority: Any, key: Any, max_attempts: Any, cost: Any, offset_ms: int
) -> None:
    """`Client.task` builds tasks with `Task.unchecked`: whatever it accepts must pass
    `Task`'s own checks, field for field."""
    client = Client(SqliteTaskStore(":memory:"), now_ms=lambda: NOW_MS)
    try:
        task = client.task(type_, {"n": 1}, tenant=tenant, run_at=from_ms(NOW_MS + offset_ms), priority=priority,
                           idempotency_key=key, max_attempts=max_attempts, cost=cost)
    except InvalidTask:
        return
    fields = {name: getattr(task, name) for name in Task.__slots__}
    assert Task(**fields) == task


@settings(max_examples=300, deadline=None)
@given(tenant=NAMES, type_=NAMES)
def test_the_producer_and_the_task_refuse_exactly_the_same_names(tenant: str, type_: str) -> None:
    """The other way round, for names: what `Task` refuses, the producer refuses too, so
    a task the producer stores can always be read back through the checked constructor."""
    client = Client(SqliteTaskStore(":memory:"), now_ms=lambda: NOW_MS)
    try:
        client.task(type_, tenant=tenant)
    except InvalidTask:
        by_producer = False
    else:
        by_producer = True
    try:
        Task(TaskId.new(NOW_MS), tenant, type_, b"\xc0", NOW_MS)
    except InvalidTask:
        by_task = False
    else:
        by_task = True
    assert by_producer == by_task == (valid_name(tenant) and valid_name(type_))


class RaisingThirdInsert(FailingSecondInsert):
    """The real embedded store, except that its third insert raises, as a store does
    when it fails in a way it cannot put item by item."""

    def insert(self, tasks: Sequence[Task]) -> list[InsertFailure]:
        self.calls += 1
        if self.calls == 3:
            raise StoreError("embedded store failed: disk I/O error")
        return self.store.insert(tasks)


def test_a_store_that_raises_mid_stream_still_yields_the_report(store: SqliteTaskStore) -> None:
    client = Client(RaisingThirdInsert(store), tenant="board", now_ms=lambda: NOW_MS, chunk_size=10)
    report = client.submit_many(submissions(100))
    assert (report.consumed, report.stored, report.stopped_early) == (30, 20, True)
    assert [error.index for error in report.failed] == list(range(20, 30))
    assert "disk I/O error" in report.failed[0].reason
    assert store.count() == 20


def test_odd_items_are_rejected_not_raised(client: Client) -> None:
    items: list[Any] = [{1: 2, "x": 3, "type": "sms"}, {"type": "sms", "priority": ["high"]}, 42]
    report = client.submit_many(items)
    assert [error.index for error in report.rejected] == [0, 1, 2]
    assert "unknown field(s) 'x', 1;" in report.rejected[0].reason
    assert "unknown priority" in report.rejected[1].reason
    assert "must be a Submission or a mapping" in report.rejected[2].reason
