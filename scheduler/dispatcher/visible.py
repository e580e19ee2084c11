"""The dispatcher's part in `scheduler status`: it counts what it publishes, by tenant,
type and first attempt or retry, measures how late it publishes, reports its shards and
wheel, and, while it holds shard 0, folds past hours of counts into the snapshot.

The fire loop calls `published` once per successful flush with the batches the queue
acknowledged (`Firing.publish_pending`): counting is then ~0.3 µs a message
(`scheduler.visibility.tally`), and nothing is counted that the queue did not take. The
fire lateness is the one the dispatcher keeps for its metrics (`Stats.fire_lateness`). The
rest runs on the count writer's thread (`scheduler.visibility.writer`).
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Iterable
from itertools import chain

from scheduler.dispatcher.context import DispatcherContext
from scheduler.errors import SchedulerError
from scheduler.fairness.gate import ReleaseGate
from scheduler.ports import CountStore
from scheduler.visibility.counts import EventCounter
from scheduler.visibility.fold import fold_hours
from scheduler.visibility.tally import decode_tally, tally
from scheduler.visibility.writer import DEFAULT_INTERVAL_S, CountWriter, Gauges, new_writer_id

log = logging.getLogger(__name__)

FOLD_EVERY_MS = 60_000
FOLD_SHARD = 0
"""The shard whose holder folds the counts: one folder at a time, most of the time (two
for a moment during a hand-over fold the same hours to the same snapshot)."""


class DispatcherVisibility:
    def __init__(self, ctx: DispatcherContext, gate: ReleaseGate, store: CountStore,
                 interval_s: float = DEFAULT_INTERVAL_S) -> None:
        self.ctx = ctx
        self.gate = gate
        self.store = store
        self.writer = CountWriter(store, "dispatcher", writer=new_writer_id(f"dispatcher-{ctx.config.member}"),
                                  gauges=self._gauges, lateness={"fire": lambda: ctx.stats.fire_lateness},
                                  interval_s=interval_s, clock_ms=ctx.clock, before_write=self._collect,
                                  after_write=self._fold)
        self._keys: Counter[bytes] = Counter()
        self._keys_lock = threading.Lock()
        self._last_fold_ms = 0

    @property
    def events(self) -> EventCounter:
        return self.writer.counter

    def start(self) -> None:
        self.writer.start()

    def stop(self) -> None:
        self.writer.stop()

    def published(self, batches: Iterable[Iterable[bytes]], now_ms: int) -> None:
        """On the fire loop: the queue acknowledged these messages."""
        keys = tally(chain.from_iterable(batches))
        with self._keys_lock:
            self._keys.update(keys)

    def _collect(self) -> None:
        """On the writer's thread: what was published since the last write goes to the
        counter, its keys decoded here, off the fire loop."""
        with self._keys_lock:
            keys, self._keys = self._keys, Counter()
        first, retries = decode_tally(keys)
        self.writer.counter.add_many("fired", first)
        self.writer.counter.add_many("refired", retries)

    def _gauges(self) -> Gauges:
        """On the writer's thread: what the fire loop last took (`ctx.gauges`, replaced
        whole every `gauges_interval_ms`; only the fire loop may read the wheels)."""
        taken = self.ctx.gauges
        return Gauges(detail={
            "member": self.ctx.config.member,
            "shards": taken.shards_held,
            "wheel_tasks": taken.wheel_tasks,
            "wheel_bytes": taken.wheel_bytes,
            "gate_waiting": taken.gate_waiting,
            "cursor_lag_max_ms": taken.cursor_lag_max_ms,
            "session": self.ctx.session.value,
        })

    def _fold(self, now_ms: int) -> None:
        if FOLD_SHARD not in self.ctx.shards or now_ms - self._last_fold_ms < FOLD_EVERY_MS:
            return
        self._last_fold_ms = now_ms
        try:
            fold_hours(self.store, now_ms)
        except SchedulerError as exc:
            log.warning("folding the counts failed: %s; trying again in a minute", exc,
                        extra={"action": "counts_fold_failed"})
