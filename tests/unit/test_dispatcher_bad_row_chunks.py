"""An unreadable row past the first chunk of a bucket read is dead-lettered before the cursor passes it."""
from __future__ import annotations

from pathlib import Path

from scheduler.model import BUCKET_MS
from scheduler.ports import Delivery
from scheduler.worker.dead_letters import UNREADABLE_ROW, DeadLetter, decode_record
from tests.contract.test_task_store import write_unreadable_row
from tests.dispatcher_rig import KAFKA, SESSION_S, FlakyPublisher, ManualClock, Rig, SecondsClock, task_in
from tests.tasks import NINE_OCLOCK_MS

T0 = NINE_OCLOCK_MS
SHARD = 1


def lettered(publisher: FlakyPublisher, task_id: object) -> bool:
    letters = [decode_record(Delivery(KAFKA.dead_letter_topic, 0, 0, value, 0)) for value in publisher.letters]
    return any(isinstance(letter, DeadLetter) and letter.task_id == task_id and letter.reason == UNREADABLE_ROW
               for letter in letters)


def test_an_unreadable_row_past_the_first_chunk_of_a_read_is_dead_lettered_before_the_cursor_passes_it(
    tmp_path: Path,
) -> None:
    # The shard is 15 minutes behind: its first bucket is older than the sweep's 10-minute horizon.
    clock, coordinator_clock = ManualClock(T0 + 15 * BUCKET_MS), SecondsClock(1_000.0)
    a = Rig(tmp_path, "a", clock, coordinator_clock, shards=[SHARD])
    rigs = [a]
    try:
        assert a.store.take_shard(SHARD, "gone", 0) and a.store.advance_shard(SHARD, 0, T0 - 1)
        good = [task_in(SHARD, T0 + 1 + n * 20) for n in range(2_500)]
        bad = task_in(SHARD, good[2_100].run_at_ms + 10)  # after 2,100 good rows: in the read's second chunk
        assert a.store.insert(good) == []
        write_unreadable_row(a.store, bad)
        a.take()

        def passed_unlettered() -> bool:
            cursor = a.store.read_shard(SHARD).fired_through_ms or 0
            return cursor >= bad.run_at_ms and not lettered(a.publisher, bad.id)

        a.pump_until(lambda: lettered(a.publisher, bad.id) or passed_unlettered(), max_pumps=100,
                     what="the row to be dead-lettered, or the cursor to pass it")
        seen_by_a = a.dispatcher.stats.bad_rows
        passed = passed_unlettered()
        a.kill()  # kill -9 at this moment
        coordinator_clock.now_s += SESSION_S + 1
        b = Rig(tmp_path, "b", clock, coordinator_clock, shards=[SHARD])
        rigs.append(b)
        b.take()
        b.pump_until(lambda: lettered(a.publisher, bad.id) or lettered(b.publisher, bad.id), max_pumps=300,
                     what=f"the unreadable row to be dead-lettered by one owner or the next (the first read it "
                          f"({seen_by_a} bad row(s) counted) and its cursor passed it undead-lettered: {passed})")
    finally:
        for rig in rigs:
            rig.close()
