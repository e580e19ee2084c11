"""Reads that fail part-way, on the embedded backend's real adapters, in this process, on a
manual clock (tests/dispatcher_rig.py).

A bucket read that fails after some rows: the rows sent before the failure stay, the
read resumes after them (within the read's own attempts and after it was handed back
and asked for again), a hand-off for a task of that bucket that arrives meanwhile is
kept and fires on time, and the copy the read brings later is dropped: every task is
published once. A hand-off read that fails for one shard of a poll: the records of the
shards read before it in that poll come with the next poll, and the committed positions
never pass a record whose task is neither published nor ahead of the cursor.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from scheduler.adapters.embedded.queue import SqliteQueue
from scheduler.adapters.embedded.store import SqliteTaskStore
from scheduler.dispatcher.config import LOAD_ATTEMPTS, LOAD_CHUNK
from scheduler.errors import QueueError, StoreError
from scheduler.handoff import LogHandoff
from scheduler.model import Partition, TaskId
from scheduler.ports import BadRow, StoredTask, TaskStore
from tests.dispatcher_rig import (
    KAFKA,
    SHARDS,
    ManualClock,
    Rig,
    SecondsClock,
    cursors,
    passed_unacknowledged,
    published_ids,
    task_in,
)
from tests.support import wait_until
from tests.tasks import NINE_OCLOCK_MS

pytestmark = pytest.mark.timeout(120)

T0 = NINE_OCLOCK_MS
SHARD = 1
FAIL_AFTER = 2300
"""Rows a failing attempt returns before it raises: more than one chunk sent to the wheel."""


class PartlyFailingStore(SqliteTaskStore):
    """Every read of one partition fails part-way until `healed` is set: it returns up to
    `FAIL_AFTER` rows, then raises `StoreError` (at its end if it has fewer). Records each
    bucket load's start (`after_ms`) and what the loads returned."""

    def __init__(self, path: Path, target: Partition) -> None:
        super().__init__(path, shard_count=SHARDS)
        self.target = target
        self.healed = threading.Event()
        self.loads: list[tuple[int | None, bool]] = []
        """(after_ms, failed) of each read of the whole bucket from some point (a load)."""
        self.loaded: Counter[TaskId] = Counter()

    def read_partition(self, partition: Partition, *, after_ms: int | None = None, through_ms: int | None = None,
                       page_size: int = 5000, on_bad_row: Callable[[BadRow], None] | None = None,
                       ) -> Iterator[StoredTask]:
        rows = super().read_partition(partition, after_ms=after_ms, through_ms=through_ms, page_size=page_size,
                                      on_bad_row=on_bad_row)
        if partition != self.target:
            return rows
        return self._failing(rows, after_ms, load=through_ms is None)

    def _failing(self, rows: Iterator[StoredTask], after_ms: int | None, *, load: bool) -> Iterator[StoredTask]:
        failing = not self.healed.is_set()
        if load:
            self.loads.append((after_ms, failing))
        for count, stored in enumerate(rows):
            if failing and count == FAIL_AFTER:
                raise StoreError("injected fault: the partition read failed part-way")
            if load:
                self.loaded[stored.task.id] += 1
            yield stored
        if failing:
            raise StoreError("injected fault: the partition read failed at its end")


@pytest.fixture
def clocks() -> tuple[ManualClock, SecondsClock]:
    return ManualClock(T0 - 30_000), SecondsClock(1_000.0)


def hold_from(store: TaskStore, cursor_ms: int, shards: Iterable[int]) -> None:
    """The shards' cursors where an owner that is gone left them."""
    for shard in shards:
        assert store.take_shard(shard, "gone", 0) and store.advance_shard(shard, 0, cursor_ms)


def test_a_bucket_read_failing_part_way_resumes_where_it_stopped_and_keeps_hand_offs_meanwhile(
    tmp_path: Path, clocks: tuple[ManualClock, SecondsClock],
) -> None:
    clock, coordinator_clock = clocks
    store = PartlyFailingStore(tmp_path / "tasks.db", Partition(T0, SHARD))
    hold_from(store, clock.now_ms - 1, [SHARD])
    tasks = [task_in(SHARD, T0 + 1 + n * 23) for n in range(2500)]  # the next bucket, read a minute ahead
    assert store.insert(tasks) == []
    rig = Rig(tmp_path, "a", clock, coordinator_clock, store=store, inline_readers=False, shards=[SHARD])
    try:
        acked = rig.publisher.acked

        def rule() -> None:
            missed = passed_unacknowledged(store, tasks, acked)
            assert not missed, f"at {clock.now_ms}, the cursor passed tasks never acknowledged: {missed[:5]}"

        rig.checks.append(rule)
        rig.take()
        owned = rig.dispatcher.shards[SHARD]

        def turn_until(condition: Callable[[], object], what: str, step_ms: int = 0, timeout_s: float = 60) -> None:
            def turned() -> object:
                rig.pump(step_ms)
                return condition()

            wait_until(turned, timeout_s=timeout_s, what=what)

        # The first read gives up after its attempts (on the reader thread, in real time; the
        # manual clock stands still, so the bucket is not asked for again yet).
        turn_until(lambda: T0 in owned.failed_buckets, "the first read of the bucket to give up")
        sent_rows = FAIL_AFTER // LOAD_CHUNK * LOAD_CHUNK  # the whole chunks read before the fault
        chunk_end = tasks[sent_rows - 1].run_at_ms
        assert store.loads == [(T0 - 1, True)] + [(chunk_end, True)] * (LOAD_ATTEMPTS - 1), \
            "each attempt resumes after the rows already sent to the wheel"
        assert len(owned.wheel) == sent_rows

        # While the read is failing, a producer hands off two tasks of that bucket: one the
        # failed read never returned, and one already in the wheel.
        unsent, sent = tasks[2400], tasks[100]
        LogHandoff(rig.queue.handoff_log(SHARDS), SHARDS).submitted([sent, unsent])
        turn_until(lambda: rig.dispatcher.stats.handed_tasks == 2, "the hand-offs to be taken")

        # Past the unsent task's time with the store still failing: the hand-off fired it.
        rig.pump_until(lambda: clock.now_ms > unsent.run_at_ms + 3_000, max_pumps=1_000, what="its time")
        assert store.loads[-1][1] and not store.healed.is_set()
        assert unsent.id in acked, "the task handed off while its bucket's read failed was dropped"
        assert unsent.run_at_ms <= acked[unsent.id] <= unsent.run_at_ms + 2_500
        assert {t.id for t in tasks[:sent_rows]} <= set(acked)
        assert not {t.id for t in tasks[sent_rows:] if t is not unsent} & set(acked)
        assert (cursors(store)[SHARD] or 0) < T0

        store.healed.set()
        turn_until(lambda: {t.id for t in tasks} <= set(acked)
                   and (store.read_shard(SHARD).fired_through_ms or 0) >= tasks[-1].run_at_ms,
                   "every task to be published, and the cursor to pass them", step_ms=100)
        published = Counter(published_ids(rig.queue))
    finally:
        rig.close()
    failed = sum(1 for _, failing in store.loads if failing)
    assert failed > LOAD_ATTEMPTS, "the bucket was handed back and asked for again, and failed again"
    assert all(after == chunk_end for after, _ in store.loads[1:]), store.loads
    assert set(store.loaded[t.id] for t in tasks[:sent_rows]) == {1}, "rows sent to the wheel were read again"
    assert {published[t.id] for t in tasks} == {1}, "a task was published twice, or never"
    assert rig.dispatcher.stats.duplicates_dropped >= 2
    assert all(at >= task.run_at_ms for at, task in rig.publisher.sent)
    store.close()


def test_the_embedded_hand_off_reader_returns_at_the_next_poll_what_a_failed_poll_had_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    queue = SqliteQueue(tmp_path / "queue.db")
    try:
        queue.handoff_log(SHARDS).append([(0, [b"a0", b"a1"]), (1, [b"b0"]), (2, [b"c0", b"c1"])])
        reader = queue.handoff_reader()
        for shard in (0, 1, 2):
            reader.assign(shard)
        read = queue._read
        calls: list[int] = []

        def second_shard_fails(sql: str, parameters: Sequence[Any]) -> list[Any]:
            calls.append(parameters[1])
            if len(calls) == 2:
                raise QueueError("injected fault: reading the second shard failed")
            return read(sql, parameters)

        monkeypatch.setattr(queue, "_read", second_shard_fails)
        with pytest.raises(QueueError):
            reader.poll(100, 0)
        first = calls[0]
        records = reader.poll(100, 0)
        assert sorted((r.shard, r.offset, r.value) for r in records) == [
            (0, 0, b"a0"), (0, 1, b"a1"), (1, 0, b"b0"), (2, 0, b"c0"), (2, 1, b"c1")], \
            f"the records of shard {first}, read before the failure, were skipped"
        assert reader.poll(100, 0) == []
    finally:
        queue.close()


def test_a_failed_hand_off_poll_loses_no_record_and_commits_no_position_past_one(
    tmp_path: Path, clocks: tuple[ManualClock, SecondsClock], monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock, coordinator_clock = clocks
    clock.now_ms = T0 + 10_000
    rig = Rig(tmp_path, "a", clock, coordinator_clock)
    try:
        hold_from(rig.store, clock.now_ms - 1, range(SHARDS))
        rig.take()
        for _ in range(5):
            rig.pump()
        tasks = [task_in(shard, clock.now_ms + 3_000 + n) for shard in range(SHARDS) for n in range(2)]
        offsets = {task.id: n % 2 for n, task in enumerate(tasks)}  # each shard's records at offsets 0 and 1
        assert rig.store.insert(tasks) == []
        LogHandoff(rig.queue.handoff_log(SHARDS), SHARDS).submitted(tasks)
        acked = rig.publisher.acked

        def committed_safely() -> None:
            through = cursors(rig.store)
            for task in tasks:
                shard = task.id.shard(SHARDS)
                position = rig.queue.position(KAFKA.dispatcher_group, KAFKA.handoff_topic, shard) or 0
                if offsets[task.id] < position:
                    assert task.id in acked or task.run_at_ms > (through[shard] or 0), \
                        f"shard {shard}'s position {position} passed the record of a task neither published " \
                        "nor ahead of the cursor"

        rig.checks.append(committed_safely)
        read = rig.queue._read
        handoff_reads: list[int] = []

        def second_shard_fails(sql: str, parameters: Sequence[Any]) -> list[Any]:
            if parameters[0] == KAFKA.handoff_topic and len(handoff_reads) < 2:
                handoff_reads.append(parameters[1])
                if len(handoff_reads) == 2:
                    raise QueueError("injected fault: reading the second shard failed")
            return read(sql, parameters)

        monkeypatch.setattr(rig.queue, "_read", second_shard_fails)
        rig.pump()
        assert len(handoff_reads) == 2 and rig.dispatcher.stats.handed_tasks == 0
        rig.pump()
        assert rig.dispatcher.stats.handed_tasks == len(tasks), "records read before the failed read were skipped"
        rig.pump_until(lambda: {t.id for t in tasks} <= set(acked) and all(
            rig.queue.position(KAFKA.dispatcher_group, KAFKA.handoff_topic, shard) == 2 for shard in range(SHARDS)),
            max_pumps=100, what="every handed-off task published, and the positions committed")
        assert Counter(published_ids(rig.queue)) == Counter(t.id for t in tasks)
    finally:
        rig.close()
