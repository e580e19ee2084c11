"""`WindowRate`: never more than the rate in any one-second window, and paced evenly."""

from __future__ import annotations

import random

from scheduler.fairness.rate import WindowRate
from tests.support import max_window


def drain(limiter: WindowRate, rate: float, costs: list[int], ticks: list[int]) -> list[tuple[int, int]]:
    """Release `costs` in order at the given tick times, as many per tick as allowed."""
    released: list[tuple[int, int]] = []
    queue = list(costs)
    for now in ticks:
        while queue and limiter.allows(now, queue[0], rate):
            limiter.take(now, queue[0], rate)
            released.append((now, queue.pop(0)))
    return released


def test_no_window_holds_more_than_the_rate_whatever_the_costs_and_ticks() -> None:
    rng = random.Random(7)
    for _ in range(20):
        rate = rng.choice([50.0, 333.0, 2000.0])
        limiter = WindowRate()
        costs = [rng.randint(1, int(min(rate, 500))) for _ in range(3000)]
        now, ticks = 0, []
        for _ in range(400):
            now += rng.choice([1, 7, 50, 100, 100, 100, 250, 999, 1000, 1001])
            ticks.append(now)
        released = drain(limiter, rate, costs, ticks)
        assert released, "something must leave"
        assert max_window(released) <= rate


def test_a_backlog_leaves_evenly_at_the_rate() -> None:
    limiter = WindowRate()
    ticks = list(range(0, 10_000, 100))
    released = drain(limiter, 2000.0, [1] * 100_000, ticks)
    per_tick: dict[int, int] = {}
    for at, units in released:
        per_tick[at] = per_tick.get(at, 0) + units
    total = sum(per_tick.values())
    assert 19_500 <= total <= 20_000, total  # 10 s at 2,000 a second, never more
    # paced: no tick lets out more than the pace's tolerance (250 ms) of the rate
    assert max(per_tick.values()) <= 2000 * 0.25 + 1
    assert max_window(released) <= 2000


def test_waking_when_the_window_frees_loses_no_throughput_to_late_ticks() -> None:
    limiter = WindowRate()
    released: list[tuple[int, int]] = []
    now, queue = 3, 30_000
    while now < 10_003:
        while queue and limiter.allows(now, 1, 1000.0):
            limiter.take(now, 1, 1000.0)
            released.append((now, 1))
            queue -= 1
        # ticks land 3 ms late; a full window wakes the releaser when it frees instead
        next_tick = now - now % 100 + 103
        frees = limiter.window_frees_at(1, 1000.0)
        now = next_tick if frees is None else min(next_tick, max(now + 1, int(frees) + 1))
    assert max_window(released) <= 1000
    assert len(released) >= 9_900, "10 s at 1,000 a second"


def test_a_task_costlier_than_the_whole_window_still_leaves_then_holds_the_next_back() -> None:
    limiter = WindowRate()
    assert limiter.allows(0, 500, 100.0)
    limiter.take(0, 500, 100.0)
    # 500 units at 100 a second: the pace holds the next release ~5 s
    assert not limiter.allows(4000, 1, 100.0)
    assert limiter.allows(4900, 1, 100.0)


def test_a_release_counts_for_one_window_after_it() -> None:
    limiter = WindowRate(tolerance_ms=1000)
    limiter.take(300, 100, 100.0)
    assert limiter.in_window(1299) == 100
    assert not limiter.allows(1299, 1, 100.0)
    assert limiter.in_window(1300) == 0
    assert limiter.allows(1300, 1, 100.0)


def test_a_lower_rate_applies_at_once() -> None:
    limiter = WindowRate(tolerance_ms=1000)
    for _ in range(50):
        limiter.take(0, 1, 1000.0)
    assert limiter.allows(10, 1, 1000.0)
    assert not limiter.allows(10, 1, 40.0)  # 50 already in the window


def test_only_a_full_window_asks_for_an_early_wake() -> None:
    limiter = WindowRate()
    limiter.take(0, 1, 1000.0)
    assert limiter.window_frees_at(1, 1000.0) is None, "only the pace holds it: the next tick will do"
    for _ in range(999):
        limiter.take(0, 1, 1000.0)
    assert limiter.window_frees_at(1, 1000.0) == 1000
