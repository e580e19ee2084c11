"""Slots of cron expressions in time zones: the DST rules of `scheduler.recurring.cron`,
jitter, and what `preview` says about DST changes. All on fixed instants: no clock."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from itertools import islice

import pytest

from scheduler.errors import InvalidSchedule
from scheduler.model import to_ms
from scheduler.recurring.cron import CronRule
from scheduler.recurring.jitter import jitter_ms
from scheduler.recurring.preview import preview, render

pytestmark = pytest.mark.timeout(60)


def utc_ms(text: str) -> int:
    return to_ms(datetime.fromisoformat(text).replace(tzinfo=UTC))


def local_slots(rule: CronRule, after_utc: str, count: int) -> list[str]:
    """The slots as local ISO times with their offsets."""
    return [rule.local(slot).isoformat() for slot in islice(rule.slots_after(utc_ms(after_utc)), count)]


def test_a_daily_time_in_kolkata_is_that_wall_time_every_day() -> None:
    rule = CronRule("0 2 * * *", "Asia/Kolkata")
    assert local_slots(rule, "2026-12-01T00:00", 2) == ["2026-12-02T02:00:00+05:30", "2026-12-03T02:00:00+05:30"]
    assert rule.next_slot(utc_ms("2026-12-01T00:00")) == utc_ms("2026-12-01T20:30")


@pytest.mark.parametrize(("cron", "after", "expected"), [
    ("*/5 * * * *", "2026-12-01T10:02", ["2026-12-01T10:05:00+00:00", "2026-12-01T10:10:00+00:00"]),
    ("30 9 1 * *", "2026-12-01T10:00", ["2027-01-01T09:30:00+00:00", "2027-02-01T09:30:00+00:00"]),
    ("0 10 * * 1-5", "2026-12-04T11:00", ["2026-12-07T10:00:00+00:00", "2026-12-08T10:00:00+00:00"]),  # Fri -> Mon
])
def test_every_5_minutes_monthly_and_weekdays(cron: str, after: str, expected: list[str]) -> None:
    assert local_slots(CronRule(cron, "UTC"), after, 2) == expected


def test_a_slot_is_strictly_after_its_start() -> None:
    rule = CronRule("*/5 * * * *", "UTC")
    assert rule.next_slot(utc_ms("2026-12-01T10:05")) == utc_ms("2026-12-01T10:10")


# Spring forward: a local time that does not exist runs once, at the next valid instant.

@pytest.mark.parametrize(("zone", "cron", "after", "expected"), [
    # New York, 2026-03-08: 02:00 EST -> 03:00 EDT; 02:30 does not exist.
    ("America/New_York", "30 2 * * *", "2026-03-07T12:00",
     ["2026-03-08T03:00:00-04:00", "2026-03-09T02:30:00-04:00"]),
    # London, 2026-03-29: 01:00 GMT -> 02:00 BST; 01:30 does not exist.
    ("Europe/London", "30 1 * * *", "2026-03-28T12:00", ["2026-03-29T02:00:00+01:00", "2026-03-30T01:30:00+01:00"]),
    # Lord Howe, 2026-10-04: 02:00 +10:30 -> 02:30 +11:00 (a 30-minute shift); 02:15 does not exist.
    ("Australia/Lord_Howe", "15 2 * * *", "2026-10-03T00:00",
     ["2026-10-04T02:30:00+11:00", "2026-10-05T02:15:00+11:00"]),
])
def test_a_missing_local_time_runs_once_at_the_next_valid_instant(zone: str, cron: str, after: str,
                                                                 expected: list[str]) -> None:
    assert local_slots(CronRule(cron, zone), after, 2) == expected


def test_two_times_moved_onto_one_instant_are_one_slot() -> None:
    # 02:00 does not exist and moves to 03:00, which the expression also names.
    rule = CronRule("0 2,3 * * *", "America/New_York")
    assert local_slots(rule, "2026-03-07T12:00", 3) == [
        "2026-03-08T03:00:00-04:00", "2026-03-09T02:00:00-04:00", "2026-03-09T03:00:00-04:00"]


# Fall back: a repeated local time runs once, at its first occurrence.

@pytest.mark.parametrize(("zone", "cron", "after", "expected"), [
    # New York, 2026-11-01: 02:00 EDT -> 01:00 EST; 01:30 happens twice.
    ("America/New_York", "30 1 * * *", "2026-10-31T12:00", ["2026-11-01T01:30:00-04:00", "2026-11-02T01:30:00-05:00"]),
    # London, 2026-10-25: 02:00 BST -> 01:00 GMT; 01:30 happens twice.
    ("Europe/London", "30 1 * * *", "2026-10-24T12:00", ["2026-10-25T01:30:00+01:00", "2026-10-26T01:30:00+00:00"]),
    # Lord Howe, 2026-04-05: 02:00 +11:00 -> 01:30 +10:30; 01:45 happens twice.
    ("Australia/Lord_Howe", "45 1 * * *", "2026-04-04T00:00",
     ["2026-04-05T01:45:00+11:00", "2026-04-06T01:45:00+10:30"]),
])
def test_a_repeated_local_time_runs_once(zone: str, cron: str, after: str, expected: list[str]) -> None:
    assert local_slots(CronRule(cron, zone), after, 2) == expected


def test_a_fixed_time_slot_read_from_inside_the_repeated_hour_does_not_run_again() -> None:
    """A creator that resumes at 01:40 EST (the second 01:40) must not create 01:30 EST."""
    rule = CronRule("30 1 * * *", "America/New_York")
    first_pass = utc_ms("2026-11-01T05:30")  # 01:30 EDT
    assert rule.next_slot(first_pass) == utc_ms("2026-11-02T06:30")
    assert rule.next_slot(utc_ms("2026-11-01T06:10")) == utc_ms("2026-11-02T06:30")  # from 01:10 EST


# Interval schedules follow elapsed time (the rule chosen for wildcard hours and minutes).

def test_an_interval_schedule_runs_in_both_passes_of_a_repeated_hour() -> None:
    rule = CronRule("*/30 * * * *", "America/New_York")
    assert local_slots(rule, "2026-11-01T04:40", 5) == [
        "2026-11-01T01:00:00-04:00", "2026-11-01T01:30:00-04:00",
        "2026-11-01T01:00:00-05:00", "2026-11-01T01:30:00-05:00", "2026-11-01T02:00:00-05:00"]
    slots = list(islice(rule.slots_after(utc_ms("2026-11-01T04:40")), 5))
    assert [b - a for a, b in zip(slots, slots[1:], strict=False)] == [30 * 60_000] * 4  # real elapsed time


def test_an_hourly_schedule_keeps_an_hour_of_real_time_across_both_changes() -> None:
    rule = CronRule("0 * * * *", "Europe/London")
    spring = list(islice(rule.slots_after(utc_ms("2026-03-29T00:30")), 3))
    autumn = list(islice(rule.slots_after(utc_ms("2026-10-24T23:30")), 3))
    assert [rule.local(s).strftime("%H:%M%z") for s in spring] == ["02:00+0100", "03:00+0100", "04:00+0100"]
    assert [rule.local(s).strftime("%H:%M%z") for s in autumn] == ["01:00+0100", "01:00+0000", "02:00+0000"]
    for slots in (spring, autumn):
        assert [b - a for a, b in zip(slots, slots[1:], strict=False)] == [3_600_000] * 2


def test_an_interval_schedule_inside_a_missing_hour_has_no_slot_that_day() -> None:
    rule = CronRule("*/15 2 * * *", "America/New_York")
    assert local_slots(rule, "2026-03-07T12:00", 1) == ["2026-03-09T02:00:00-04:00"]


# Bad input.

@pytest.mark.parametrize(("cron", "zone", "message"), [
    ("61 * * * *", "UTC", "bad cron expression '61 * * * *'"),
    ("* * * *", "UTC", "expected 5 fields"),
    ("0 0 * * * *", "UTC", "expected 5 fields"),
    ("0 0 31 2 *", "UTC", "bad cron expression"),
    ("0 2 * * *", "Asia/Kolkatta", "unknown time zone 'Asia/Kolkatta'"),
    ("0 2 * * *", "", "needs a time zone"),
    ("0 2 * * *", "../etc/passwd", "unknown time zone"),
])
def test_bad_expressions_and_zones_are_refused_with_the_reason(cron: str, zone: str, message: str) -> None:
    with pytest.raises(InvalidSchedule, match=message.replace("*", r"\*").replace("(", r"\(")):
        CronRule(cron, zone)


# Jitter.

def test_jitter_is_deterministic_within_its_bound_and_spreads_runs() -> None:
    schedule = uuid.UUID(int=42)
    offsets = [jitter_ms(schedule, slot * 3_600_000, 300) for slot in range(500)]
    assert offsets == [jitter_ms(schedule, slot * 3_600_000, 300) for slot in range(500)]
    assert all(0 <= offset < 300_000 for offset in offsets)
    assert len(set(offsets)) > 450  # spread, not a constant
    assert max(offsets) - min(offsets) > 250_000
    assert [jitter_ms(uuid.UUID(int=43), slot * 3_600_000, 300) for slot in range(500)] != offsets
    assert jitter_ms(schedule, 0, 0) == 0


# Preview.

def test_preview_marks_the_spring_forward_and_the_moved_run() -> None:
    rule = CronRule("30 2 * * *", "America/New_York")
    rows = preview(rule, utc_ms("2026-03-06T00:00"), 4)
    assert [row.notes for row in rows[:2]] == [(), ()]
    assert rows[2].notes == ("DST: clocks go forward 1h on 2026-03-08 at 02:00 EST -> 03:00 EDT",
                             "02:30 does not exist that day: runs once at the next valid time")
    assert rows[3].notes == ()
    lines = render(rule, rows)
    assert lines[4].startswith("2026-03-08 Sun 03:00 EDT -04:00") and "2026-03-08 07:00Z" in lines[4]


def test_preview_marks_the_fall_back_and_both_passes_of_an_interval_schedule() -> None:
    rule = CronRule("*/30 * * * *", "America/New_York")
    rows = preview(rule, utc_ms("2026-11-01T04:40"), 4)
    assert [row.local.strftime("%H:%M %Z") for row in rows] == ["01:00 EDT", "01:30 EDT", "01:00 EST", "01:30 EST"]
    assert rows[0].notes == ("repeated hour, first pass: runs by elapsed time",)
    assert rows[2].notes[0] == "DST: clocks go back 1h on 2026-11-01 at 02:00 EDT -> 01:00 EST"
    assert rows[2].notes[1] == "repeated hour, second pass: runs by elapsed time"


def test_preview_of_a_30_minute_shift() -> None:
    rule = CronRule("45 1 * * *", "Australia/Lord_Howe")
    rows = preview(rule, utc_ms("2026-04-03T12:00"), 3)
    assert rows[1].notes == ("01:45 happens twice that day: runs once, at the first",)
    assert rows[2].notes == ("DST: clocks go back 30m on 2026-04-05 at 02:00 +11 -> 01:30 +1030",)


@pytest.mark.parametrize(("cron", "local_time"), [("0 12 * * *", "12:00"), ("30 0 * * *", "00:30")])
def test_preview_dates_a_fall_back_at_midnight_on_the_day_it_happens(cron: str, local_time: str) -> None:
    """Santiago's clocks go back at 00:00 -03 on Sunday 2027-04-04, to 23:00 -04 of the
    Saturday: the change is on the 4th, and the wall clock it goes back to is on the 3rd."""
    rule = CronRule(cron, "America/Santiago")
    rows = preview(rule, utc_ms("2027-04-01T03:00"), 5)  # 2027-04-01T00:00-03:00
    assert [row.local.strftime("%Y-%m-%d %H:%M %Z") for row in rows[2:4]] == [
        f"2027-04-03 {local_time} -03", f"2027-04-04 {local_time} -04"]
    assert rows[3].notes[0] == "DST: clocks go back 1h on 2027-04-04 at 00:00 -03 -> 23:00 -04 on 2027-04-03"
    assert [row.notes for row in rows if row is not rows[3]] == [(), (), (), ()]


def test_preview_dates_a_spring_forward_at_midnight_and_moves_the_missing_run() -> None:
    """Santiago's clocks go forward at 00:00 -04 on 2027-09-05, to 01:00 -03: the same day,
    so no second date; 00:30 does not exist that day and runs at 01:00."""
    rule = CronRule("30 0 * * *", "America/Santiago")
    rows = preview(rule, utc_ms("2027-09-02T04:00"), 5)  # 2027-09-02T00:00-04:00
    assert rows[3].local.isoformat() == "2027-09-05T01:00:00-03:00"
    assert rows[3].notes == ("DST: clocks go forward 1h on 2027-09-05 at 00:00 -04 -> 01:00 -03",
                             "00:30 does not exist that day: runs once at the next valid time")
    assert rows[4].local.isoformat() == "2027-09-06T00:30:00-03:00" and rows[4].notes == ()


def test_preview_dates_a_spring_forward_from_23_00_on_the_day_before_the_new_clock() -> None:
    """Nuuk's clocks go forward at 23:00 -02 on Saturday 2027-03-27, to 00:00 -01 of the Sunday."""
    rule = CronRule("0 12 * * *", "America/Nuuk")
    if rule.local(utc_ms("2027-03-27T12:00")).utcoffset() != timedelta(hours=-2):
        pytest.skip("this time zone database predates Greenland's move to -02 (tzdata 2023c)")
    rows = preview(rule, utc_ms("2027-03-26T00:00"), 3)
    assert rows[2].local.isoformat() == "2027-03-28T12:00:00-01:00"
    assert rows[2].notes == ("DST: clocks go forward 1h on 2027-03-27 at 23:00 -02 -> 00:00 -01 on 2027-03-28",)
