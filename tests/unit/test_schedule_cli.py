"""`scheduler schedule ...` on the embedded backend: the life of a schedule, bad input
refused with exit 2 before anything is written, and `preview` across DST changes."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from scheduler.cli import Exit, cli

pytestmark = pytest.mark.timeout(60)


def run(db: Path, *args: str) -> Result:
    return CliRunner().invoke(cli, ["schedule", *args, "--db", str(db)], env={"SCHEDULER_BACKEND": "embedded"})


ADD = ("add", "nightly", "--tenant", "college", "--cron", "30 2 * * *", "--zone", "America/New_York",
       "--type", "report", "--payload", '{"kind": "daily"}', "--misfire", "skip", "--jitter", "30")


@pytest.mark.parametrize("command", ["add", "list", "pause", "resume", "delete", "preview"])
def test_every_schedule_command_has_help(command: str) -> None:
    result = CliRunner().invoke(cli, ["schedule", command, "--help"])
    assert result.exit_code == 0 and "SCHEDULER_BACKEND" in result.output


def test_add_list_pause_resume_delete(tmp_path: Path) -> None:
    db = tmp_path / "tasks.db"
    added = run(db, *ADD)
    assert added.exit_code == Exit.OK, added.output
    assert "schedule nightly" in added.output
    assert "02:30 EST" in added.output or "02:30 EDT" in added.output
    assert run(db, *ADD).exit_code == Exit.CONFLICT  # the tenant already has one of that name

    listed = run(db, "list", "--json")
    (described,) = [json.loads(line) for line in listed.output.splitlines()]
    assert described["cron"] == "30 2 * * *" and described["zone"] == "America/New_York"
    assert described["payload"] == {"kind": "daily"} and described["misfire"] == "skip"
    assert described["jitter_s"] == 30 and described["paused"] is False

    assert "paused" in run(db, "pause", "nightly", "--tenant", "college").output
    assert "already paused" in run(db, "pause", "nightly", "--tenant", "college").output
    assert json.loads(run(db, "list", "--json").output)["paused"] is True
    resumed = run(db, "resume", "nightly", "--tenant", "college")
    assert resumed.exit_code == Exit.OK and "resumed, next run" in resumed.output
    assert json.loads(run(db, "list", "--json").output)["paused"] is False

    assert run(db, "list", "--tenant", "board").output.strip() == "0 schedule(s)"
    assert run(db, "pause", "nightly", "--tenant", "board").exit_code == Exit.FAILURE  # another tenant's name space
    assert run(db, "delete", "nightly", "--tenant", "college").exit_code == Exit.OK
    assert run(db, "delete", "nightly", "--tenant", "college").exit_code == Exit.FAILURE
    assert run(db, "list").output.strip() == "0 schedule(s)"


@pytest.mark.parametrize(("flags", "message"), [
    (("--cron", "61 2 * * *"), "bad cron expression '61 2 * * *'"),
    (("--cron", "2 * * *"), "expected 5 fields"),
    (("--zone", "America/Gotham"), "unknown time zone 'America/Gotham'"),
    (("--misfire", "sometimes"), "unknown misfire policy 'sometimes'"),
    (("--jitter", "-5"), "jitter is a whole number of seconds from 0"),
    (("--grace", "-1"), "grace window"),
    (("--payload", "{nope"), "payload is not JSON"),
    (("--max-attempts", "0"), "max attempts"),
    (("--tenant", "c" * 101), "at most 100 characters"),  # every run would be a task no one can submit
    (("--type", "report\nnightly"), "type"),
])
def test_bad_input_is_exit_2_with_the_reason_and_nothing_written(tmp_path: Path, flags: tuple[str, str],
                                                                 message: str) -> None:
    db = tmp_path / "tasks.db"
    args = list(ADD)
    flag, value = flags
    if flag in args:
        args[args.index(flag) + 1] = value
    else:
        args += [flag, value]
    result = run(db, *args)
    assert result.exit_code == Exit.USAGE, result.output
    assert message in result.output
    assert not db.exists()  # refused before the store was opened


def test_preview_prints_local_and_utc_times_and_marks_the_dst_change(tmp_path: Path) -> None:
    result = run(tmp_path / "tasks.db", "preview", "--cron", "30 2 * * *", "--zone", "America/New_York",
                 "--from", "2026-03-06T00:00:00-05:00", "--count", "4")
    assert result.exit_code == Exit.OK, result.output
    lines = result.output.splitlines()
    assert lines[0].startswith("30 2 * * *  in America/New_York  (fixed time")
    assert lines[2].startswith("2026-03-06 Fri 02:30 EST -05:00") and "2026-03-06 07:30Z" in lines[2]
    assert lines[4].startswith("2026-03-08 Sun 03:00 EDT -04:00") and "2026-03-08 07:00Z" in lines[4]
    assert "DST: clocks go forward 1h on 2026-03-08 at 02:00 EST -> 03:00 EDT" in lines[4]
    assert "02:30 does not exist that day" in lines[4]
    assert lines[5].startswith("2026-03-09 Mon 02:30 EDT -04:00") and lines[5].endswith("06:30Z")
    assert not (tmp_path / "tasks.db").exists()  # an expression needs no store


def test_preview_names_the_day_of_a_change_at_local_midnight(tmp_path: Path) -> None:
    """Santiago, 2027: clocks go back at 00:00 -03 on Sunday the 4th (to 23:00 -04 of the
    3rd), and forward at 00:00 -04 on Sunday 5 September (to 01:00 -03)."""
    fall = run(tmp_path / "tasks.db", "preview", "--cron", "0 12 * * *", "--zone", "America/Santiago",
               "--from", "2027-04-01T00:00:00-03:00", "--count", "5")
    assert fall.exit_code == Exit.OK, fall.output
    lines = fall.output.splitlines()
    assert lines[5].startswith("2027-04-04 Sun 12:00 -04 -04:00") and "2027-04-04 16:00Z" in lines[5]
    assert lines[5].endswith("DST: clocks go back 1h on 2027-04-04 at 00:00 -03 -> 23:00 -04 on 2027-04-03")
    assert [line for line in lines if "DST:" in line] == [lines[5]]
    spring = run(tmp_path / "tasks.db", "preview", "--cron", "0 12 * * *", "--zone", "America/Santiago",
                 "--from", "2027-09-02T00:00:00-04:00", "--count", "5")
    assert spring.exit_code == Exit.OK, spring.output
    lines = spring.output.splitlines()
    assert lines[5].startswith("2027-09-05 Sun 12:00 -03 -03:00")
    assert lines[5].endswith("DST: clocks go forward 1h on 2027-09-05 at 00:00 -04 -> 01:00 -03")


def test_preview_of_a_stored_schedule_starts_at_its_next_slot(tmp_path: Path) -> None:
    db = tmp_path / "tasks.db"
    assert run(db, *ADD).exit_code == Exit.OK
    result = run(db, "preview", "nightly", "--tenant", "college", "--count", "3")
    assert result.exit_code == Exit.OK, result.output
    assert len(result.output.splitlines()) == 2 + 3
    assert run(db, "preview", "weekly", "--tenant", "college").exit_code == Exit.FAILURE


@pytest.mark.parametrize("args", [
    ("preview",),
    ("preview", "--cron", "0 2 * * *"),
    ("preview", "--cron", "0 2 * * *", "--zone", "Nowhere/City"),
    ("preview", "--cron", "0 2 * * *", "--zone", "UTC", "--from", "2026-03-06T00:00"),  # no zone
])
def test_preview_refuses_incomplete_or_bad_input(tmp_path: Path, args: tuple[str, ...]) -> None:
    assert run(tmp_path / "tasks.db", *args).exit_code == Exit.USAGE


def test_delete_cancels_the_runs_already_created_ahead(tmp_path: Path) -> None:
    from scheduler.adapters.embedded.schedules import SqliteScheduleStore
    from scheduler.adapters.embedded.store import SqliteTaskStore
    from scheduler.ports import TaskStatus
    from scheduler.producer import Client
    from scheduler.recurring.runner import ScheduleRunner, runs_ahead
    from scheduler.recurring.schedule import schedule_id

    db = tmp_path / "tasks.db"
    added = run(db, "add", "minutely", "--tenant", "college", "--cron", "* * * * *", "--zone", "UTC",
                "--type", "ping")
    assert added.exit_code == Exit.OK, added.output
    tasks, schedules = SqliteTaskStore(db), SqliteScheduleStore(db)
    try:
        found = schedules.get(schedule_id("college", "minutely"))
        assert found is not None
        # A pass as if a minute past the first slot: runs up to ~2.5 minutes ahead of now.
        ScheduleRunner(schedules, Client(tasks, handoff=None), clock=lambda: found.next_slot_ms + 60_000).run_shard(
            found.shard(64), token=1)
        advanced = schedules.get(found.id)
        assert advanced is not None
    finally:
        schedules.close()
        tasks.close()
    # The runs due well after the delete starts (whatever the clock reads by then) must be cancelled.
    ahead = runs_ahead(advanced, time.time_ns() // 1_000_000 + 10_000)
    assert len(ahead) >= 1
    deleted = run(db, "delete", "minutely", "--tenant", "college")
    assert deleted.exit_code == Exit.OK, deleted.output
    assert "run(s) created ahead cancelled" in deleted.output
    tasks = SqliteTaskStore(db)
    try:
        assert {tasks.get(task_id).status for task_id in ahead} == {TaskStatus.CANCELLED}  # type: ignore[union-attr]
    finally:
        tasks.close()


def test_list_shows_the_slots_a_schedule_skipped(tmp_path: Path) -> None:
    """Slots past the retention get no run: `list` shows how many and the last, with the
    schedule (plain and --json)."""
    from scheduler.adapters.embedded.schedules import SqliteScheduleStore
    from scheduler.ports import AdvanceOutcome

    db = tmp_path / "tasks.db"
    assert run(db, *ADD).exit_code == Exit.OK
    assert json.loads(run(db, "list", "--json").output)["skipped"] == 0
    assert "skipped" not in run(db, "list").output
    schedules = SqliteScheduleStore(db)
    try:
        (stored,) = schedules.list_all("college")
        day = 86_400_000
        skipped_ms = stored.next_slot_ms + day
        assert schedules.advance(stored, stored.next_slot_ms + 2 * day, token=1, skipped=2,
                                 last_skipped_ms=skipped_ms) is AdvanceOutcome.APPLIED
    finally:
        schedules.close()
    described = json.loads(run(db, "list", "--json").output)
    assert described["skipped"] == 2 and described["last_skipped"].endswith("Z")
    assert "skipped 2, last " in run(db, "list").output
