"""`Commits`: which offsets a worker has received and settled, and committing them.

A message's offset is committed only once its outcome is durable: the settler hands the
settled deliveries back through `settled` (on the settler's thread, into a queue), the
main loop takes them into `progress.Progress` (`take_settled`), and commits every known
position at most every `interval_s` (`maybe_commit`), and at once for partitions taken
away (`revoked`) and on the way out (`force`). A message skipped before it ran (the
home row says it must not) is settled here directly: it has nothing to write.

A failed commit is counted and logged, never fatal: the messages are delivered again if
the worker dies before the next commit succeeds, and a repeat is absorbed by the
home-row check and the ledger.

Threads: everything but `settled` runs on the main loop, which alone owns the
`Progress`.
"""

from __future__ import annotations

import logging
import queue
import time

from scheduler.errors import SchedulerError
from scheduler.ports import Consumer, Delivery, TopicPartition
from scheduler.worker.progress import Progress
from scheduler.worker.stats import WorkerStats

log = logging.getLogger("scheduler.worker.runtime")  # the worker logs under one name, whichever part writes


class Commits:
    def __init__(self, stats: WorkerStats, *, interval_s: float) -> None:
        self._stats = stats
        self._interval_s = interval_s
        self._progress = Progress()
        self._settled: queue.SimpleQueue[list[Delivery]] = queue.SimpleQueue()
        self._last_commit = 0.0

    def settled(self, deliveries: list[Delivery]) -> None:
        """The settler's callback (on its thread): these outcomes are durable."""
        self._settled.put(deliveries)

    def received(self, delivery: Delivery) -> None:
        self._progress.received((delivery.topic, delivery.partition), delivery.offset)

    def settle(self, delivery: Delivery) -> None:
        """Settle a message that has nothing to write."""
        self._progress.settle((delivery.topic, delivery.partition), delivery.offset)

    def outstanding(self) -> int:
        """Messages received and not yet settled."""
        return self._progress.outstanding()

    def take_settled(self) -> None:
        while True:
            try:
                deliveries = self._settled.get_nowait()
            except queue.Empty:
                return
            for delivery in deliveries:
                self._progress.settle((delivery.topic, delivery.partition), delivery.offset)

    def maybe_commit(self, consumer: Consumer, *, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last_commit < self._interval_s:
            return
        self._last_commit = now
        # Every known position, not only those that moved: a commit the queue dropped
        # (Kafka drops one made while the group rebalances) is made again next time.
        positions = self._progress.positions()
        if not positions:
            return
        try:
            consumer.commit(positions)
        except SchedulerError as exc:
            self._stats.commit_failures += 1
            log.warning("commit failed (the messages will be delivered again if this worker dies): %s", exc)
            return
        self._stats.commits += 1

    def revoked(self, consumer: Consumer | None, partitions: list[TopicPartition]) -> None:
        """Commit what is settled of partitions taken away, then forget them: their
        unsettled messages go to the next owner, and late settles must not be committed."""
        self.take_settled()
        lost = set(partitions)
        positions = {p: pos for p, pos in self._progress.positions().items() if p in lost}
        if positions and consumer is not None:
            try:
                consumer.commit(positions)
            except SchedulerError as exc:
                log.warning("commit of revoked partitions failed: %s", exc)
        self._progress.forget(partitions)
