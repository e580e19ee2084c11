"""The demo's summary: it counts a missing SMS, a task that did not end as it should,
and a doomed task missing from the dead-letter list as failures, and it sorts tasks
into the board's columns by status and due time."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from scheduler.demo.gateway import Start
from scheduler.demo.outcome import Planned, against_status, percentiles, status_counts, summarise
from scheduler.demo.story import BOARD, COLLEGE, Story
from scheduler.model import Priority, Task, TaskId
from scheduler.ports import StoredTask, TaskStatus
from scheduler.visibility.counts import Levels
from scheduler.visibility.status import Status
from scheduler.workflows.definition import compile_workflow

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
    never = summarise(tasks, done, keys, 0, [], [letter(tasks[2])], [], 1, "embedded",
                      ["state-board workflow results-day: 1 of its 7 steps never created"])
    assert not never["ok"] and "never created" in never["tasks"]["not_as_expected"][0]


def test_the_board_sorts_scheduled_tasks_by_due_time_and_the_rest_by_status() -> None:
    tasks = planned()
    counts = status_counts(tasks, {tasks[1].task_id: row(tasks[1], TaskStatus.FAILED)}, now_ms=AT + 1)
    assert counts[BOARD]["queued"] == 1 and counts[COLLEGE]["failed"] == 1 and counts[COLLEGE]["waiting"] == 1


def test_percentiles_are_nearest_rank() -> None:
    assert percentiles(list(range(1, 101))) == {"p50": 50, "p90": 90, "p99": 99, "max": 100}
    assert percentiles([]) == {"p50": None, "p90": None, "p99": None, "max": None}


def test_the_story_is_a_results_day_workflow_reminders_and_one_doomed_reminder() -> None:
    story = Story(results=1001, batch=500, reminders=3, reminder_delay_s=30)
    definition, roots = compile_workflow(story.workflow())  # a valid workflow
    assert [(s.name, s.width) for s in definition.steps] == [("render", 3), ("send", 3), ("report", 1)]
    assert definition.by_name["send"].each_of == "render" and definition.by_name["report"].after == ("send",)
    assert [len(story.batch_messages(n)) for n in range(3)] == [500, 500, 1] and story.board_steps == 7
    assert story.batch_messages(1) == story.batch_messages(1)  # the send and the reconciliation agree
    assert len({m["to"] for n in range(3) for m in story.batch_messages(n)}) > 990
    reminders = story.plan(AT)
    assert {item.type for item in reminders} == {"reminder"} and len(reminders) == 3
    assert [item.payload["to"] for item in reminders].count("+910000000000") == 1
    assert reminders[-1].payload["to"] == "+910000000000" and story.expected_sms() == 1001 + 1 + 2
    assert story.plan(AT) == reminders  # the same seed, the same story

# The verdict on `scheduler status` beside the tasks: what a killed worker or dispatcher may
# leave unwritten is explained, nothing more.

TASKS = {"state-board": {"done": 5, "dead": 0}, "city-college": {"done": 7, "dead": 1}}


def shown_status(board: Levels, college: Levels) -> Status:
    return Status(at_ms=0, since_ms=0, tenant=None, type=None,
                  levels={("state-board", "results"): board, ("city-college", "reminder"): college},
                  total=Levels(0, 0, 0, 0, 0, 0, 0), per_minute=[], lateness={}, shards=[], processes=[],
                  stalest_ms=None)


def test_counts_that_match_the_tasks_are_the_same() -> None:
    verdict = against_status(TASKS, shown_status(Levels(0, 0, 0, 0, 5, 0, 0), Levels(0, 0, 0, 0, 7, 1, 0)), 0)
    assert verdict["verdict"] == "same" and verdict["differences"] == []


def test_a_done_the_killed_worker_did_not_count_is_explained_by_it_alone() -> None:
    shown = shown_status(Levels(0, 0, 1, 0, 4, 0, 0), Levels(0, 0, 0, 0, 7, 1, 0))
    assert against_status(TASKS, shown, 1)["verdict"] == "within_kill"
    assert against_status(TASKS, shown, 0)["verdict"] == "differs"


def test_a_fired_count_the_killed_dispatcher_did_not_write_is_explained_by_it_alone() -> None:
    """Done counted, its `fired` lost with the dispatcher: the task shows waiting as well."""
    shown = shown_status(Levels(1, 0, 0, 0, 5, 0, 0), Levels(0, 0, 0, 0, 7, 1, 0))
    assert against_status(TASKS, shown, 3, 1)["verdict"] == "within_kill"
    assert against_status(TASKS, shown, 3, 0)["verdict"] == "differs"


def test_a_dead_task_miscounted_is_never_explained() -> None:
    shown = shown_status(Levels(0, 0, 0, 0, 5, 0, 0), Levels(0, 0, 0, 0, 8, 0, 0))
    assert against_status(TASKS, shown, 10, 10)["verdict"] == "differs"
