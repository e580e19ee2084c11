"""The demo's summary: it counts a missing SMS, a task that did not end as it should,
and a doomed task missing from the dead-letter list as failures, and it sorts tasks
into the board's columns by status and due time."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from scheduler.demo.gateway import Start
from scheduler.demo.outcome import Planned, percentiles, status_counts, summarise
from scheduler.demo.story import BOARD, COLLEGE, Story
from scheduler.model import Priority, Task, TaskId
from scheduler.ports import StoredTask, TaskStatus

AT = 1_796_299_771_000


def planned() -> list[Planned]:
    batch = TaskId.new(AT)
    reminder = TaskId.new(AT + 60_000)
    doomed = TaskId.new(AT + 60_000)
    return [Planned(batch, BOARD, "result_sms", AT, (f"{batch}:sms:+1", f"{batch}:sms:+2")),
            Planned(reminder, COLLEGE, "reminder", AT + 60_000, (f"{reminder}:sms",)),
            Planned(doomed, COLLEGE, "reminder", AT + 60_000, (), doomed=True)]


def row(task: Planned, status: TaskStatus) -> StoredTask:
    return StoredTask(Task(task.task_id, task.tenant, task.type, b"\x80", task.run_at_ms, Priority.NORMAL, 1, 3),
                      status, 1)


def letter(task: Planned) -> Any:
    return SimpleNamespace(task_id=task.task_id, tenant=task.tenant, type=task.type, attempt=3,
                           reason="attempts exhausted", error="GatewayError: unreachable")


def test_everything_delivered_is_ok_and_lateness_is_first_start_minus_due_time() -> None:
    tasks = planned()
    rows = {t.task_id: row(t, TaskStatus.DEAD if t.doomed else TaskStatus.DONE) for t in tasks}
    keys = {key for t in tasks for key in t.sms_keys}
    starts = [Start(str(tasks[0].task_id), 1, BOARD, "result_sms", AT, AT + 300, 1),
              Start(str(tasks[0].task_id), 1, BOARD, "result_sms", AT, AT + 5000, 2)]
    summary = summarise(tasks, rows, keys, 2, starts, [letter(tasks[2])], [], 12.0, "embedded")
    assert summary["ok"] and summary["tasks"]["lost"] == 0 and summary["sms"]["delivered"] == 3
    assert summary["tenants"][BOARD]["handler_start_lateness_ms"]["max"] == 300
    assert summary["handler_runs"] == {"total": 2, "beyond_first": 1}


def test_a_missing_sms_an_unfinished_task_and_an_unlisted_dead_task_each_fail_the_demo() -> None:
    tasks = planned()
    done = {t.task_id: row(t, TaskStatus.DEAD if t.doomed else TaskStatus.DONE) for t in tasks}
    keys = {key for t in tasks for key in t.sms_keys}
    missing_sms = summarise(tasks, done, keys - {f"{tasks[0].task_id}:sms:+2"}, 0, [], [letter(tasks[2])], [], 1,
                            "embedded")
    assert not missing_sms["ok"] and missing_sms["sms"]["missing"] == 1
    running = {**done, tasks[1].task_id: row(tasks[1], TaskStatus.RUNNING)}
    unfinished = summarise(tasks, running, keys, 0, [], [letter(tasks[2])], [], 1, "embedded")
    assert not unfinished["ok"] and unfinished["tasks"]["lost"] == 1
    unlisted = summarise(tasks, done, keys, 0, [], [], [], 1, "embedded")
    assert not unlisted["ok"] and "not in the dead-letter list" in unlisted["tasks"]["not_as_expected"][0]


def test_the_board_sorts_scheduled_tasks_by_due_time_and_the_rest_by_status() -> None:
    tasks = planned()
    counts = status_counts(tasks, {tasks[1].task_id: row(tasks[1], TaskStatus.FAILED)}, now_ms=AT + 1)
    assert counts[BOARD]["queued"] == 1 and counts[COLLEGE]["failed"] == 1 and counts[COLLEGE]["waiting"] == 1


def test_percentiles_are_nearest_rank() -> None:
    assert percentiles(list(range(1, 101))) == {"p50": 50, "p90": 90, "p99": 99, "max": 100}
    assert percentiles([]) == {"p50": None, "p90": None, "p99": None, "max": None}


def test_the_story_plans_batches_reminders_and_one_doomed_reminder() -> None:
    story = Story(results=1001, batch=500, reminders=3, reminder_delay_s=30)
    items = story.plan(AT)
    sizes = [len(item.payload["messages"]) for item in items if item.type == "result_sms"]
    assert sizes == [500, 500, 1] and story.board_tasks == 3
    reminders = [item for item in items if item.type == "reminder"]
    assert [item.payload["to"] for item in reminders].count("+910000000000") == 1
    assert reminders[-1].payload["to"] == "+910000000000" and story.expected_sms() == 1001 + 2
    assert story.plan(AT) == items  # the same seed, the same story
