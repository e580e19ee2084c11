"""Periodic passes: the tenants' limits, read again every few seconds, and the recurring
schedules of each shard held, whose runs due soon are created as ordinary tasks.

The **limits thread** reads the limits every `limits_interval_s` and hands them to the
fire loop, which applies them to the release gate; a failed read keeps the limits read
before. The **schedule thread** runs, every `schedule_interval_ms` for each shard held,
one pass of `scheduler.recurring.runner` over the shard's schedules: it creates the runs
due within its lookahead (90 s) through the producer, so runs due soon reach their own
shard's owner by the hand-off, and advances each schedule with a write fenced by the
lease's token; a slot that can get no run (past the store's retention, or refused) is
skipped, logged and counted (`schedule_slots_skipped`), never retried for ever. It
never touches the wheels; a pass stops as soon as the lease is no longer valid, and a
fenced answer drops the shard like a refused cursor.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from functools import partial

from scheduler.dispatcher.config import LIMITS_ATTEMPTS, SCHEDULE_STOP_WAIT_S
from scheduler.dispatcher.context import DispatcherContext
from scheduler.errors import SchedulerError, StoreUnavailable
from scheduler.fairness.gate import ReleaseGate
from scheduler.fairness.limits import Limits
from scheduler.ports import Lease, LimitsStore
from scheduler.recurring.runner import PassResult, ScheduleRunner

log = logging.getLogger(__name__)


class LimitsPass:
    """Keeps the release gate's limits as the store has them."""

    def __init__(self, ctx: DispatcherContext, gate: ReleaseGate, store: LimitsStore) -> None:
        self.ctx = ctx
        self.gate = gate
        self.store = store
        self.read_once = False

    def load(self, attempts: int = LIMITS_ATTEMPTS) -> None:
        """Read the tenants' limits before anything else (before joining the coordinator:
        a member that joined and then waited would be counted in the split while firing
        nothing). `StoreUnavailable` if they cannot be read after `attempts` tries."""
        error: SchedulerError | None = None
        for attempt in range(attempts):
            try:
                limits = self.store.read()
            except SchedulerError as exc:
                log.warning("reading the tenants' limits failed (%d of %d): %s", attempt + 1, attempts, exc)
                error = exc
                if self.ctx.stopping.wait(1.0):
                    break
                continue
            self.gate.set_limits(limits)  # the fire loop is not running yet
            self.read_once = True
            self.ctx.stats.limits_reads += 1
            return
        raise StoreUnavailable(f"the tenants' limits could not be read: {error}")

    def start(self) -> None:
        """Read the limits first if not yet read, then again every `limits_interval_s` on a thread."""
        if not self.read_once:
            self.load()
        threading.Thread(target=self._loop, name="dispatcher-limits", daemon=True).start()

    def _loop(self) -> None:
        while not self.ctx.stopping.wait(self.ctx.config.limits_interval_s):
            self._read()

    def _read(self) -> None:
        ctx = self.ctx
        try:
            limits = self.store.read()
        except SchedulerError as exc:  # keep enforcing the limits read before
            ctx.stats.limits_failures += 1
            log.warning("reading the tenants' limits failed: %s; keeping the ones read before", exc,
                        extra={"action": "limits_read_failed"})
            return
        except Exception:
            ctx.stats.job_errors += 1
            log.exception("reading the tenants' limits failed unexpectedly", extra={"action": "limits_read_failed"})
            return
        ctx.stats.limits_reads += 1
        ctx.post(partial(self.loaded, limits))

    def loaded(self, limits: Limits) -> None:
        """On the fire loop: apply limits just read."""
        if limits != self.gate.limits:
            log.info("tenant limits now: %d tenant(s) with their own, global rate %s", len(limits.tenants),
                     limits.global_rate, extra={"action": "limits_changed"})
        self.gate.set_limits(limits)


class SchedulePass:
    """Runs each held shard's recurring schedules, one pass at a time on its own thread."""

    def __init__(self, ctx: DispatcherContext, runner: ScheduleRunner) -> None:
        self.ctx = ctx
        self.runner = runner
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="dispatcher-schedule")
        self._scheduling: set[int] = set()
        self._last_ms: dict[int, int] = {}
        self._running = 0
        self._changed = threading.Condition()

    def run_due(self, now: int) -> None:
        """On the fire loop: start the pass of each shard whose interval has passed."""
        ctx = self.ctx
        interval = ctx.config.schedule_interval_ms
        for shard, owned in ctx.shards.items():
            if shard in self._scheduling or now - self._last_ms.get(shard, 0) < interval:
                continue
            self._scheduling.add(shard)
            self._last_ms[shard] = now
            ctx.submit(self.pool, self._pass, shard, owned.lease,
                       on_error=partial(ctx.post, partial(self._passed, shard, owned.lease, None)))

    def _pass(self, shard: int, lease: Lease) -> None:
        """Off the fire loop: create the runs of the shard's schedules that are due soon."""
        ctx = self.ctx

        def still_owner() -> bool:
            return not ctx.stopping.is_set() and ctx.coordinator.is_valid(lease)

        result: PassResult | None = None
        with self._changed:
            self._running += 1
        try:
            if still_owner():
                result = self.runner.run_shard(shard, lease.token, still_owner)
        except SchedulerError as exc:
            ctx.stats.schedule_failures += 1
            log.warning("the schedule pass of shard %d failed: %s", shard, exc,
                        extra={"action": "schedule_pass_failed", "shard": shard})
        finally:
            with self._changed:
                self._running -= 1
                self._changed.notify_all()
        ctx.post(partial(self._passed, shard, lease, result))

    def _passed(self, shard: int, lease: Lease, result: PassResult | None) -> None:
        ctx = self.ctx
        self._scheduling.discard(shard)
        if result is None:
            return
        ctx.stats.schedule_passes += 1
        ctx.stats.schedule_runs_created += result.created
        ctx.stats.schedule_misfires += result.missed
        ctx.stats.schedule_skipped_retention += result.skipped
        ctx.stats.schedule_skipped_refused += result.refused
        ctx.stats.schedule_failures += result.failed
        if result.created:
            log.info("created %d run(s) of recurring schedules of shard %d", result.created, shard,
                     extra={"action": "schedule_runs_created", "shard": shard})
        if result.fenced_out and ctx.current(shard, lease.token) is not None:
            ctx.stats.fenced_out += 1
            ctx.drop(shard, "fenced out by the schedule store", lease)

    def stop(self) -> None:
        """Cancel passes not started, and wait (up to `SCHEDULE_STOP_WAIT_S`) for one under
        way: it sees the stop before its next schedule, and the runs it made are idempotent."""
        self.pool.shutdown(wait=False, cancel_futures=True)
        with self._changed:
            if not self._changed.wait_for(lambda: self._running == 0, SCHEDULE_STOP_WAIT_S):
                log.warning("a schedule pass still runs %.0f s after the stop; giving the shards back anyway",
                            SCHEDULE_STOP_WAIT_S)
