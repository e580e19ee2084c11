"""The dispatcher process: holds shard leases, loads due tasks into wheels, fires them.

`Dispatcher` assembles the parts, each owning one job:

- `ownership.Ownership`: which shards are held: the balancer, leases, starting a shard,
  giving it back, dropping it; confirming leases after a stall.
- `reading.Reading`: what the store holds: bucket loads a minute ahead, the counts and
  re-reads before and after a slice fires, sweeps behind the cursor.
- `handoffs.HandoffIntake`: the hand-off log's tasks, cancels and completions.
- `firing.Firing`: the due tasks, through the release gate, published and flushed.
- `progress.Progress`: cursors written to the store, hand-off positions committed.
- `passes.LimitsPass`, `passes.SchedulePass`: the tenants' limits and the recurring
  schedules, every few seconds.
- `visible.DispatcherVisibility`: counts of what it publishes, how late, its heartbeat
  and the fold of past hours of counts (`scheduler status`).
- `purge.PurgePass`: on the embedded backend, the rows past their retention deleted
  from its files, a bounded number at a time, while it holds shard 0.

Threads, and who owns what
--------------------------
- The **fire loop** (the thread that calls `run`) owns every `OwnedShard`
  (`DispatcherContext.shards`) and the release gate. Each tick (`tick_ms`) it applies
  what other threads sent it, reads the hand-off log, fires what is due, flushes the
  queue, commits hand-off positions and starts reads and cursor advances. Between ticks
  it sleeps until the first entry a shard holds falls due (a tick takes the slot that
  begins from the wheel, whose entries are not all due yet), or the gate can let a task
  out, but wakes no sooner than `fire_gap_ms` after its last pass; such a pass only
  fires, publishes and flushes, so a task goes out within about `fire_gap_ms` of its
  time, not a tick, and the rest of a tick's work keeps its pace. Nothing else touches
  a shard's state, so there are no locks around it.
- The **balancer** decides which shards to take or give back (`balance.plan`), takes
  leases, and tells the fire loop.
- **Readers** and **lookers** (pools) load buckets, count and re-read slices, sweep;
  **writers** (a pool) take shards in the store and advance cursors (each a
  lightweight transaction, ~50 ms). Their results come back to the fire loop through
  its inbox (`DispatcherContext.post`), tagged with the lease token they were started
  under, so a result for a lease since lost is dropped.
- The **limits thread** and the **schedule thread** run the periodic passes; the
  schedule thread never touches the wheels. The **count writer** writes the counts
  and the heartbeat every two seconds; it only looks at the shards. The **purge
  thread** (embedded backend) likewise only looks whether shard 0 is held.

A shard's life is in `ownership`'s docstring. Fencing: a shard fires only while
`Coordinator.is_valid(lease)` holds (checked before every batch, no I/O); when the
session is suspended every shard stops at once. After a stall longer than a third of
the lease timeout (the process was paused, or starved), each lease is confirmed with
the coordinator before anything more is fired. Every message carries the lease's token
and every cursor write is conditional on it.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from scheduler.dispatcher.config import LIMITS_ATTEMPTS, Clock, DispatcherConfig, Gauges, Stats, wall_clock_ms
from scheduler.dispatcher.context import DispatcherContext
from scheduler.dispatcher.firing import Firing
from scheduler.dispatcher.handoffs import HandoffIntake
from scheduler.dispatcher.ownership import Ownership
from scheduler.dispatcher.passes import LimitsPass, SchedulePass
from scheduler.dispatcher.progress import Progress
from scheduler.dispatcher.purge import PurgePass, Purger
from scheduler.dispatcher.reading import Reading
from scheduler.dispatcher.shard import OwnedShard
from scheduler.dispatcher.visible import DispatcherVisibility
from scheduler.fairness.gate import ReleaseGate
from scheduler.ports import Coordinator, CountStore, HandoffReader, LimitsStore, Publisher, SessionState, TaskStore
from scheduler.recurring.runner import ScheduleRunner

__all__ = ["Dispatcher", "DispatcherConfig", "Stats", "wall_clock_ms", "write_json"]

log = logging.getLogger(__name__)


class Dispatcher:
    """Fires the due tasks of the shards it holds. `run()` blocks until `stop()`."""

    def __init__(
        self,
        config: DispatcherConfig,
        *,
        store: TaskStore,
        coordinator: Coordinator,
        publisher: Publisher,
        handoff_reader: HandoffReader,
        topics: dict[int, str],
        clock: Clock = wall_clock_ms,
        schedule_runner: ScheduleRunner | None = None,
        limits_store: LimitsStore | None = None,
        counts: CountStore | None = None,
        purgers: Mapping[str, Purger] | None = None,
    ) -> None:
        self.config = config
        self.ctx = ctx = DispatcherContext(config, store, coordinator, clock)
        self.gate = ReleaseGate(ctx.shard_count, hold_timeout_ms=int(config.hold_timeout_s * 1000))
        self.intake = HandoffIntake(ctx, handoff_reader, self.gate)
        self.progress = Progress(ctx, self.intake, self.gate, handoff_reader)
        self.ownership = Ownership(ctx, self.gate, handoff_reader, self.intake, self.progress)
        ctx.drop = self.ownership.drop
        self.reading = Reading(ctx)
        self.firing = Firing(ctx, self.gate, publisher, topics)
        self.limits = None if limits_store is None else LimitsPass(ctx, self.gate, limits_store)
        self.schedules = None if schedule_runner is None else SchedulePass(ctx, schedule_runner)
        self.visible = None if counts is None else DispatcherVisibility(ctx, self.gate, counts)
        self.purge = PurgePass(ctx, purgers) if purgers else None
        """What deletes expired rows (the embedded backend's; Cassandra and Kafka expire their own)."""
        if self.visible is not None:
            self.firing.on_published = self.visible.published
            if schedule_runner is not None:
                schedule_runner.client.events = self.visible.events  # the runs it creates are submitted
        self._last_stats_ms = 0
        self._last_gauges_ms = 0
        self._next_tick_ms = 0
        self._last_pass_ms = 0
        self._wheel_bytes_at = (0, 0, -1)

    @property
    def stats(self) -> Stats:
        return self.ctx.stats

    @property
    def shards(self) -> dict[int, OwnedShard]:
        """The shards being fired (the fire loop's: read them from another thread only for a look)."""
        return self.ctx.shards

    @property
    def failed(self) -> str | None:
        """Why `run` gave up, if it did (the CLI exits non-zero)."""
        return self.firing.failed

    # Lifecycle.

    def load_limits(self, attempts: int = LIMITS_ATTEMPTS) -> None:
        """Read the tenants' limits now, before joining (see `LimitsPass.load`)."""
        assert self.limits is not None
        self.limits.load(attempts)

    def start_session(self) -> None:
        """Join the coordinator (raises `CoordinatorUnavailable` if it cannot be reached)."""
        self.ctx.coordinator.start(self.config.member, self._on_session)
        self.ctx.coordinator.watch(self.ctx.wake_balancer.set)

    def run(self) -> None:
        if self.limits is not None:
            self.limits.start()
        if self.visible is not None:
            self.visible.start()
        if self.purge is not None:
            self.purge.start()
        balancer = threading.Thread(target=self.ownership.balance_loop, name="dispatcher-balance", daemon=True)
        balancer.start()
        try:
            self._fire_loop()
        finally:
            self._shutdown()

    def stop(self) -> None:
        """Ask `run` to stop gracefully: give every shard back (so others take over at
        once), then return. Safe from a signal handler."""
        self.ctx.stop()

    def _on_session(self, state: SessionState) -> None:
        self.ctx.session = state
        log.warning("coordinator session %s", state.value, extra={"action": "session_" + state.value})
        self.ctx.wake_balancer.set()

    # The fire loop.

    def _fire_loop(self) -> None:
        ctx = self.ctx
        last_loop = time.monotonic()
        self.start_ticking(ctx.clock())
        while not ctx.stopping.is_set():
            wait_ms = self._wait_ms(ctx.clock())
            deadline = time.monotonic() + wait_ms / 1000
            while True:
                remaining = deadline - time.monotonic()
                try:
                    action = ctx.inbox.get(timeout=max(remaining, 0)) if remaining > 0 else ctx.inbox.get_nowait()
                except queue.Empty:
                    break
                action()
            gap = time.monotonic() - last_loop
            last_loop = time.monotonic()
            if gap > self.config.lease_timeout_s / 3:
                ctx.stats.stalls += 1
                self.ownership.confirm_leases(gap)
            self._pass()

    def start_ticking(self, now: int) -> None:
        """The first tick of the fire loop comes at the next multiple of `tick_ms` after `now`."""
        self._last_pass_ms = now
        self._next_tick_ms = now - now % self.config.tick_ms + self.config.tick_ms

    def _wait_ms(self, now: int) -> int:
        """How long the fire loop may sleep: until the next tick, or before it until a full
        rate window of the gate frees up, or until the first held entry falls due, but no
        sooner than `fire_gap_ms` after the last pass (so a pass fires a batch, not a task).
        A wall clock stepped back by more than a tick starts the ticks again from now, so
        the step does not hold the tick's work back for as long as the step."""
        tick = self.config.tick_ms
        if now < self._next_tick_ms - tick:
            self._next_tick_ms = now - now % tick + tick
            self._last_pass_ms = min(self._last_pass_ms, now)
        wake = self._next_tick_ms
        release_at = self.firing.release_at_ms
        if release_at is not None and now < release_at < wake:
            wake = release_at
        due = self.firing.next_due_ms()
        if due is not None and due < wake:
            wake = max(due, min(self._last_pass_ms + self._gap_ms(), wake))
        return max(wake - now, 0)

    def _gap_ms(self) -> int:
        """`fire_gap_ms`, or three times as long as the last publish and flush took if
        that is more: when the machine or Kafka is busy, flushes slow down, and a pass
        every gap would spend the fire loop's time waiting on them; then fewer, larger
        passes keep the rate (at most one flush in three of the loop's time)."""
        return max(self.config.fire_gap_ms, int(3 * self.firing.send_ms))

    def _pass(self) -> None:
        """One wake of the fire loop: the tick once its time has come, else a pass that
        fires the held entries fallen due."""
        now = self._last_pass_ms = self.ctx.clock()
        if now >= self._next_tick_ms:
            self._next_tick_ms = now - now % self.config.tick_ms + self.config.tick_ms
            self._tick()
        else:
            self._fire_held(now)

    def _fire_held(self, now: int) -> None:
        """A pass between ticks: fire the held entries that have fallen due (and what the
        gate lets out), publish and flush them. Nothing else: reads, hand-offs, cursors and
        stats keep the tick's pace, whatever the number of passes."""
        firing = self.firing
        if firing.pending:
            return  # a failed publish is retried at a tick, after its backoff
        firing.fire(now, held_only=True)

    def _tick(self) -> None:
        now = self.ctx.clock()
        firing = self.firing
        self.intake.read()
        if firing.pending and (now < firing.retry_at_ms or not firing.publish_pending()):
            firing.check_give_up(now)
            self._take_gauges(now)
            self._write_stats(now)  # an outage shows in the stats file and the metrics while it lasts
            return
        polled = firing.fire(now)
        if not firing.pending:
            self.progress.mark_ready(polled)
        firing.check_give_up(now)
        self.reading.trim_memory()
        self.reading.schedule(now)
        self.progress.advance_cursors(now)
        if self.schedules is not None:
            self.schedules.run_due(now)
        self.progress.commit(now)
        self._take_gauges(now)
        self._write_stats(now)

    def _take_gauges(self, now: int) -> None:
        """Replace `ctx.gauges`, about once every `gauges_interval_ms` (the metrics read it)."""
        if now - self._last_gauges_ms < self.config.gauges_interval_ms:
            return
        self._last_gauges_ms = now
        shards = self.ctx.shards.values()
        self.ctx.gauges = Gauges(
            at_ms=now,
            shards_held=len(shards),
            cursor_lag_max_ms=now - min(owned.persisted_ms for owned in shards) if shards else None,
            wheel_tasks=sum(owned.waiting for owned in shards),
            wheel_bytes=self._wheel_bytes(now),
            gate_waiting=self.gate.waiting,
            unacknowledged_batches=len(self.firing.pending),
            handoff_lag_max_ms=self.intake.take_max_lag(),
        )

    def _wheel_bytes(self, now: int) -> int:
        """The wheels' bytes (a walk of every slot of every shard), measured again only
        when the wheels' entries have changed or a second has passed: the gauges and the
        stats file each ask once a second."""
        waiting = sum(len(owned.wheel) for owned in self.ctx.shards.values())
        at, held, value = self._wheel_bytes_at
        if value < 0 or held != waiting or not 0 <= now - at < 1000:
            value = sum(owned.wheel.nbytes for owned in self.ctx.shards.values())
            self._wheel_bytes_at = (now, waiting, value)
        return value

    def _write_stats(self, now: int) -> None:
        path = self.config.stats_path
        if path is None or now - self._last_stats_ms < self.config.stats_interval_ms:
            return
        self._last_stats_ms = now
        try:
            write_json(path, self.snapshot())
        except OSError as exc:
            log.warning("could not write the stats file %s: %s", path, exc)

    def snapshot(self) -> dict[str, Any]:
        """What this dispatcher holds and has done, as one JSON-able document."""
        shards = self.ctx.shards
        return {
            "member": self.config.member,
            "pid": os.getpid(),
            "at_ms": self.ctx.clock(),
            "session": self.ctx.session.value,
            "shards": sorted(shards),
            "tokens": {str(shard): owned.token for shard, owned in sorted(shards.items())},
            "waiting": sum(owned.waiting for owned in shards.values()),
            "wheel_bytes": self._wheel_bytes(self.ctx.clock()),
            "seen_bytes": sum(owned.seen.nbytes for owned in shards.values()),
            "gate_waiting": self.gate.waiting,
            "tenants": self.gate.snapshot(),
            "stats": self.ctx.stats.document(),
        }

    def _shutdown(self) -> None:
        """Give every shard back, so other dispatchers take over without waiting: what
        was fired but not acknowledged is left for the next owner to fire again."""
        ctx = self.ctx
        if self.firing.pending:
            self.firing.publish_pending()
        ctx.readers.shutdown(wait=False, cancel_futures=True)
        ctx.lookers.shutdown(wait=False, cancel_futures=True)
        if self.schedules is not None:
            self.schedules.stop()
        for shard in list(ctx.shards):
            self.ownership.give_back(shard)
        ctx.writers.shutdown(wait=True)
        if self.purge is not None:
            self.purge.stop()
        if self.visible is not None:
            self.visible.stop()
        self._write_stats(ctx.clock() + self.config.stats_interval_ms)


def write_json(path: Path, document: dict[str, Any]) -> None:
    """Replace `path` atomically, so a reader never sees half a document."""
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(json.dumps(document))
    os.replace(temporary, path)
