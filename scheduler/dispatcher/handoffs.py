"""Intake: the hand-off log's records, applied to the shards they are for.

A producer that stored a task due soon, or a cancel, also hands it to the shard's owner
through the hand-off log (`scheduler.handoff`); workers hand over completions the same
way (for the release gate's caps). Each tick the fire loop reads what arrived and
applies it here; `positions` says how far each shard's log has been read, and
`Progress` commits a position once every record before it is safe.
"""

from __future__ import annotations

import logging

from scheduler import handoff
from scheduler.dispatcher.config import SKEW_WARN_MS, SKEW_WINDOW_MS
from scheduler.dispatcher.context import DispatcherContext
from scheduler.errors import InvalidMessage, QueueError
from scheduler.fairness.gate import ReleaseGate
from scheduler.ports import HandoffReader

log = logging.getLogger(__name__)


class HandoffIntake:
    """Reads the hand-off log of the shards held and applies each record (on the fire loop)."""

    def __init__(self, ctx: DispatcherContext, reader: HandoffReader, gate: ReleaseGate) -> None:
        self.ctx = ctx
        self.reader = reader
        self.gate = gate
        self.positions: dict[int, int] = {}
        """The offset after the last record read, by shard."""
        self._lag_window: tuple[int, int | None] = (0, None)
        """(window start, least lag so far) of the records' stamps."""
        self._skew_logged_ms = 0
        self.max_lag_ms = 0
        """The greatest now - stamp of the records read since `take_max_lag`."""

    def read(self) -> None:
        """Apply what arrived since the last tick. One bad record is counted and skipped."""
        ctx = self.ctx
        if not ctx.shards:
            return
        try:
            records = self.reader.poll(10_000, 0)
        except QueueError as exc:
            ctx.stats.handoff_failures += 1
            log.warning("reading the hand-off log failed: %s", exc, extra={"action": "handoff_read_failed"})
            return
        now = ctx.clock()
        for record in records:
            if record.timestamp_ms is not None:
                self._note_stamp(now, record.timestamp_ms)
            owned = ctx.shards.get(record.shard)
            if owned is None:
                continue
            try:
                item = handoff.decode(record.value)
                if isinstance(item, handoff.HandedCompletions):
                    ctx.stats.completions += self.gate.completed(item.task_ids)
                elif isinstance(item, handoff.HandedTask):
                    if item.task.id.shard(ctx.shard_count) != record.shard:
                        raise InvalidMessage(f"the task belongs to shard {item.task.id.shard(ctx.shard_count)}")
                    if owned.handed_task(item.task):
                        ctx.stats.handed_tasks += 1
                else:
                    ctx.stats.handed_cancels += 1
                    owned.handed_cancel(item.task_id.bytes, item.task_id.run_at_ms)
                    self.gate.cancel(record.shard, item.task_id.bytes)
            except Exception as exc:  # one bad record must not stop the shard, nor its next owner
                ctx.stats.bad_handoffs += 1
                log.error("skipped a bad hand-off record at shard %d offset %d: %s", record.shard, record.offset, exc,
                          extra={"action": "bad_handoff"})
            self.positions[record.shard] = record.offset + 1

    def forget(self, shard: int) -> None:
        self.positions.pop(shard, None)

    def take_max_lag(self) -> int:
        """The greatest lag since the last call (0 if no stamped record came), and start anew."""
        lag, self.max_lag_ms = self.max_lag_ms, 0
        return lag

    def _note_stamp(self, now: int, stamp_ms: int) -> None:
        """Measure the hand-off writers' clocks against this one: a record stamped ahead of
        now was stamped by a clock that is ahead (counted, logged once a window); the least
        lag over a window is how far behind the writers' clocks are, plus the transit."""
        stats = self.ctx.stats
        lag = now - stamp_ms
        if lag > self.max_lag_ms:
            self.max_lag_ms = lag
        if lag < -SKEW_WARN_MS:
            stats.handoff_clock_ahead += 1
            if now - self._skew_logged_ms >= SKEW_WINDOW_MS:
                self._skew_logged_ms = now
                log.warning("a hand-off record was stamped %d ms ahead of this dispatcher's clock: a producer's or "
                            "worker's clock is ahead; its tasks due 'now' fire that much late (see the README on "
                            "clocks)", -lag, extra={"action": "clock_skew"})
        started, least = self._lag_window
        if now - started >= SKEW_WINDOW_MS:
            if least is not None:
                stats.handoff_min_lag_ms = least
            self._lag_window = (now, lag)
        elif least is None or lag < least:
            self._lag_window = (started, lag)
