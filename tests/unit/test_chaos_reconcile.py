"""The chaos bench's reconciliation, on records made by hand: what counts as lost,
early, duplicated (and why), and how long firing took to catch up after a fault."""

from __future__ import annotations

from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME

from bench.faults.reconcile import reconcile
from bench.nine.workers import Handled
from scheduler.model import DEFAULT_MAX_ATTEMPTS, Priority, Task, TaskId, encode_message

T0 = 1_800_000_000_000


def message(task_id: TaskId, fence: int) -> bytes:
    task = Task.unchecked(task_id, "college", "sms", b"\x80", task_id.run_at_ms, Priority.NORMAL, 1,
                          DEFAULT_MAX_ATTEMPTS, None)
    return encode_message(task, fence)


def test_lost_early_duplicates_by_cause_and_the_recovery_time() -> None:
    on_time, moved, resent, late, lost, early = (TaskId.new(T0 + n * 1000) for n in range(6))
    expected = {task.bytes: task.run_at_ms for task in (on_time, moved, resent, late, lost, early)}
    published = [
        (message(on_time, 7), T0 + 20, TIMESTAMP_LOG_APPEND_TIME),
        (message(moved, 7), T0 + 1_010, TIMESTAMP_LOG_APPEND_TIME),
        (message(moved, 9), T0 + 4_000, TIMESTAMP_LOG_APPEND_TIME),  # a new owner fired it again
        (message(resent, 7), T0 + 2_030, TIMESTAMP_LOG_APPEND_TIME),
        (message(resent, 7), T0 + 2_090, TIMESTAMP_LOG_APPEND_TIME),  # the same owner, after a failed flush
        (message(late, 9), T0 + 3_000 + 4_500, TIMESTAMP_LOG_APPEND_TIME),
        (message(early, 7), T0 + 5_000 - 300, TIMESTAMP_LOG_APPEND_TIME),
        (message(TaskId.new(T0), 7), T0, TIMESTAMP_LOG_APPEND_TIME),  # not acknowledged: not counted
    ]
    handled = [Handled(task.bytes, 1, task.run_at_ms + 50, 1) for task in (on_time, moved, resent, late)]
    handled.append(Handled(moved.bytes, 1, moved.run_at_ms + 3_100, 2))
    result = reconcile(published, handled, expected, injected_ms=T0 + 500, recovered_ms=T0 + 2_500)

    assert result["acknowledged"] == 6 and result["published"] == 5 and result["handled"] == 4
    assert result["lost_unpublished"] == 1 and result["lost_unhandled"] == 2
    assert result["early_published"] == 1 and result["early_handled"] == 0
    assert result["duplicates"] == {"published_more_than_once": 2, "after_an_owner_change": 1,
                                    "by_the_same_owner": 1, "handled_more_than_once": 1, "extra_handler_starts": 1}
    assert result["lateness_ms"]["max"] == 4_500
    assert result["late_publishes_after_fault"] == 1
    assert result["recovery_s"] == 7.0, "from the fault to the last publish more than 1 s late"
    assert result["lateness_ms_while_faulted"]["max"] == 4_500


def test_a_run_without_a_fault_has_no_recovery_figure() -> None:
    task = TaskId.new(T0)
    result = reconcile([(message(task, 3), T0 + 5, TIMESTAMP_LOG_APPEND_TIME)], [Handled(task.bytes, 1, T0 + 9, 1)],
                       {task.bytes: T0}, injected_ms=None, recovered_ms=None)
    assert result["recovery_s"] is None and result["lost_unhandled"] == 0 and result["duplicates"]["published_more_than_once"] == 0
