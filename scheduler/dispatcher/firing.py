"""Firing: what is due in every shard whose lease is valid goes through the release gate
to the queue, at each tick and, between ticks, as the entries a shard holds fall due
(`OwnedShard.soon`: a slot is taken from the wheel when it begins, and each of its
entries fires at its own `run_at`).

A shard fires only while `Coordinator.is_valid(lease)` holds (checked before every
batch, no I/O); while the session is suspended nothing fires and the shards are kept,
since the leases may yet survive. A fired batch stays `pending` until the queue
acknowledges its flush; a failed flush keeps it, to publish again with backoff, and
nothing moves the shard's frontiers past it meanwhile. After `publish_give_up_s`
without a successful publish the dispatcher stops, so that one that can publish takes
its shards over.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from scheduler.dispatcher.context import DispatcherContext
from scheduler.dispatcher.rows import FireBatch
from scheduler.errors import QueueError
from scheduler.fairness.gate import ReleaseGate
from scheduler.ports import Publisher, SessionState

log = logging.getLogger(__name__)


class Firing:
    """Fires due tasks, publishes and flushes them, and keeps what the queue did not
    acknowledge (all on the fire loop)."""

    def __init__(self, ctx: DispatcherContext, gate: ReleaseGate, publisher: Publisher, topics: dict[int, str]) -> None:
        self.ctx = ctx
        self.gate = gate
        self.publisher = publisher
        self.topics = topics
        self.pending: list[tuple[int, int, FireBatch]] = []
        """Fired batches not yet acknowledged by the queue (published again after a failure)."""
        self.retry_at_ms = 0
        self._backoff_ms = 0
        self._failing_since_ms: int | None = None
        self.release_at_ms: int | None = None
        """When the gate can let the next task out, if that is before the next tick."""
        self.failed: str | None = None
        """Why the dispatcher gave up, if it did."""
        self.send_ms = 0.0
        """How long the last publish and flush took (wall clock)."""
        self.on_published: Callable[[list[list[bytes]], int], None] | None = None
        """Told of every message the queue acknowledged (`visible.DispatcherVisibility`)."""

    def fire(self, now: int, *, held_only: bool = False) -> set[int]:
        """Fire what is due in every shard whose lease is valid; returns those shards.
        With `held_only` (a pass between ticks), only the shards whose held entries
        (`OwnedShard.soon`) have fallen due are looked at: the wheels' slots wait for the
        tick."""
        ctx = self.ctx
        polled: set[int] = set()
        if ctx.session is SessionState.SUSPENDED:
            return polled  # the leases may yet survive: keep the shards, fire nothing
        gate = self.gate
        gated = not gate.bypass
        for shard, owned in list(ctx.shards.items()):
            if held_only:
                due = owned.next_due_ms()
                if due is None or due > now:
                    continue
            if not ctx.coordinator.is_valid(owned.lease):
                session = ctx.session_now()  # another thread may have changed it since the check above
                if session is not SessionState.SUSPENDED:
                    ctx.drop(shard, f"its lease is no longer valid (session {session.value})", owned.lease)
                continue
            batch = owned.fire(now, gated=gated)
            if batch.gated is not None:
                batch.run_ats = []
                batch.by_tag = gate.admit(shard, batch.gated, batch.run_ats)
                passed = sum(len(values) for values in batch.by_tag.values())
                ctx.stats.gated += len(batch.gated) - passed
                batch.count, batch.gated = passed, None
            polled.add(shard)
            ctx.stats.skipped_cancelled += batch.skipped_cancelled
            ctx.stats.duplicates_dropped += batch.duplicates
            if batch.dead_letters and ctx.config.dead_letter_topic is None:
                batch.dead_letters = []  # nowhere to park them: logged when read
            if batch.by_tag or batch.dead_letters:
                self.pending.append((shard, owned.token, batch))
            else:
                owned.flushed(batch)
        if gated:
            self._let_out(now)
        if self.pending:
            self.publish_pending()
        return polled

    def next_due_ms(self) -> int | None:
        """When the first entry held by a shard falls due, if a pass between ticks could
        fire it: None while batches wait to be published again or the session is
        suspended (the ticks retry those), or when nothing is held."""
        if self.pending or self.ctx.session is SessionState.SUSPENDED:
            return None
        first: int | None = None
        for owned in self.ctx.shards.values():
            at = owned.next_due_ms()
            if at is not None and (first is None or at < first):
                first = at
        return first

    def _let_out(self, now: int) -> None:
        """Add what the gate lets out now to the batches to publish; the shards' wheel
        frontiers do not move with them (they moved when the tasks entered the gate)."""
        released = self.gate.release(now)
        self.release_at_ms = released.next_at_ms
        for shard, by_tag in released.by_shard.items():
            owned = self.ctx.shards[shard]  # a shard dropped has nothing left in the gate
            waiting = released.waiting[shard]
            batch = FireBatch(by_tag, owned.flushed_through_ms, len(waiting), 0, released=waiting,
                              released_at_ms=released.at_ms, run_ats=[w.run_at_ms for w in waiting])
            self.pending.append((shard, owned.token, batch))

    def publish_pending(self) -> bool:
        """Publish and flush the pending batches of shards whose lease is valid; on failure
        keep them to publish again. A batch of a shard since dropped is discarded: its
        next owner fires it again from the cursor. True when nothing is left pending."""
        ctx = self.ctx
        sending: list[tuple[int, int, FireBatch]] = []
        keeping: list[tuple[int, int, FireBatch]] = []
        for shard, token, batch in self.pending:
            owned = ctx.current(shard, token)
            if owned is None:
                continue
            if ctx.coordinator.is_valid(owned.lease):
                sending.append((shard, token, batch))
            elif ctx.session_now() is SessionState.SUSPENDED:
                keeping.append((shard, token, batch))  # the lease may yet come back
            else:
                ctx.drop(shard, "its lease is no longer valid", owned.lease)
        dead_letter_topic = ctx.config.dead_letter_topic
        try:
            if sending:
                by_topic: dict[tuple[str, int | None], list[bytes]] = {}
                for _, _, batch in sending:
                    for tag, values in batch.by_tag.items():
                        by_topic.setdefault((self.topics[tag], batch.released_at_ms), []).extend(values)
                    if batch.dead_letters and dead_letter_topic is not None:
                        by_topic.setdefault((dead_letter_topic, None), []).extend(batch.dead_letters)
                began = time.monotonic()
                for (topic, stamp), values in by_topic.items():
                    self.publisher.publish(topic, values, stamp)
                self.publisher.flush(ctx.config.flush_timeout_s)
                self.send_ms = (time.monotonic() - began) * 1000
        except QueueError as exc:
            ctx.stats.publish_failures += 1
            now = ctx.clock()
            if self._failing_since_ms is None:
                self._failing_since_ms = now
            self._backoff_ms = min(max(self._backoff_ms * 2, 100), 5000)
            self.retry_at_ms = now + self._backoff_ms
            log.warning("publishing failed: %s; publishing again in %d ms", exc, self._backoff_ms,
                        extra={"action": "publish_failed"})
            self.pending = keeping + sending
            return False
        if sending:
            self._backoff_ms = 0
            self._failing_since_ms = None
            if self.on_published is not None:
                try:
                    self.on_published([values for _, _, batch in sending for values in batch.by_tag.values()],
                                      ctx.clock())
                except Exception:  # counting must never stop firing
                    log.exception("counting the published messages failed")
        stats = ctx.stats
        flushed_at = ctx.clock()
        fired_by_tag = stats.fired_by_tag
        for shard, token, batch in sending:
            stats.fired += batch.count
            for tag, values in batch.by_tag.items():
                fired_by_tag[tag] += len(values)
            stats.fire_lateness.add_elapsed(flushed_at, batch.run_ats)
            owned = ctx.current(shard, token)
            if owned is not None:
                owned.flushed(batch)
                if batch.released is not None:
                    ctx.stats.released += batch.count
                    self.gate.published(shard, batch.released)
        self.pending = keeping
        return not keeping

    def check_give_up(self, now: int) -> None:
        """Stop the dispatcher once nothing could be published for `publish_give_up_s`."""
        ctx = self.ctx
        since = self._failing_since_ms
        if since is not None and now - since > ctx.config.publish_give_up_s * 1000 and self.failed is None:
            self.failed = f"nothing could be published for {ctx.config.publish_give_up_s:.0f} s"
            log.error("%s: giving every shard back and stopping", self.failed, extra={"action": "give_up"})
            ctx.stop()
