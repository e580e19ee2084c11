"""`plan_runs`: which runs a creation pass makes, on time and after an outage, for each
misfire policy, and past the store's retention. Pure: the time is an argument."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from scheduler.model import to_ms
from scheduler.recurring.cron import CronRule
from scheduler.recurring.misfire import RunPlan, newest_before, plan_runs
from scheduler.recurring.schedule import MisfirePolicy
from scheduler.retention import oldest_keyed_run_ms

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


def on(day: int, text: str) -> int:
    return to_ms(datetime.fromisoformat(f"2026-12-{day:02d}T{text}").replace(tzinfo=UTC))


def after_gap(policy: MisfirePolicy, rule: CronRule = HOURLY, limit: int = 100) -> RunPlan:
    """Down from Dec 1 06:00 to Dec 9 09:10, a 7-day retention (the module docstring's example)."""
    return plan_runs(rule, on(1, "06:00"), on(9, "09:10"), lookahead_ms=LOOKAHEAD_MS, grace_ms=GRACE_MS,
                     policy=policy, limit=limit, oldest_ms=oldest_keyed_run_ms(7 * 86_400, on(9, "09:10")))


def test_all_skips_the_slots_past_the_retention_and_creates_the_rest() -> None:
    made = after_gap(MisfirePolicy.ALL, limit=1000)
    assert (made.skipped, made.first_skipped_ms, made.last_skipped_ms) == (28, on(1, "06:00"), on(2, "09:00"))
    assert made.slots[0] == on(2, "10:00") and made.slots[-1] == on(9, "09:00") and made.next_slot_ms == on(9, "10:00")
    assert len(made.slots) == 7 * 24 and made.missed == 0 and made.catch_up_at_ms is None


def test_once_past_the_retention_catches_up_with_the_newest_missed_slot() -> None:
    made = after_gap(MisfirePolicy.ONCE)
    assert made.slots == (on(9, "09:00"),) and made.next_slot_ms == on(9, "10:00") and made.catch_up_at_ms is None
    assert (made.skipped, made.first_skipped_ms, made.last_skipped_ms) == (1, on(1, "06:00"), on(1, "06:00"))
    assert made.missed == 8 * 24 + 4 - 2  # every missed slot is the catch-up, skipped, or missed


def test_once_catches_up_now_when_every_missed_slot_is_past_the_retention() -> None:
    weekly = CronRule("0 6 * * 2", "UTC")  # Tuesdays 06:00: Dec 1 and Dec 8, both before the edge here
    now = on(9, "09:10")
    made = plan_runs(weekly, on(1, "06:00"), now, lookahead_ms=LOOKAHEAD_MS, grace_ms=GRACE_MS,
                     policy=MisfirePolicy.ONCE, oldest_ms=oldest_keyed_run_ms(3600, now))
    assert made.slots == (on(8, "06:00"),) and made.catch_up_at_ms == on(9, "09:10")  # due now, for the newest
    assert (made.skipped, made.missed, made.next_slot_ms) == (1, 0, on(15, "06:00"))


def test_skip_past_the_retention_is_as_before() -> None:
    made = after_gap(MisfirePolicy.SKIP)
    assert (made.slots, made.next_slot_ms, made.skipped) == ((), on(9, "10:00"), 0)


def test_a_slot_within_a_grace_longer_than_the_retention_is_skipped() -> None:
    now = at("09:10")
    made = plan_runs(HOURLY, at("09:00"), now, lookahead_ms=LOOKAHEAD_MS, grace_ms=3_600_000,
                     policy=MisfirePolicy.SKIP, oldest_ms=oldest_keyed_run_ms(60, now))
    assert (made.slots, made.skipped, made.last_skipped_ms, made.next_slot_ms) == ((), 1, at("09:00"), at("10:00"))


def test_newest_before_finds_the_last_slot_of_a_long_span() -> None:
    minutely = CronRule("* * * * *", "UTC")
    assert newest_before(minutely, on(1, "00:00"), on(9, "09:10")) == on(9, "09:09")
    assert newest_before(HOURLY, at("06:00"), at("06:30")) == at("06:00")
