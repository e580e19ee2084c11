"""Which runs a creation pass makes: the pure rule behind misfire policies.

Given a schedule's `next_slot` (the first slot without a run), the time now, how far
ahead runs are created (`lookahead_ms`) and the grace window, a pass creates the runs
of every slot up to `now + lookahead`, in order, except slots that are *missed*: before
`now - grace`. A slot is missed only when nothing created its run in time (runs are
normally created a lookahead ahead of their slot), i.e. after an outage. Then:

- `all`: every missed slot gets its run (due in the past, so it fires at once), at
  most `limit` a pass; the next pass continues;
- `once`: one run, for the first missed slot (the stored `next_slot`, so every creator
  that read the same schedule picks the same slot, and so the same task), then the
  slots not yet past the grace;
- `skip`: no run for missed slots; the schedule continues with the first slot at or
  after `now - grace`.

Worked example: `0 * * * *` (hourly), next_slot 06:00, now 09:10, grace 5 min,
lookahead 90 s. Missed: 06:00, 07:00, 08:00, 09:00 (09:00 < 09:05). `all` creates
06:00..09:00 and moves next_slot to 10:00; `once` creates 06:00 only, next_slot 10:00;
`skip` creates nothing, next_slot 10:00. At now = 09:58:40, 10:00 is within the
lookahead and is created normally.
"""

from __future__ import annotations

from dataclasses import dataclass

from scheduler.recurring.cron import NEVER_MS, CronRule
from scheduler.recurring.schedule import MisfirePolicy

DEFAULT_LIMIT = 100
"""Most runs one pass creates for one schedule (a long outage of `all` takes several passes)."""


@dataclass(frozen=True, slots=True)
class RunPlan:
    slots: tuple[int, ...]
    """Slots whose runs to create, in order."""
    next_slot_ms: int
    """The schedule's next slot once they are created."""
    missed: int = 0
    """Missed slots left without a run (`once`, `skip`)."""

    @property
    def changes(self) -> bool:
        return bool(self.slots) or self.missed > 0


def plan_runs(
    rule: CronRule,
    next_slot_ms: int,
    now_ms: int,
    *,
    lookahead_ms: int,
    grace_ms: int,
    policy: MisfirePolicy,
    limit: int = DEFAULT_LIMIT,
) -> RunPlan:
    """The runs to create now, and where the schedule continues (see the module docstring)."""
    horizon = now_ms + lookahead_ms
    late = now_ms - grace_ms
    slots: list[int] = []
    missed = 0
    slot = next_slot_ms
    if slot < late and slot < NEVER_MS and policy is not MisfirePolicy.ALL:
        if policy is MisfirePolicy.ONCE:
            slots.append(slot)
        # Jump to the first slot not yet past the grace; count what is left behind.
        first_on_time = rule.next_slot(late - 1)
        missed = _count_between(rule, slot, first_on_time) - len(slots)
        slot = first_on_time
    while slot <= horizon and slot < NEVER_MS and len(slots) < limit:
        slots.append(slot)
        slot = rule.next_slot(slot)
    return RunPlan(tuple(slots), slot, missed)


def _count_between(rule: CronRule, first: int, end: int, cap: int = 1000) -> int:
    """Slots in `[first, end)`, counted up to `cap` (for logs: an outage of a minutely
    schedule may span many)."""
    count = 1
    for slot in rule.slots_after(first):
        if slot >= end or count >= cap:
            break
        count += 1
    return count
