"""The `CountStore` contract (`scheduler.ports.counts`), run against both adapters: the
embedded SQLite file and the Cassandra tables on the real server (fresh keyspace)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from scheduler.adapters.embedded.counts import SqliteCountStore
from scheduler.ports import AGGREGATE_TENANT, CountStore, LatenessRow, ProcessReport
from scheduler.visibility.counts import EVENTS, HOUR_MS, MINUTE_MS, CountRow
from scheduler.visibility.histogram import LatencyHistogram

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(params=["sqlite", pytest.param("cassandra", marks=pytest.mark.integration)])
def counts(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[CountStore]:
    if request.param == "sqlite":
        store: CountStore = SqliteCountStore(tmp_path / "counts.db")
        close = store.close
    else:
        from scheduler.adapters.cassandra.counts import CassandraCountStore
        from scheduler.adapters.cassandra.store import CassandraTaskStore

        tasks = CassandraTaskStore.open(request.getfixturevalue("keyspace"))
        store = CassandraCountStore.for_store(tasks)
        close = tasks.close
    try:
        yield store
    finally:
        close()


def values(**given: int) -> tuple[int, ...]:
    return tuple(given.get(event, 0) for event in EVENTS)


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def test_a_row_written_again_replaces_the_first_and_writers_are_kept_apart(counts: CountStore) -> None:
    hour = now_ms() // HOUR_MS
    counts.write_counts([CountRow(hour, "acme", "sms", "w1", values(submitted=5))], [])
    counts.write_counts([CountRow(hour, "acme", "sms", "w1", values(submitted=7, fired=2)),
                         CountRow(hour, "acme", "sms", "w2", values(submitted=1)),
                         CountRow(hour, "beta", "mail", "w1", values(done=3))], [])
    counts.write_counts([CountRow(hour + 1, "acme", "sms", "w1", values(submitted=100))], [])
    rows = sorted(counts.read_hours([hour]), key=lambda r: (r.tenant, r.writer))
    assert rows == [CountRow(hour, "acme", "sms", "w1", values(submitted=7, fired=2)),
                    CountRow(hour, "acme", "sms", "w2", values(submitted=1)),
                    CountRow(hour, "beta", "mail", "w1", values(done=3))]
    assert len(counts.read_hours([hour, hour + 1])) == 4
    assert counts.read_hours([hour + 5]) == []


def test_many_rows_of_one_hour_are_all_written(counts: CountStore) -> None:
    hour = now_ms() // HOUR_MS
    rows = [CountRow(hour, f"tenant-{i}", "sms", "w1", values(submitted=i)) for i in range(333)]
    counts.write_counts(rows, [])
    assert sorted(counts.read_hours([hour]), key=lambda r: r.values[0]) == rows


def test_minutes_are_read_by_tenant_and_range_across_an_hour(counts: CountStore) -> None:
    minute = (now_ms() // HOUR_MS + 1) * HOUR_MS // MINUTE_MS - 2  # two minutes before an hour ends
    minutes = [CountRow(m, tenant, "sms", "w1", values(done=m - minute + 1))
               for m in range(minute, minute + 4) for tenant in ("acme", AGGREGATE_TENANT)]
    counts.write_counts([], minutes)
    got = counts.read_minutes(minute + 1, minute + 3, "acme")
    assert sorted(r.period for r in got) == [minute + 1, minute + 2, minute + 3]
    assert {r.tenant for r in got} == {"acme"}
    assert {r.period: r.values for r in counts.read_minutes(minute, minute, AGGREGATE_TENANT)} == {
        minute: values(done=1)}


def test_snapshots_start_once_and_the_newest_replaces_the_previous(counts: CountStore) -> None:
    assert counts.read_snapshot() is None
    counts.start_snapshots(100)
    counts.start_snapshots(200)  # a second start does not move it
    assert counts.read_snapshot() == (100, {})
    counts.write_snapshot(101, {("acme", "sms"): values(done=4)}, 100)
    counts.write_snapshot(101, {("acme", "sms"): values(done=4)}, 100)  # the same again: the same snapshot
    assert counts.read_snapshot() == (101, {("acme", "sms"): values(done=4)})
    counts.write_snapshot(102, {("acme", "sms"): values(done=9), ("beta", "x"): values(dead=1)}, 101)
    assert counts.read_snapshot() == (102, {("acme", "sms"): values(done=9), ("beta", "x"): values(dead=1)})


def test_process_reports_are_replaced_and_read_back_with_their_gauges(counts: CountStore) -> None:
    t = now_ms()
    counts.write_process(ProcessReport("d1", "dispatcher", "host-a", 10, t - 5000, t - 10, {}, {"shards": 3}))
    counts.write_process(ProcessReport("w1", "worker", "host-b", 11, t - 5000, t - 20, {("acme", "sms"): 2}, {}))
    counts.write_process(ProcessReport("d1", "dispatcher", "host-a", 10, t - 5000, t, {}, {"shards": 64}))
    reports = counts.read_processes()
    assert [(p.writer, p.role) for p in reports] == [("d1", "dispatcher"), ("w1", "worker")]
    assert reports[0].detail == {"shards": 64} and reports[0].updated_ms == t
    assert reports[1].running == {("acme", "sms"): 2} and reports[1].host == "host-b" and reports[1].pid == 11


def test_lateness_histograms_are_kept_by_kind_minute_and_writer(counts: CountStore) -> None:
    minute = now_ms() // MINUTE_MS
    fire, start = LatencyHistogram(), LatencyHistogram()
    fire.add_many([5, 50, 500])
    start.add(2000)
    counts.write_lateness([LatenessRow(minute, "fire", "d1", fire), LatenessRow(minute, "start", "w1", start),
                           LatenessRow(minute - 10, "fire", "d1", start)])
    got = counts.read_lateness("fire", minute - 1, minute)
    assert [(r.minute, r.writer, r.histogram.counts, r.histogram.sum_ms) for r in got] == [
        (minute, "d1", fire.counts, 555)]
    assert [r.histogram.total for r in counts.read_lateness("start", minute, minute)] == [1]
