"""Counts kept as events per writer, absolute per hour and minute, folded into snapshots:
the pure rules and the writer, on the embedded count store."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scheduler.adapters.embedded.counts import SqliteCountStore
from scheduler.errors import StoreError
from scheduler.ports import AGGREGATE_TENANT, CountStore
from scheduler.visibility.counts import EVENTS, HOUR_MS, MINUTE_MS, EventCounter, levels, sum_rows
from scheduler.visibility.fold import fold_hours
from scheduler.visibility.history import AttemptRecord
from scheduler.visibility.retention import FOLD_GRACE_MS
from scheduler.visibility.status import current_totals, read_status
from scheduler.visibility.writer import STOPPED, CountWriter, Gauges

T0 = 1_800_000_000_000 - 1_800_000_000_000 % HOUR_MS  # an hour's start


def vals(**given: int) -> tuple[int, ...]:
    return tuple(given.get(event, 0) for event in EVENTS)


def test_a_take_gives_absolute_values_of_the_hour_and_minute_and_the_tenants_added_up() -> None:
    counter = EventCounter("w1")
    counter.add("submitted", "acme", "sms", 3)
    counter.add_many("submitted", {("beta", "sms"): 2})
    hours, minutes = counter.take(T0 + 1000)
    assert {(r.tenant, r.values) for r in hours} == {("acme", vals(submitted=3)), ("beta", vals(submitted=2))}
    assert {(r.tenant, r.type, r.values) for r in minutes} == {
        ("acme", "sms", vals(submitted=3)), ("beta", "sms", vals(submitted=2)),
        (AGGREGATE_TENANT, "sms", vals(submitted=5))}
    counter.add("done", "acme", "sms")
    hours, minutes = counter.take(T0 + 2000)  # same hour and minute: the totals so far, only what changed
    assert [(r.tenant, r.values) for r in hours] == [("acme", vals(submitted=3, done=1))]
    counter.add("done", "acme", "sms")
    hours, minutes = counter.take(T0 + MINUTE_MS)  # a new minute: from zero there, the hour goes on
    assert [(r.period, r.values) for r in minutes if r.tenant == "acme"] == [(T0 // MINUTE_MS + 1, vals(done=1))]
    assert [r.values for r in hours] == [vals(submitted=3, done=2)]
    counter.add("done", "acme", "sms")
    hours, _ = counter.take(T0 + HOUR_MS)  # a new hour: from zero
    assert [(r.period, r.values) for r in hours] == [(T0 // HOUR_MS + 1, vals(done=1))]
    assert counter.take(T0 + HOUR_MS + 5) == ([], [])


@pytest.mark.parametrize(("events", "running", "expected"), [
    ({"submitted": 10}, 0, {"waiting": 10}),
    ({"submitted": 10, "fired": 7, "started": 7, "done": 4, "retried": 1, "dead": 1}, 1,
     {"waiting": 3, "running": 1, "retrying": 1, "done": 4, "dead": 1}),
    # A cancel of a task already published: counted out of waiting by the client, given
    # back when the worker skips it, which takes it out of queued.
    ({"submitted": 2, "fired": 2, "cancelled": 1, "skipped_cancelled": 1, "done": 1}, 0,
     {"waiting": 0, "queued": 0, "done": 1, "cancelled": 1}),
    # A take-over's repeat: fired twice, skipped once by the worker.
    ({"submitted": 1, "fired": 2, "started": 1, "done": 1, "skipped": 1}, 0, {"done": 1}),
    # Tasks written past the SDK fire without a submit: never below zero.
    ({"fired": 5}, 0, {"queued": 5}),
    ({"fired": 5, "started": 5, "done": 5}, 0, {"done": 5}),
])
def test_states_from_events(events: dict[str, int], running: int, expected: dict[str, int]) -> None:
    got = levels(vals(**events), running).as_dict()
    assert got == {state: expected.get(state, 0) for state in got}


def written(store: CountStore, writer: str, period_ms: int, **events: int) -> None:
    counter = EventCounter(writer)
    for event, n in events.items():
        counter.add(event, "acme", "sms", n)
    hours, minutes = counter.take(period_ms)
    store.write_counts(hours, minutes)


def test_folding_keeps_the_totals_and_is_the_same_when_done_twice(tmp_path: Path) -> None:
    store = SqliteCountStore(tmp_path / "counts.db")
    store.start_snapshots(T0 // HOUR_MS - 1)
    written(store, "w1", T0 + 5, submitted=10)
    written(store, "w2", T0 + 7, fired=4)
    written(store, "w1", T0 + HOUR_MS + 5, submitted=1)
    written(store, "w1", T0 + 2 * HOUR_MS + 5, done=3)
    now = T0 + 2 * HOUR_MS + FOLD_GRACE_MS + 1  # the first two hours are final
    before = current_totals(store, now)
    assert before == {("acme", "sms"): vals(submitted=11, fired=4, done=3)}
    assert fold_hours(store, now) == 2
    assert fold_hours(store, now) == 0
    snapshot = store.read_snapshot()
    assert snapshot == (T0 // HOUR_MS + 1, {("acme", "sms"): vals(submitted=11, fired=4)})
    assert current_totals(store, now) == before
    # A second folder that read the older snapshot writes the same one again.
    store.write_snapshot(T0 // HOUR_MS + 1, sum_rows(store.read_hours([T0 // HOUR_MS, T0 // HOUR_MS + 1])), None)
    assert current_totals(store, now) == before


def test_nothing_is_folded_before_an_hour_is_final(tmp_path: Path) -> None:
    store = SqliteCountStore(tmp_path / "counts.db")
    store.start_snapshots(T0 // HOUR_MS - 1)
    written(store, "w1", T0 + 5, submitted=1)
    assert fold_hours(store, T0 + HOUR_MS + FOLD_GRACE_MS - 1) == 0
    assert fold_hours(store, T0 + HOUR_MS + FOLD_GRACE_MS) == 1


class FailingWrites(SqliteCountStore):
    """The embedded store, with its next `failures` count writes refused."""

    failures = 0

    def write_counts(self, hours, minutes):  # type: ignore[no-untyped-def]
        if self.failures:
            self.failures -= 1
            raise StoreError("injected: the count store is down")
        super().write_counts(hours, minutes)


def test_a_failed_write_is_sent_again_with_the_next_and_the_last_report_says_stopped(tmp_path: Path) -> None:
    store = FailingWrites(tmp_path / "counts.db")
    clock = [T0 + 1000]
    writer = CountWriter(store, "worker", writer="w1", clock_ms=lambda: clock[0],
                         gauges=lambda: Gauges(running={("acme", "sms"): 2}))
    writer.counter.add("started", "acme", "sms", 5)
    store.failures = 1
    assert writer.flush() is False
    clock[0] += 2000
    assert writer.flush() is True  # nothing new counted: the unwritten rows go now
    assert current_totals(store, clock[0]) == {("acme", "sms"): vals(started=5)}
    status = read_status_of(store, clock[0])
    assert status.levels[("acme", "sms")].running == 2
    writer.stop()
    assert store.read_processes()[0].detail.get(STOPPED) is True
    assert read_status_of(store, clock[0]).processes == []


def read_status_of(store: CountStore, now: int):  # type: ignore[no-untyped-def]
    from scheduler.adapters.embedded.store import SqliteTaskStore

    tasks = SqliteTaskStore(":memory:")
    try:
        return read_status(tasks, store, now_ms=now, shards=False)
    finally:
        tasks.close()


@pytest.mark.parametrize("record", [
    AttemptRecord(1, 10, 20, 30, "w-1", "done"),
    AttemptRecord(2, None, None, 5, None, "dead", 'boom: "quoted"\nsecond line ✓'),
    AttemptRecord(3, 1, 2, 3, "host:\\pid", "failed", ""),
])
def test_an_attempt_record_reads_back_as_written(record: AttemptRecord) -> None:
    text = record.encode()
    assert json.loads(text)["outcome"] == record.outcome
    assert AttemptRecord.decode(record.attempt, text) == record


def test_a_record_that_is_not_one_reads_as_unreadable() -> None:
    assert AttemptRecord.decode(4, "[1, 2]").outcome == "unreadable record"
    assert AttemptRecord.decode(4, "{nope").outcome == "unreadable record"


def test_tenant_minute_rows_wait_for_a_take_that_asks_or_for_their_minute_to_end() -> None:
    counter = EventCounter("w1")
    counter.add("done", "acme", "sms", 2)
    _, minutes = counter.take(T0 + 1000, tenant_minutes=False)
    assert [(r.tenant, r.values) for r in minutes] == [(AGGREGATE_TENANT, vals(done=2))]
    counter.add("done", "acme", "sms")
    _, minutes = counter.take(T0 + MINUTE_MS + 5, tenant_minutes=False)  # the first minute ended
    assert {(r.period, r.tenant, r.values) for r in minutes} == {
        (T0 // MINUTE_MS, "acme", vals(done=2)), (T0 // MINUTE_MS + 1, AGGREGATE_TENANT, vals(done=1))}
    _, minutes = counter.take(T0 + MINUTE_MS + 10)
    assert [(r.period, r.tenant, r.values) for r in minutes] == [(T0 // MINUTE_MS + 1, "acme", vals(done=1))]
