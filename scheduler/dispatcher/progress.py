"""Progress: what a dispatcher writes down so that the next owner of a shard starts
where it should, neither skipping a task nor firing much again.

- The **cursor** (`fired_through` in the store, with its per-bucket baselines) moves
  about once a second, as far as `OwnedShard.cursor_candidate` allows and never past a
  task still waiting in the release gate; the write is fenced by the lease's token, and
  a refusal means a newer owner exists, so the shard is dropped.
- The **hand-off position** of a shard is committed once every record before it is
  safe: fired and acknowledged, or waiting in the wheel after the cursor (where a new
  owner's read of the store finds it), and not held in the gate behind the cursor.
"""

from __future__ import annotations

import logging
from functools import partial

from scheduler.dispatcher.context import DispatcherContext
from scheduler.dispatcher.handoffs import HandoffIntake
from scheduler.dispatcher.shard import OwnedShard
from scheduler.errors import QueueError, SchedulerError
from scheduler.fairness.gate import ReleaseGate
from scheduler.ports import HandoffReader, Lease

log = logging.getLogger(__name__)


class Progress:
    """Advances cursors and commits hand-off positions (on the fire loop; the cursor
    writes on the writers' pool)."""

    def __init__(self, ctx: DispatcherContext, intake: HandoffIntake, gate: ReleaseGate,
                 reader: HandoffReader) -> None:
        self.ctx = ctx
        self.intake = intake
        self.gate = gate
        self.reader = reader
        self._advancing: set[int] = set()
        self._advance_target: dict[int, int] = {}
        """The cursor each shard's latest advance asked for."""
        self._last_advance_ms: dict[int, int] = {}
        self._ready_positions: dict[int, int] = {}
        """Hand-off positions whose records are all safe: fired and flushed, or in a wheel."""
        self._committed: dict[int, int] = {}
        self._last_commit_ms = 0

    def cursor(self, owned: OwnedShard) -> int:
        """How far the shard's cursor may move: never past a task waiting in the gate."""
        through = owned.cursor_candidate()
        floor = self.gate.floor(owned.shard)
        return through if floor is None else min(through, floor)

    def mark_ready(self, polled: set[int]) -> None:
        """Nothing is pending publication: every record of these shards read so far is
        now fired and flushed, or waits in the wheel after the cursor, where a new owner's
        read of the store finds it."""
        for shard in polled:
            if shard in self.intake.positions and not self._gate_holds_behind_cursor(shard):
                self._ready_positions[shard] = self.intake.positions[shard]

    def _gate_holds_behind_cursor(self, shard: int) -> bool:
        """Whether a task waits in the gate at or before the shard's cursor (as written, or
        being written). Only the hand-off brings such a task (one submitted into the
        past): a new owner would not read it from the store, so the hand-off position
        must not be committed past it until it is released and acknowledged."""
        floor = self.gate.floor(shard)
        if floor is None:
            return False
        owned = self.ctx.shards[shard]
        return floor < max(owned.persisted_ms, self._advance_target.get(shard, owned.persisted_ms))

    def advance_cursors(self, now: int) -> None:
        ctx = self.ctx
        for shard, owned in ctx.shards.items():
            if shard in self._advancing or now - self._last_advance_ms.get(shard, 0) < ctx.config.advance_interval_ms:
                continue
            through = self.cursor(owned)
            if through > owned.persisted_ms and ctx.coordinator.is_valid(owned.lease):
                self._advancing.add(shard)
                self._last_advance_ms[shard] = now
                self._advance_target[shard] = through
                ctx.submit(ctx.writers, self._advance, shard, owned.lease, through, owned.baselines(now, through),
                           on_error=partial(ctx.post, partial(self._advanced, shard, owned.lease, None)))

    def _advance(self, shard: int, lease: Lease, through_ms: int, baselines: dict[int, int]) -> None:
        """On a writer: the fenced cursor write."""
        ctx = self.ctx
        try:
            applied = ctx.store.advance_shard(shard, lease.token, through_ms, baselines)
        except SchedulerError as exc:
            ctx.stats.store_failures += 1
            log.warning("advancing the cursor of shard %d failed: %s", shard, exc,
                        extra={"action": "advance_failed", "shard": shard})
            ctx.post(partial(self._advanced, shard, lease, None))
            return
        ctx.post(partial(self._advanced, shard, lease, through_ms if applied else False))

    def _advanced(self, shard: int, lease: Lease, result: int | bool | None) -> None:
        """Back on the fire loop: the new cursor, False if the store refused the token,
        None if the write failed (the next advance tries again)."""
        ctx = self.ctx
        self._advancing.discard(shard)
        owned = ctx.current(shard, lease.token)
        if result is False:
            ctx.stats.fenced_out += 1
            log.error("the store refused the cursor of shard %d for token %d: a newer owner exists; stopped "
                      "firing it", shard, lease.token, extra={"action": "fenced_out", "shard": shard})
            if owned is not None:
                ctx.drop(shard, "fenced out by the store", lease)
            return
        if isinstance(result, int) and not isinstance(result, bool) and owned is not None:
            owned.persisted_ms = max(owned.persisted_ms, result)
            ctx.stats.advances += 1

    def commit(self, now: int) -> None:
        """Commit the ready hand-off positions, about once every `commit_interval_ms`."""
        ctx = self.ctx
        if now - self._last_commit_ms < ctx.config.commit_interval_ms:
            return
        self._last_commit_ms = now
        positions = {shard: offset for shard, offset in self._ready_positions.items()
                     if shard in ctx.shards and self._committed.get(shard) != offset}
        if not positions:
            return
        try:
            self.reader.commit(positions)
        except QueueError as exc:
            ctx.stats.handoff_failures += 1
            log.warning("committing hand-off positions failed: %s", exc, extra={"action": "commit_failed"})
            return
        self._committed.update(positions)

    def commit_shard(self, shard: int) -> None:
        """Commit one shard's ready position now (it is being given back)."""
        position = self._ready_positions.get(shard)
        if position is not None and position != self._committed.get(shard):
            try:
                self.reader.commit({shard: position})
            except QueueError as exc:  # the next owner reads a little again: duplicates, never loss
                self.ctx.stats.handoff_failures += 1
                log.warning("committing the hand-off position of shard %d failed: %s", shard, exc)

    def forget(self, shard: int) -> None:
        self._advance_target.pop(shard, None)
        self._committed.pop(shard, None)
        self._ready_positions.pop(shard, None)
