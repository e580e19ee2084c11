"""One creation pass over the schedules of a shard, for the shard's lease holder.

For each schedule of the shard that is not paused, the pass asks `misfire.plan_runs`
which runs to create, then:

1. submits them through the producer (`Client.submit_many`): each run is a task of the
   schedule's tenant with the idempotency key `schedule:<id>:<slot_ms>` and
   `run_at = slot + jitter`, so its task id is fixed by the schedule and the slot, and
   a run due within the hand-off window also reaches the dispatcher that owns the
   *run's* shard (usually another shard than the schedule's);
2. only once every run is acknowledged, moves the schedule's next slot past them with a
   conditional write (`ScheduleStore.advance`, conditional on the next slot it read and
   fenced by the lease's token).

How it fails, and why nothing is created twice
----------------------------------------------
- A crash (or a failed write) between 1 and 2 leaves the next slot where it was; the
  next pass, here or on the shard's next owner, creates the same runs again, which
  writes the same rows (an insert of an existing id keeps its status).
- Two creators racing on one schedule (an old owner that has not noticed it lost the
  lease, and the new one) both write the same rows; one advance applies, the other
  answers `CHANGED` and that creator stops for this pass. A run written by both is
  handed to the dispatcher twice; a run created ahead of its slot waits in the wheel,
  which drops the second copy when the slot fires. Only a run created already due (a
  catch-up after an outage) can be published twice, like any re-publish after a crash:
  delivery is at least once, and `ctx.once` guards effects.
- The losing creator may have written a run the winner did not (its clock was later, so
  its lookahead reached one slot further): that slot's run has the same id whoever
  creates it, so the next pass writes the same row. For `skip`, a creator whose clock is
  earlier may still count a slot at the edge of the grace window as on time and create it.
- `FENCED` (a newer token has advanced a schedule of the shard) ends the pass: the
  shard is someone else's. `still_owner` is also asked before each schedule.
- A submit that fails (store or hand-off) leaves the schedule unadvanced; the next
  pass tries again. Failures are logged per schedule and never stop the others.

Slots that are skipped, and why a schedule never stops
------------------------------------------------------
A failure that the next pass would meet again would stop the schedule for ever, so no
slot may cause one. Two kinds of slot get no run and are passed over instead, each
counted in the same advance (`Schedule.skipped`, `last_skipped_ms`, shown by `scheduler
schedule list`), logged as a warning naming the schedule and the slots, and counted in
`PassResult.skipped` / `refused` (the dispatcher's `schedule_slots_skipped` metric):

- slots past the store's retention (`misfire.plan_runs` with `oldest_ms`): after an
  outage longer than the retention, a keyed run due then cannot be stored (the
  producer refuses it: a run of that slot made before may have run and expired). The
  edge is taken `RETENTION_MARGIN_MS` early, so a slot the plan keeps is still
  storable when the producer checks it a moment later;
- slots whose run the producer refuses (`InvalidTask`, e.g. a template that today's
  checks reject): the same item is refused on every pass, so the slot is passed over.

A write the store does not acknowledge is not a refusal: it is tried again next pass.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from scheduler import retention
from scheduler.errors import SchedulerError
from scheduler.model import TaskId, from_ms
from scheduler.ports import AdvanceOutcome, ScheduleStore
from scheduler.producer import Client, Submission
from scheduler.recurring.jitter import jitter_ms
from scheduler.recurring.misfire import DEFAULT_LIMIT, RunPlan, plan_runs
from scheduler.recurring.schedule import MisfirePolicy, Schedule, run_key

log = logging.getLogger(__name__)

DEFAULT_LOOKAHEAD_MS = 90_000
"""Runs are created this far ahead of their slot: more than the dispatcher's one-minute
read-ahead, so a run is usually in the store before its minute is loaded."""
RETENTION_MARGIN_MS = 10_000
"""A slot within this of the retention's edge is skipped as past it: the producer checks
each run a moment after the plan, and a slow store write may stretch that moment."""


@dataclass
class PassResult:
    created: int = 0
    advanced: int = 0
    changed: int = 0
    missed: int = 0
    skipped: int = 0
    """Slots passed over because they were past the store's retention."""
    refused: int = 0
    """Slots passed over because the producer refused their run."""
    failed: int = 0
    fenced_out: bool = False
    created_slots: list[tuple[str, int]] = field(default_factory=list)
    """(schedule name, slot) of every run submitted, for logs and tests."""


def run_id(schedule: Schedule, slot_ms: int) -> TaskId:
    """The task id of the run of `slot_ms`, as `ScheduleRunner` creates it."""
    run_at_ms = slot_ms + jitter_ms(schedule.id, slot_ms, schedule.jitter_s)
    return TaskId.for_key(run_at_ms, schedule.tenant, run_key(schedule.id, slot_ms))


def runs_ahead(schedule: Schedule, now_ms: int, limit: int = DEFAULT_LIMIT * 10) -> list[TaskId]:
    """The ids of the runs that may already be created and not yet due: slots before the
    stored next slot whose run is due after `now_ms` (at most `limit`). Deleting a
    schedule cancels them, so a schedule added again under the name (whose runs may have
    other ids, e.g. another jitter) does not run a slot twice."""
    ids: list[TaskId] = []
    for slot in schedule.rule.slots_after(now_ms - schedule.jitter_s * 1000 - 1):
        if slot >= schedule.next_slot_ms or len(ids) >= limit:
            break
        task_id = run_id(schedule, slot)
        if task_id.run_at_ms > now_ms:
            ids.append(task_id)
    return ids


class ScheduleRunner:
    """Creates the runs of the schedules of shards this process holds. `clock` returns
    the time in ms (injectable for tests)."""

    def __init__(
        self,
        schedules: ScheduleStore,
        client: Client,
        *,
        clock: Callable[[], int],
        lookahead_ms: int = DEFAULT_LOOKAHEAD_MS,
        limit: int = DEFAULT_LIMIT,
    ) -> None:
        self.schedules = schedules
        self.client = client
        self.clock = clock
        self.lookahead_ms = lookahead_ms
        self.limit = limit

    def run_shard(self, shard: int, token: int, still_owner: Callable[[], bool] = lambda: True) -> PassResult:
        """One pass over the shard's schedules under the lease `token`."""
        result = PassResult()
        for schedule in self.schedules.list_shard(shard):
            if schedule.paused:
                continue
            if not still_owner():
                break
            try:
                self._run_schedule(schedule, token, result)
            except SchedulerError as exc:
                result.failed += 1
                log.warning("creating the runs of schedule %s/%s failed: %s; trying again next pass",
                            schedule.tenant, schedule.name, exc, extra={"action": "schedule_failed"})
            except Exception:  # one schedule's fault (a bad row, a payload) must not stop the shard's others
                result.failed += 1
                log.exception("creating the runs of schedule %s/%s failed unexpectedly; trying again next pass",
                              schedule.tenant, schedule.name, extra={"action": "schedule_failed"})
            if result.fenced_out:
                log.error("the store refused shard %d's schedules for token %d: a newer owner exists", shard,
                          token, extra={"action": "schedule_fenced_out", "shard": shard})
                break
        return result

    def _run_schedule(self, schedule: Schedule, token: int, result: PassResult) -> None:
        """At most one batch (`limit` runs) per schedule and pass: a long outage under
        `all` is caught up over several passes, so one schedule never holds the thread
        (and every other shard's schedules) for minutes, and ownership is asked again
        between batches."""
        now = self.clock()
        store = self.client.store
        oldest = None if store is None else retention.oldest_keyed_run_ms(store.retention_s, now + RETENTION_MARGIN_MS)
        plan = plan_runs(schedule.rule, schedule.next_slot_ms, now, lookahead_ms=self.lookahead_ms,
                         grace_ms=schedule.grace_s * 1000, policy=schedule.misfire, limit=self.limit,
                         oldest_ms=oldest)
        if not plan.changes:
            return
        refused = self._submit(schedule, plan)
        skipped = plan.skipped + len(refused)
        last_skipped = max([slot for slot, _ in refused] + ([plan.last_skipped_ms] if plan.last_skipped_ms else []),
                           default=None)
        outcome = self.schedules.advance(schedule, plan.next_slot_ms, token, skipped=skipped,
                                         last_skipped_ms=last_skipped)
        if outcome is AdvanceOutcome.FENCED:
            result.fenced_out = True
            return
        if outcome is AdvanceOutcome.CHANGED:
            result.changed += 1
            return
        refused_slots = {slot for slot, _ in refused}
        created = [slot for slot in plan.slots if slot not in refused_slots]
        result.advanced += 1
        result.created += len(created)
        result.missed += plan.missed
        result.skipped += plan.skipped
        result.refused += len(refused)
        result.created_slots += [(schedule.name, slot) for slot in created]
        self._log_skips(schedule, plan, refused, store.retention_s if store is not None else None)
        if plan.missed:
            log.warning("schedule %s/%s missed %d slot(s) (misfire policy %s)", schedule.tenant, schedule.name,
                        plan.missed, schedule.misfire.value, extra={"action": "schedule_misfire"})

    def _submit(self, schedule: Schedule, plan: RunPlan) -> list[tuple[int, str]]:
        """Store the plan's runs; the (slot, reason) of each the producer refused.
        `SchedulerError` if a write was not acknowledged (then the next pass tries again)."""
        if not plan.slots:
            return []
        template = schedule.template
        payload = template.decoded_payload()
        items = [
            Submission(
                type=template.type, payload=payload, tenant=schedule.tenant,
                run_at=from_ms(plan.catch_up_at_ms if plan.catch_up_at_ms is not None and index == 0
                               else run_id(schedule, slot).run_at_ms),
                priority=template.priority, idempotency_key=run_key(schedule.id, slot),
                max_attempts=template.max_attempts,
            )
            for index, slot in enumerate(plan.slots)
        ]
        report = self.client.submit_many(items, on_invalid="skip", keep_ids=False)
        if report.failed or report.stopped_early or report.consumed < len(items):
            reason = report.failed[0].reason if report.failed else "not every run was read"
            raise SchedulerError(f"{len(report.failed)} of {len(items)} runs not stored: {reason}")
        return [(plan.slots[error.index], error.reason) for error in report.rejected]

    @staticmethod
    def _log_skips(schedule: Schedule, plan: RunPlan, refused: list[tuple[int, str]], retention_s: int | None) -> None:
        name = f"{schedule.tenant}/{schedule.name}"
        if plan.skipped and plan.first_skipped_ms is not None and plan.last_skipped_ms is not None:
            kept = retention.describe(retention_s) if retention_s is not None else "?"
            span = (_iso(plan.first_skipped_ms) if plan.skipped == 1
                    else f"{plan.skipped} slots from {_iso(plan.first_skipped_ms)} to {_iso(plan.last_skipped_ms)}")
            instead = ""
            if schedule.misfire is MisfirePolicy.ONCE and plan.slots:
                due = plan.catch_up_at_ms if plan.catch_up_at_ms is not None else plan.slots[0]
                instead = f"; its catch-up run is for slot {_iso(plan.slots[0])}, due {_iso(due)}"
            log.warning("schedule %s skipped %s: past the store's retention (%s), no run can be stored for it%s "
                        "(misfire policy %s; next slot %s)", name, span, kept, instead, schedule.misfire.value,
                        _iso(plan.next_slot_ms), extra={"action": "schedule_slots_skipped", "skipped": plan.skipped})
        for slot, reason in refused:
            log.warning("schedule %s skipped slot %s: its run was refused (%s)", name, _iso(slot), reason,
                        extra={"action": "schedule_slot_refused"})


def _iso(ms: int) -> str:
    return from_ms(ms).isoformat().replace("+00:00", "Z")
