"""Ownership: which shards this dispatcher fires, and the life of each.

    ACQUIRED (lease taken) -> STARTING (take_shard in the store, read fired_through)
      -> FIRING (buckets loaded a minute ahead; due slots fired every tick;
                 cursor advanced about once a second)
      -> GIVING BACK (stop firing, last advance, commit hand-off position, release lease)
       | DROPPED (lease lost, or the store refused a fenced write: a newer owner exists)

The balancer thread decides which shards to take or give back (`balance.plan`) and
takes leases; a writer records the token in the store and reads the cursor; the fire
loop then adds the shard to `DispatcherContext.shards`. Giving back and dropping happen
on the fire loop; the final cursor write and the lease's release go to a writer.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable
from functools import partial

from scheduler.dispatcher.balance import plan
from scheduler.dispatcher.context import DispatcherContext
from scheduler.dispatcher.handoffs import HandoffIntake
from scheduler.dispatcher.progress import Progress
from scheduler.dispatcher.shard import OwnedShard
from scheduler.errors import QueueError, SchedulerError
from scheduler.fairness.gate import ReleaseGate
from scheduler.ports import HandoffReader, Lease, SessionState

log = logging.getLogger(__name__)


class Ownership:
    """Takes, starts, gives back and drops shards; confirms leases after a stall."""

    def __init__(self, ctx: DispatcherContext, gate: ReleaseGate, reader: HandoffReader, intake: HandoffIntake,
                 progress: Progress) -> None:
        self.ctx = ctx
        self.gate = gate
        self.reader = reader
        self.intake = intake
        self.progress = progress
        self._mine: set[int] = set()
        """Shards with a lease this process holds (balancer's view, guarded by `_mine_lock`)."""
        self._mine_lock = threading.Lock()

    # The balancer thread.

    def balance_loop(self) -> None:
        ctx = self.ctx
        while not ctx.stopping.is_set():
            ctx.wake_balancer.wait(ctx.config.balance_interval_s)
            ctx.wake_balancer.clear()
            if ctx.stopping.is_set() or ctx.session is not SessionState.CONNECTED:
                continue
            try:
                self.balance_once()
            except SchedulerError as exc:
                log.warning("balancing failed: %s", exc, extra={"action": "balance_failed"})
            except Exception:  # the balancer must outlive any surprise
                ctx.stats.job_errors += 1
                log.exception("balancing failed unexpectedly", extra={"action": "balance_failed"})

    def balance_once(self) -> None:
        ctx = self.ctx
        members = ctx.coordinator.members()
        holders = ctx.coordinator.lease_holders()
        with self._mine_lock:
            mine = set(self._mine)
        decided = plan(ctx.config.member, members, holders, mine, ctx.shard_count, ctx.config.shards)
        for shard in decided.give_back:
            ctx.post(partial(self.give_back, shard))
        for shard in decided.take:
            if ctx.stopping.is_set():
                return
            lease = ctx.coordinator.acquire(shard)
            if lease is None:
                continue
            with self._mine_lock:
                self._mine.add(shard)
            log.info("took the lease of shard %d (token %d)", shard, lease.token,
                     extra={"action": "lease_taken", "shard": shard, "token": lease.token})
            ctx.submit(ctx.writers, self._start_shard, lease, on_error=partial(self._give_up_lease, lease))

    def _give_up_lease(self, lease: Lease) -> None:
        self._release(lease)
        self._forget_lease(lease.shard)

    def _release(self, lease: Lease) -> None:
        try:
            self.ctx.coordinator.release(lease)
        except SchedulerError as exc:  # the lease expires with the session anyway
            log.warning("releasing the lease of shard %d failed: %s", lease.shard, exc)

    def _forget_lease(self, shard: int) -> None:
        with self._mine_lock:
            self._mine.discard(shard)
        self.ctx.wake_balancer.set()

    # Starting a shard: on a writer, then on the fire loop.

    def _start_shard(self, lease: Lease) -> None:
        """Record the token in the store, read the cursor, then hand the shard to the fire loop."""
        ctx = self.ctx
        try:
            taken = ctx.store.take_shard(lease.shard, ctx.config.member, lease.token)
            state = ctx.store.read_shard(lease.shard) if taken else None
        except SchedulerError as exc:
            ctx.stats.store_failures += 1
            log.warning("taking shard %d in the store failed: %s; retrying", lease.shard, exc,
                        extra={"action": "take_failed", "shard": lease.shard})
            self._retry_later(lambda: self._start_shard(lease), lease)
            return
        if not taken or state is None or state.lease_token != lease.token:
            ctx.stats.fenced_out += 1
            log.error("the store refused shard %d for token %d: a newer token is recorded", lease.shard,
                      lease.token, extra={"action": "fenced_out", "shard": lease.shard})
            self._give_up_lease(lease)
            return
        start = state.fired_through_ms
        never_fired = start is None
        if start is None:  # never fired: from the store's creation, when it says
            created = ctx.store.created_ms
            start = created - 1 if created is not None else ctx.clock() - ctx.config.first_lookback_ms
        baselines = None if state.baselines is None else dict(state.baselines)
        ctx.post(partial(self.shard_started, lease, start, baselines, never_fired))

    def _retry_later(self, action: Callable[[], None], lease: Lease, delay_s: float = 1.0) -> None:
        ctx = self.ctx

        def again() -> None:
            if not ctx.stopping.is_set() and ctx.coordinator.is_valid(lease):
                ctx.submit(ctx.writers, action, on_error=partial(self._give_up_lease, lease))
            else:
                self._give_up_lease(lease)

        timer = threading.Timer(delay_s * (0.5 + random.random()), again)
        timer.daemon = True
        timer.start()

    def shard_started(self, lease: Lease, start_ms: int, baselines: dict[int, int] | None = None,
                      never_fired: bool = False) -> None:
        ctx = self.ctx
        if ctx.stopping.is_set() or not ctx.coordinator.is_valid(lease):
            self.drop(lease.shard, "lease lost while starting", lease)
            return
        config = ctx.config
        owned = OwnedShard(
            shard=lease.shard, lease=lease, start_ms=start_ms, shard_count=ctx.shard_count,
            long_types=config.long_types, type_labels=ctx.type_labels, tick_ms=config.tick_ms,
            verify_grace_ms=config.verify_grace_ms,
            second_look_ms=config.second_look_ms, sweep_interval_ms=config.sweep_interval_ms,
            horizon_ms=config.sweep_horizon_ms, inherited=baselines, never_fired=never_fired,
        )
        try:
            self.reader.assign(lease.shard)
        except QueueError as exc:
            log.warning("reading the hand-off of shard %d failed: %s; giving it back", lease.shard, exc,
                        extra={"action": "assign_failed", "shard": lease.shard})
            ctx.submit(ctx.writers, self._finish_give_back, owned, on_error=partial(self._give_up_lease, lease))
            return
        ctx.shards[lease.shard] = owned
        self.gate.take_shard(lease.shard, ctx.clock())
        ctx.stats.taken += 1
        log.info("firing shard %d from %d (token %d)", lease.shard, start_ms, lease.token,
                 extra={"action": "shard_started", "shard": lease.shard, "token": lease.token})

    # Giving back and dropping: on the fire loop.

    def give_back(self, shard: int) -> None:
        ctx = self.ctx
        owned = ctx.shards.pop(shard, None)
        if owned is None:
            return
        through = self.progress.cursor(owned)
        baselines = owned.baselines(ctx.clock(), through)
        self.gate.drop_shard(shard)
        self.progress.commit_shard(shard)
        self._stop_reading(shard)
        log.info("stopped firing shard %d to give it back", shard,
                 extra={"action": "shard_stopped", "shard": shard})
        ctx.submit(ctx.writers, self._finish_give_back, owned, through, baselines,
                   on_error=partial(self._give_up_lease, owned.lease))

    def _stop_reading(self, shard: int) -> None:
        try:
            self.reader.unassign(shard)
        except QueueError as exc:
            log.warning("could not stop reading the hand-off of shard %d: %s", shard, exc)
        self.intake.forget(shard)
        self.progress.forget(shard)

    def _finish_give_back(self, owned: OwnedShard, through: int | None = None,
                          baselines: dict[int, int] | None = None) -> None:
        """Off the fire loop: write the final cursor `through` (with its baselines), then
        release the lease."""
        ctx = self.ctx
        try:
            if through is not None and through > owned.persisted_ms and ctx.coordinator.is_valid(owned.lease):
                ctx.store.advance_shard(owned.shard, owned.token, through, baselines)
        except SchedulerError as exc:
            log.warning("final cursor of shard %d not written: %s", owned.shard, exc)
        self._give_up_lease(owned.lease)
        ctx.stats.given_back += 1
        log.info("gave shard %d back (cursor %d)", owned.shard, through,
                 extra={"action": "shard_given_back", "shard": owned.shard})

    def drop(self, shard: int, why: str, lease: Lease) -> None:
        """Stop firing a shard at once, without touching the store: it is not ours."""
        ctx = self.ctx
        owned = ctx.shards.get(shard)
        if owned is not None and owned.token == lease.token:
            del ctx.shards[shard]
            self.gate.drop_shard(shard)
            self._stop_reading(shard)
            ctx.stats.leases_lost += 1
            log.warning("stopped firing shard %d: %s", shard, why, extra={"action": "shard_dropped", "shard": shard})
        self._give_up_lease(lease)

    def confirm_leases(self, gap_s: float) -> None:
        """After a stall of the fire loop: confirm each lease with the coordinator before
        anything more is fired, and drop the shards whose lease is not confirmed."""
        log.warning("the fire loop stalled for %.1f s; confirming leases before firing", gap_s,
                    extra={"action": "stall"})
        for shard, owned in list(self.ctx.shards.items()):
            try:
                confirmed = self.ctx.coordinator.confirm(owned.lease)
            except SchedulerError:
                confirmed = False
            if not confirmed:
                self.drop(shard, "its lease was not confirmed after a stall", owned.lease)
