"""The fairness scenario (`--scenario fairness`): results day under the provider's limit.

The workload (`submissions`): at M the board's 400 tasks of cost 75 (30,000 SMS), and
12,000 tasks of cost 1 each for gold (weight 3) and free (weight 1); at M + 5 s the
college's 50 tasks of cost 1, priority high (`FairnessMix` holds the numbers). The
limits (`apply_limits`, through `scheduler limits set`, before the dispatchers start):
the global rate R and each tenant's weight.

The figures (`fairness_figures`), from the ready topics alone: a message's Kafka
timestamp is the moment the dispatcher's gate released it (the bench leaves the ready
topics at `CreateTime` for this scenario: the dispatcher stamps each message with its
release; the embedded log keeps the same stamp).

- per tenant: tasks, units, release lateness (first release - run_at of every task:
  p50, p90, p99, max) and first and last release after M;
- the most units released in any half-open 1-s window `[a, a + 1 s)` of timestamps
  (every message, repeats too: each went out), against R;
- the drain rate: every tenant's units in the middle 10 s of the board's releases
  (first to last; its whole span if shorter), a second, against R (the limit is used
  up, not just respected);
- the weights: gold / free units released from M + 1 s until the first of the two
  released its last task, less 1 s (both backlogged throughout), against 3.

`fairness_checks` sets them against their targets for the document's `targets`."""

from __future__ import annotations

import json
import math
import os
import random
import subprocess
import sys
from collections.abc import Iterable, Sequence
from typing import Any

from scheduler.errors import InvalidMessage
from scheduler.model import Priority, decode_message, from_ms
from scheduler.producer import Submission

from .common import BenchFailure
from .deployment import REPOSITORY
from .reader import Record
from .settings import (
    FAIRNESS_WEIGHTS,
    TARGET_COLLEGE_P99_MS,
    TARGET_DRAIN_SHARE,
    TARGET_WEIGHT_ERROR,
    TASK_TYPE,
    FairnessMix,
)

WINDOW_MS = 1000
DRAIN_WINDOW_MS = 10_000
BACKLOG_MARGIN_MS = 1000
"""The weights are measured from M + this until the first of gold and free ran dry, less this."""


def submissions(mix: FairnessMix, minute_ms: int, text_len: int, seed: int) -> list[Submission]:
    """The scenario's tasks, SMS-shaped payloads of about the burst's size."""
    rng = random.Random(seed)
    filler = "Visit results.example.in for marks and the revaluation form. " * (text_len // 60 + 1)
    at_m, college_at = from_ms(minute_ms), from_ms(minute_ms + round(mix.college_at_s * 1000))

    def payload() -> dict[str, str]:
        text = f"Roll no. {rng.randrange(10**7):07d}: your result is out. {filler}"[:text_len]
        return {"to": f"+9198{rng.randrange(10**8):08d}", "text": text}

    items = [Submission(TASK_TYPE, payload(), tenant="board", run_at=at_m, cost=mix.board_cost)
             for _ in range(mix.board_tasks)]
    for _ in range(mix.weight_tasks):  # interleaved, so neither is stored (and loaded) first
        items.append(Submission(TASK_TYPE, payload(), tenant="gold", run_at=at_m))
        items.append(Submission(TASK_TYPE, payload(), tenant="free", run_at=at_m))
    items += [Submission(TASK_TYPE, payload(), tenant="college", run_at=college_at, priority=Priority.HIGH)
              for _ in range(mix.college_tasks)]
    return items


def apply_limits(mix: FairnessMix, env: dict[str, str], arguments: Sequence[str]) -> dict[str, Any]:
    """`scheduler limits set` for the global rate and each tenant's weight, as an operator
    would; then `limits show --json`, what the dispatchers will read."""

    def scheduler(*args: str) -> str:
        done = subprocess.run([sys.executable, "-m", "scheduler", "limits", *args], capture_output=True, text=True,
                              env={**os.environ, **env}, cwd=REPOSITORY, timeout=120)
        if done.returncode != 0:
            raise BenchFailure(f"scheduler limits {' '.join(args)} failed ({done.returncode}): "
                               f"{done.stderr.strip()[-500:]}")
        return done.stdout

    scheduler("set", *arguments, "--global", "--rate", f"{mix.global_rate:g}")
    for tenant, weight in FAIRNESS_WEIGHTS.items():
        scheduler("set", *arguments, "--tenant", tenant, "--weight", str(weight))
    shown: dict[str, Any] = json.loads(scheduler("show", *arguments, "--json"))
    return shown


def percentile(ordered: Sequence[int], share: float) -> int | None:
    """Nearest-rank percentile of an ascending sequence (as `report.percentile`)."""
    if not ordered:
        return None
    return ordered[max(0, math.ceil(share * len(ordered)) - 1)]


def max_window_units(released: Iterable[tuple[int, int]], window_ms: int = WINDOW_MS) -> tuple[int, int | None]:
    """The most units of (timestamp, cost) pairs in any half-open window `[a, a + window_ms)`,
    and the timestamp that window ends with."""
    stamps = sorted(released)
    best = total = start = 0
    at: int | None = None
    for stamp, cost in stamps:
        total += cost
        while stamps[start][0] <= stamp - window_ms:
            total -= stamps[start][1]
            start += 1
        if total > best:
            best, at = total, stamp
    return best, at


def per_second(released: Iterable[tuple[int, int]], minute_ms: int) -> list[int]:
    """Units released in each second after M (for the plot)."""
    counts: list[int] = []
    for stamp, cost in released:
        second = max(0, (stamp - minute_ms) // 1000)
        counts.extend([0] * (second + 1 - len(counts)))
        counts[second] += cost
    return counts


def units_between(released: Iterable[tuple[int, int]], start_ms: int, end_ms: int) -> int:
    return sum(cost for stamp, cost in released if start_ms <= stamp < end_ms)


def fairness_figures(records: list[Record], expected: dict[bytes, int], minute_ms: int,
                     mix: FairnessMix, ceiling_msgs_per_s: int | None) -> dict[str, Any]:
    """The scenario's figures from every message read (see the module's docstring); the
    records' timestamps are the moments of release."""
    first: dict[bytes, tuple[int, str, int, int]] = {}  # id -> (first stamp, tenant, cost, run_at)
    every: list[tuple[int, int]] = []  # (stamp, cost) of every message of the run's tasks
    for value, stamp, _ in records:
        try:
            task = decode_message(value).task
        except InvalidMessage:
            continue
        key = task.id.bytes
        if key not in expected:
            continue
        every.append((stamp, task.cost))
        if key not in first or stamp < first[key][0]:
            first[key] = (stamp, task.tenant, task.cost, expected[key])
    by_tenant: dict[str, list[tuple[int, int, int]]] = {}  # tenant -> (stamp, cost, run_at) of first releases
    for stamp, tenant, cost, run_at in first.values():
        by_tenant.setdefault(tenant, []).append((stamp, cost, run_at))

    tenants: dict[str, Any] = {}
    for tenant in FAIRNESS_WEIGHTS:
        released = sorted(by_tenant.get(tenant, []))
        lateness = sorted(stamp - run_at for stamp, _, run_at in released)
        tenants[tenant] = {
            "weight": FAIRNESS_WEIGHTS[tenant], "tasks": len(released), "units": sum(c for _, c, _ in released),
            "lateness_ms": {"p50": percentile(lateness, 0.5), "p90": percentile(lateness, 0.9),
                            "p99": percentile(lateness, 0.99), "max": lateness[-1] if lateness else None,
                            "early": sum(1 for value in lateness if value < 0)},
            "first_release_after_minute_ms": released[0][0] - minute_ms if released else None,
            "last_release_after_minute_ms": released[-1][0] - minute_ms if released else None,
            "units_per_s": per_second([(stamp, cost) for stamp, cost, _ in released], minute_ms),
        }

    worst, worst_at = max_window_units(every)
    rate = {"configured_units_per_s": mix.global_rate, "max_units_in_1s": worst,
            "max_window_ends_after_minute_ms": None if worst_at is None else worst_at - minute_ms,
            "within": worst <= mix.global_rate,
            "kafka_or_queue_ceiling_msgs_per_s": ceiling_msgs_per_s}

    board = [(stamp, cost) for stamp, cost, _ in by_tenant.get("board", [])]
    drain: dict[str, Any] = {"window_ms": None, "units_per_s": None, "vs_global_rate": None}
    if board:
        low, high = min(s for s, _ in board), max(s for s, _ in board)
        if high - low > DRAIN_WINDOW_MS:
            middle = (low + high) // 2
            start, end = middle - DRAIN_WINDOW_MS // 2, middle + DRAIN_WINDOW_MS // 2
        else:
            start, end = low, high + 1
        if end - start >= 1000:  # a shorter span says nothing of a rate a second
            board_units = units_between(board, start, end)
            # every tenant's units: while gold and free wait too, the board gets its
            # weight's part of the rate, and the rate itself is what must be used up
            per_s = units_between(every, start, end) / ((end - start) / 1000)
            drain = {"window_after_minute_ms": [start - minute_ms, end - minute_ms], "window_ms": end - start,
                     "board_units": board_units, "all_units": units_between(every, start, end),
                     "units_per_s": round(per_s, 1), "vs_global_rate": round(per_s / mix.global_rate, 3)}

    weights: dict[str, Any] = {"configured_ratio": FAIRNESS_WEIGHTS["gold"] / FAIRNESS_WEIGHTS["free"],
                               "window_ms": None, "ratio": None, "error": None}
    gold = [(stamp, cost) for stamp, cost, _ in by_tenant.get("gold", [])]
    free = [(stamp, cost) for stamp, cost, _ in by_tenant.get("free", [])]
    if gold and free:
        start = minute_ms + BACKLOG_MARGIN_MS
        end = min(max(s for s, _ in gold), max(s for s, _ in free)) - BACKLOG_MARGIN_MS
        weights["window_after_minute_ms"] = [start - minute_ms, end - minute_ms]
        if end > start:
            gold_units, free_units = units_between(gold, start, end), units_between(free, start, end)
            weights.update({"window_ms": end - start, "gold_units": gold_units, "free_units": free_units})
            if free_units:
                ratio = gold_units / free_units
                weights.update({"ratio": round(ratio, 3),
                                "error": round(ratio / weights["configured_ratio"] - 1, 3)})
    return {"mix": {"board_tasks": mix.board_tasks, "board_cost": mix.board_cost, "weight_tasks": mix.weight_tasks,
                    "college_tasks": mix.college_tasks, "college_at_s": mix.college_at_s, "units": mix.units,
                    "drain_s_at_global_rate": round(mix.drain_s, 1)},
            "tenants": tenants, "global_rate": rate, "board_drain": drain, "weights": weights}


def fairness_checks(figures: dict[str, Any], mix: FairnessMix) -> list[dict[str, Any]]:
    """The scenario's figures against their targets, in the shape of `report.judge`'s."""
    college_p99 = figures["tenants"]["college"]["lateness_ms"]["p99"]
    error = figures["weights"]["error"]
    drain = figures["board_drain"]["units_per_s"]
    rate = mix.global_rate
    checks: list[tuple[str, float | None, str, bool | None]] = [
        ("max units in 1 s", figures["global_rate"]["max_units_in_1s"], f"<= {rate:,.0f} (global rate)",
         figures["global_rate"]["max_units_in_1s"] <= rate),
        ("college lateness p99", college_p99, f"<= {TARGET_COLLEGE_P99_MS:,} ms",
         None if college_p99 is None else college_p99 <= TARGET_COLLEGE_P99_MS),
        ("drain rate", drain, f">= {TARGET_DRAIN_SHARE:.0%} of {rate:,.0f} units/s",
         None if drain is None else drain >= TARGET_DRAIN_SHARE * rate),
        ("gold/free ratio", figures["weights"]["ratio"], f"3 +- {TARGET_WEIGHT_ERROR:.0%}",
         None if error is None else abs(error) <= TARGET_WEIGHT_ERROR),
    ]
    return [{"figure": name, "value": value, "target": target, "met": met} for name, value, target, met in checks]
