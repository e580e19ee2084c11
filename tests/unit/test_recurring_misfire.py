"""`plan_runs`: which runs a creation pass makes, on time and after an outage, for each
misfire policy. Pure: the time is an argument."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from scheduler.model import to_ms
from scheduler.recurring.cron import CronRule
from scheduler.recurring.misfire import plan_runs
from scheduler.recurring.schedule import MisfirePolicy

pytestmark = pytest.mark.timeout(60)

HOURLY = CronRule("0 * * * *", "UTC")
LOOKAHEAD_MS = 90_000
GRACE_MS = 300_000


def at(text: str) -> int:
    return to_ms(datetime.fromisoformat(f"2026-12-01T{text}").replace(tzinfo=UTC))


def plan(policy: MisfirePolicy, next_slot: str, now: str, limit: int = 100) -> tuple[list[int], int, int]:
    made = plan_runs(HOURLY, at(next_slot), at(now), lookahead_ms=LOOKAHEAD_MS, grace_ms=GRACE_MS, policy=policy,
                     limit=limit)
    return list(made.slots), made.next_slot_ms, made.missed


@pytest.mark.parametrize("policy", list(MisfirePolicy))
def test_on_time_a_slot_is_created_once_it_is_within_the_lookahead(policy: MisfirePolicy) -> None:
    assert plan(policy, "10:00", "09:58:00") == ([], at("10:00"), 0)  # 120 s ahead: not yet
    assert plan(policy, "10:00", "09:58:31") == ([at("10:00")], at("11:00"), 0)


@pytest.mark.parametrize("policy", list(MisfirePolicy))
def test_a_slot_late_within_the_grace_is_created_whatever_the_policy(policy: MisfirePolicy) -> None:
    assert plan(policy, "10:00", "10:04:59") == ([at("10:00")], at("11:00"), 0)


def test_all_creates_every_missed_slot() -> None:
    assert plan(MisfirePolicy.ALL, "06:00", "09:10") == (
        [at("06:00"), at("07:00"), at("08:00"), at("09:00")], at("10:00"), 0)


def test_all_creates_a_long_outage_in_bounded_passes() -> None:
    slots, next_slot, _ = plan(MisfirePolicy.ALL, "00:00", "09:10", limit=4)
    assert slots == [at("00:00"), at("01:00"), at("02:00"), at("03:00")] and next_slot == at("04:00")


def test_once_creates_one_catch_up_run_for_the_first_missed_slot() -> None:
    assert plan(MisfirePolicy.ONCE, "06:00", "09:10") == ([at("06:00")], at("10:00"), 3)


def test_once_catches_up_and_creates_the_next_slot_when_it_is_near() -> None:
    assert plan(MisfirePolicy.ONCE, "06:00", "09:59") == ([at("06:00"), at("10:00")], at("11:00"), 3)


def test_skip_creates_nothing_for_missed_slots_and_continues_on_time() -> None:
    assert plan(MisfirePolicy.SKIP, "06:00", "09:10") == ([], at("10:00"), 4)
    assert plan(MisfirePolicy.SKIP, "06:00", "09:03") == ([at("09:00")], at("10:00"), 3)  # 09:00 within grace


def test_a_plan_for_a_schedule_already_ahead_changes_nothing() -> None:
    made = plan_runs(HOURLY, at("11:00"), at("09:59"), lookahead_ms=LOOKAHEAD_MS, grace_ms=GRACE_MS,
                     policy=MisfirePolicy.ONCE)
    assert not made.changes and made.next_slot_ms == at("11:00")
