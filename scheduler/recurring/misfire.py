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

Past the retention
------------------
The store keeps a keyed task for its retention only (`retention.oldest_keyed_run_ms`):
a run due before `oldest_ms` cannot be created, since a run of that slot made before
may have run and expired, and the producer refuses it. Such a slot is *skipped*: it
gets no run, the plan counts it (`skipped`, first and last) and the schedule moves past
it, so an outage longer than the retention never stops a schedule:

- `all`: every missed slot before `oldest_ms` is skipped; the runs of the missed slots
  from `oldest_ms` on are created as above;
- `once`: when the first missed slot is past the retention it is skipped (one slot) and
  the catch-up run is for the newest missed slot instead; when that one is past the
  retention too (a weekly schedule down for longer than a 7-day retention), the
  catch-up is still for the newest missed slot but due at the start of the current
  minute (`catch_up_at_ms`): one run on recovery, whatever the retention;
- `skip`: unchanged (missed slots get no run anyway; they count as missed).

A slot not yet missed but before `oldest_ms` (a grace longer than the retention) is
skipped under every policy. Worked example: hourly, next_slot Dec 1 06:00, now Dec 9
09:10, retention 7 days (`oldest_ms` Dec 2 09:10): `all` skips Dec 1 06:00 .. Dec 2
09:00 (28 slots) and creates Dec 2 10:00 on, 100 a pass; `once` skips Dec 1 06:00 and
creates Dec 9 09:00; `skip` creates nothing; next_slot Dec 9 10:00 for all three once
caught up.
"""

from __future__ import annotations

from dataclasses import dataclass

from scheduler.model import BUCKET_MS
from scheduler.recurring.cron import NEVER_MS, CronRule
from scheduler.recurring.schedule import MisfirePolicy

DEFAULT_LIMIT = 100
"""Most runs one pass creates for one schedule (a long outage of `all` takes several passes)."""
COUNT_CAP = 10_000
"""Most slots one pass counts as missed or skipped (for logs and `scheduler schedule list`):
an outage of a minutely schedule may span many more."""


@dataclass(frozen=True, slots=True)
class RunPlan:
    slots: tuple[int, ...]
    """Slots whose runs to create, in order."""
    next_slot_ms: int
    """The schedule's next slot once they are created."""
    missed: int = 0
    """Missed slots left without a run by the policy (`once`, `skip`)."""
    skipped: int = 0
    """Slots the policy would run that are past the retention, left without a run."""
    first_skipped_ms: int | None = None
    last_skipped_ms: int | None = None
    catch_up_at_ms: int | None = None
    """When set, the run of `slots[0]` (a `once` catch-up) is due then, not at its slot."""

    @property
    def changes(self) -> bool:
        return bool(self.slots) or self.missed > 0 or self.skipped > 0


@dataclass
class _Skips:
    count: int = 0
    first: int | None = None
    last: int | None = None

    def add(self, first: int, last: int, count: int) -> None:
        if count <= 0:
            return
        self.first = first if self.first is None else self.first
        self.last = last
        self.count += count


def plan_runs(
    rule: CronRule,
    next_slot_ms: int,
    now_ms: int,
    *,
    lookahead_ms: int,
    grace_ms: int,
    policy: MisfirePolicy,
    limit: int = DEFAULT_LIMIT,
    oldest_ms: int | None = None,
) -> RunPlan:
    """The runs to create now, and where the schedule continues (see the module
    docstring). `oldest_ms`: the earliest slot a run may still be created for (None: no
    limit)."""
    horizon = now_ms + lookahead_ms
    late = now_ms - grace_ms
    oldest = -NEVER_MS if oldest_ms is None else oldest_ms
    slots: list[int] = []
    missed = 0
    skips = _Skips()
    catch_up_at: int | None = None
    slot = next_slot_ms
    if slot < late and slot < NEVER_MS and policy is not MisfirePolicy.ALL:
        # Jump to the first slot not yet past the grace; count what is left behind.
        first_on_time = rule.next_slot(late - 1)
        total = _count_between(rule, slot, first_on_time)
        if policy is MisfirePolicy.ONCE:
            catch_up = slot
            if slot < oldest:
                catch_up = newest_before(rule, slot, first_on_time)
                if catch_up != slot:
                    skips.add(slot, slot, 1)
                if catch_up < oldest:
                    catch_up_at = now_ms - now_ms % BUCKET_MS
            slots.append(catch_up)
        missed = total - len(slots) - skips.count
        slot = first_on_time
    if slot < oldest and slot < NEVER_MS and (policy is MisfirePolicy.ALL or slot <= horizon):
        # Past the retention: no run can be made; skip to the first slot that can have one.
        first_kept = rule.next_slot(oldest - 1)
        if policy is not MisfirePolicy.ALL:  # only slots the policy would run: those within the grace
            first_kept = min(first_kept, rule.next_slot(horizon))
        skips.add(slot, newest_before(rule, slot, first_kept), _count_between(rule, slot, first_kept))
        slot = first_kept
    while slot <= horizon and slot < NEVER_MS and len(slots) < limit:
        slots.append(slot)
        slot = rule.next_slot(slot)
    return RunPlan(tuple(slots), slot, missed, skips.count, skips.first, skips.last, catch_up_at)


def newest_before(rule: CronRule, first: int, end: int) -> int:
    """The last slot in `[first, end)`, `first` being a slot before `end`: a binary
    search over the time, as an outage of a minutely schedule may span many slots."""
    if rule.next_slot(first) >= end:
        return first
    low, high = first, end - 1  # next_slot(low) < end <= next_slot(high)
    while high - low > 1:
        middle = (low + high) // 2
        if rule.next_slot(middle) < end:
            low = middle
        else:
            high = middle
    return rule.next_slot(low)


def _count_between(rule: CronRule, first: int, end: int, cap: int = COUNT_CAP) -> int:
    """Slots in `[first, end)`, `first` being a slot, counted up to `cap` (an outage of a
    minutely schedule may span many)."""
    count = 1
    for slot in rule.slots_after(first):
        if slot >= end or count >= cap:
            break
        count += 1
    return count
