"""`Intake`: everything between a poll and a start: decoding, the home-row check,
cancels, merging repeats, the buffers per topic, the order of starts, and flow control.

A polled batch is decoded (an undecodable message is dead-lettered at once), checked
against the tasks' home rows if any of it is suspect, and *placed*: each runnable
message becomes a `Job` in its topic's buffer. The main loop then takes jobs from the
buffers in weighted order (`next_chunk`, `serving.WeightedServing`) and hands them to
`execution`.

The check of the home row. Before running a message the worker may read the task's
home row (one store query per partition per polled batch) and skip a task that is
cancelled, done or dead, one whose home row reports a newer attempt, and one whose same
attempt already failed (its retry is scheduled). If the check itself fails, the batch
runs unchecked: a repeat is allowed, a stall is not. Which messages are checked is
`WorkerConfig.check` (`CHECKS`):

- `suspect` (the default) checks the messages that can be repeats: retries
  (attempt > 1); messages of a partition assigned to this worker less than
  `suspect_window_s` ago (after a start or a rebalance, where the uncommitted tail of
  the previous reader is delivered again); messages older than that window (a backlog,
  or a re-fire); and messages with a stale fencing token (`fences`). A fresh first
  attempt on a steady partition is run without a read: at 9:00 that read would be one
  more store request per task for nothing, since such a message is almost never a
  repeat, and `ctx.once` still guards its effects if it is. The cost: a cancel that
  lands in the second between a task's firing and its start may not stop it (a cancel
  never stops a running attempt either);
- `always` checks every message; `never` none.

Cancels are definite whatever `check` says (`scheduler.cancels`): a `CancelWatch`
keeps the store's cancel marks, read every 200 ms. A message whose shard was marked
since a few minutes before its task's first time (the home row's, which a retry or a
deferred copy shares) is checked before it is placed, and the check is then required
(if it fails it is tried again, never skipped); a placed message whose shard's mark
moved since is checked again before it starts (`next_chunk` sets it aside for
`recheck`, and so does the handler's own thread if the count moved, or the copy grew
old, by the moment the handler would begin: `Execution`'s `may_start`); and nothing
starts while the copy of the marks is older than `cancels.MAX_AGE_MS`.

Repeats held here. A message of an attempt this worker already holds (buffered or
running: after a rebalance hands back a partition whose messages were in flight, or a
copy a dispatcher published twice) is not run again: it follows the job it repeats and
is settled with it.

Threads. The main loop owns all of this state. The home-row check is store I/O, so it
runs on two **checker** threads (`_check`); a checked batch comes back through a queue
(`take_checked`) and is placed by the main loop, unless its partitions were revoked
meanwhile (`_revoked_count`: the next owner has it) or the worker is stopping. A
checker thread writes nothing but that queue and the `check_failures` counter.
"""

from __future__ import annotations

import concurrent.futures
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping

from scheduler import cancels
from scheduler.errors import InvalidMessage
from scheduler.model import Message, Task, TaskId, decode_message
from scheduler.ports import CancelMarks, Consumer, Delivery, HomeStatus, TaskStatus, TaskStore, TopicPartition
from scheduler.worker import dead_letters
from scheduler.worker.app import App
from scheduler.worker.cancel_watch import CancelWatch
from scheduler.worker.commits import Commits
from scheduler.worker.fences import Fences
from scheduler.worker.job import Job
from scheduler.worker.outcomes import Outcomes
from scheduler.worker.serving import WeightedServing
from scheduler.worker.stats import WorkerStats
from scheduler.worker.visible import WorkerVisibility

CHECKS = ("suspect", "always", "never")

log = logging.getLogger("scheduler.worker.runtime")  # the worker logs under one name, whichever part writes

Decoded = list[tuple[Delivery, Message]]


class Intake:
    def __init__(
        self,
        app: App,
        stats: WorkerStats,
        *,
        topics: Mapping[str, str],
        weights: Mapping[str, int],
        store: TaskStore,
        cancel_watch: CancelWatch,
        fences: Fences,
        commits: Commits,
        outcomes: Outcomes,
        stop: threading.Event,
        clock_ms: Callable[[], int],
        shard_count: int,
        check: str,
        suspect_window_s: float,
        poll_batch: int,
        buffer_per_topic: int,
        max_outstanding: int,
        buffer_bytes_per_topic: int = 32 << 20,
    ) -> None:
        self._app = app
        self._stats = stats
        self.visible: WorkerVisibility | None = None
        """Told of every message skipped (`scheduler status`)."""
        self._topics = topics
        self._store = store
        self._cancel_watch = cancel_watch
        self._fences = fences
        self._commits = commits
        self._outcomes = outcomes
        self._stop = stop
        self._clock_ms = clock_ms
        self._shard_count = shard_count
        self._check_mode = check
        self._suspect_window_s = suspect_window_s
        self._poll_batch = poll_batch
        self._buffer_per_topic = buffer_per_topic
        self._buffer_bytes_per_topic = buffer_bytes_per_topic
        self._message_bytes = 200.0
        """A running mean of the size of the messages received, for the byte bound."""
        self._max_outstanding = max_outstanding
        self._short_names = {topic: name for name, topic in topics.items()}
        self._buffers: dict[str, deque[Job]] = {name: deque() for name in topics}
        self._serving = WeightedServing({name: weights.get(name, 1) for name in topics})
        self._owed: str | None = None
        """A topic picked whose job was put back to start alone: it goes first next."""
        self._paused: set[str] = set()
        self.paused_view: tuple[str, ...] = ()
        """A copy of `_paused` for other threads (the stats writer)."""
        self._active: dict[tuple[TaskId, int], Job] = {}
        """Jobs buffered or running, by (task, attempt)."""
        self._checker = concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="checker")
        self._checked: queue.SimpleQueue[tuple[Decoded, dict[TaskId, HomeStatus] | None,
                                               dict[TopicPartition, int], CancelMarks]] = queue.SimpleQueue()
        self.checking = 0
        """Messages at the checker."""
        self._revoked_count: dict[TopicPartition, int] = {}
        self._first_seen: dict[TopicPartition, float] = {}
        """When each partition was assigned to this worker (monotonic)."""
        self._assignment_read_at = 0.0

    def close(self) -> None:
        self._checker.shutdown(wait=False, cancel_futures=True)

    # The buffers.

    def has_buffered(self) -> bool:
        return any(self._buffers.values())

    def buffered(self) -> int:
        return sum(len(buffer) for buffer in self._buffers.values())

    def buffered_by_topic(self) -> dict[str, int]:
        return {name: len(buffer) for name, buffer in self._buffers.items()}

    def clear(self) -> None:
        """Drop every buffered job (stopping): never started, the next owner receives them."""
        for name in self._buffers:
            self._buffers[name].clear()

    def release(self, job: Job) -> None:
        """The job is settled or will never run here: a later copy of its attempt may run."""
        self._active.pop((job.message.task.id, job.message.task.attempt), None)

    # From a poll to a buffer.

    def note_assignment(self, consumer: Consumer) -> None:
        """Record when each partition was assigned to this worker (at most every 0.1 s):
        the start of its window of suspect messages."""
        now = time.monotonic()
        if now - self._assignment_read_at < 0.1:
            return
        self._assignment_read_at = now
        for partition in consumer.assignment():
            self._first_seen.setdefault(partition, now)

    def admit(self, deliveries: list[Delivery]) -> None:
        self._stats.received += len(deliveries)
        decoded: Decoded = []
        size = 0
        for delivery in deliveries:
            size += len(delivery.value)
            self._commits.received(delivery)
            try:
                decoded.append((delivery, decode_message(delivery.value)))
            except InvalidMessage as exc:
                self._stats.undecodable += 1
                self._outcomes.dead(delivery, None, dead_letters.UNDECODABLE, str(exc))
        if deliveries:
            self._message_bytes += 0.5 * (size / len(deliveries) - self._message_bytes)
        marks = self._cancel_watch.marks
        shard_count = self._shard_count
        suspects: list[TaskId] = []
        required = False
        for delivery, message in decoded:
            self._fences.note(message)
            task = message.task
            if cancels.needs_check(marks.at.get(task.id.shard(shard_count)), task.id.run_at_ms):
                self._stats.cancel_checks += 1
                required = True
                suspects.append(task.id)
            elif self._suspect(delivery, message):
                suspects.append(task.id)
        if not suspects:
            self._place(decoded, {}, marks)
            return
        self._send_to_check(decoded, suspects, marks, required)

    def _send_to_check(self, decoded: Decoded, suspects: list[TaskId], marks: CancelMarks, required: bool) -> None:
        # The check is store I/O: it runs on the checker thread, so the main loop goes on
        # starting and settling work meanwhile. A batch whose partitions are revoked
        # before it returns is dropped (`_revoked_count`): the next owner has it.
        self.checking += len(decoded)
        revocations = {p: self._revoked_count.get(p, 0) for p in {(d.topic, d.partition) for d, _ in decoded}}
        self._checker.submit(self._check, decoded, suspects, revocations, marks, required)

    def _check(self, decoded: Decoded, suspects: list[TaskId], revocations: dict[TopicPartition, int],
               marks: CancelMarks, required: bool = False) -> None:
        """On the checker thread; whatever happens, the batch goes back to the main loop.
        A `required` check (a cancel may concern the batch) is tried until it succeeds or
        the worker stops; another runs unchecked if it fails."""
        homes: dict[TaskId, HomeStatus] | None = None
        delay = 0.1
        try:
            homes = self._homes(suspects)
            while homes is None and required and not self._stop.wait(delay):
                delay = min(delay * 2, 2.0)
                homes = self._homes(suspects)
        finally:  # stopping with a required check undone: `take_checked` drops the batch
            self._checked.put((decoded, homes, revocations, marks))

    def take_checked(self) -> None:
        """Place the batches the checker has finished with."""
        while True:
            try:
                decoded, homes, revocations, marks = self._checked.get_nowait()
            except queue.Empty:
                return
            self.checking -= len(decoded)
            if self._stop.is_set():
                continue  # draining: never started, so delivered again to the next owner
            kept = [(d, m) for d, m in decoded
                    if self._revoked_count.get((d.topic, d.partition), 0) == revocations[(d.topic, d.partition)]]
            self._place(kept, homes, marks)

    def _place(self, decoded: Decoded, homes: dict[TaskId, HomeStatus] | None, marks: CancelMarks) -> None:
        """Skip what the home rows say must not run; buffer the rest by topic, each with
        its shard's cancel count as `marks` had it."""
        shard_count = self._shard_count
        for delivery, message in decoded:
            task = message.task
            if homes is not None and self._skip(task, homes.get(task.id)):
                self._commits.settle(delivery)
                continue
            handler = self._app.lookup(task.type)
            if handler is None:
                self._stats.unknown_type += 1
                self._outcomes.dead(delivery, message, dead_letters.UNKNOWN_TYPE,
                                    f"no handler for task type {task.type!r} in app {self._app.name!r}")
                continue
            key = (task.id, task.attempt)
            active = self._active.get(key)
            if active is not None:
                # The same attempt again while this worker still holds it: after a
                # rebalance hands back a partition whose messages were in flight, or a
                # copy a dispatcher published twice. Run it once; settle both.
                active.followers.append(delivery)
                self._stats.merged += 1
                continue
            name = self._short_names.get(delivery.topic, next(iter(self._buffers)))
            shard = task.id.shard(shard_count)
            job = self._active[key] = Job(delivery, message, handler, name, shard=shard,
                                          mark_seen=marks.counts.get(shard, 0))
            self._buffers[name].append(job)

    def _suspect(self, delivery: Delivery, message: Message) -> bool:
        """Whether to check this message against its home row (see `CHECKS`)."""
        check = self._check_mode
        if check != "suspect":
            return check == "always"
        partition = (delivery.topic, delivery.partition)
        now = time.monotonic()
        first_seen = self._first_seen.setdefault(partition, now)  # normally set by `note_assignment`
        return (
            message.task.attempt > 1
            or now - first_seen < self._suspect_window_s
            or self._clock_ms() - delivery.timestamp_ms > self._suspect_window_s * 1000
            or self._fences.is_stale(message)
        )

    def _homes(self, ids: list[TaskId]) -> dict[TaskId, HomeStatus] | None:
        if not ids:
            return {}
        try:
            return self._store.statuses(ids)
        except Exception as exc:  # any failure: run unchecked rather than stall
            self._stats.check_failures += 1
            log.warning("home-row check of %d tasks failed; running them unchecked: %s", len(ids), exc)
            return None

    def _skip(self, task: Task, home: HomeStatus | None) -> bool:
        """Whether the home row says this attempt must not run (see the module docstring)."""
        if home is None:
            return False
        attempt = task.attempt
        stats = self._stats
        if home.status is TaskStatus.CANCELLED:
            stats.skipped_cancelled += 1
            stats.count("skipped_cancelled", task)
        elif home.status.finished:
            stats.skipped_finished += 1
            stats.count("skipped_finished", task)
        elif home.status_attempt > attempt or (home.status_attempt == attempt and home.status is TaskStatus.FAILED):
            stats.skipped_superseded += 1
            stats.count("skipped_superseded", task)
        else:
            return False
        if self.visible is not None:
            self.visible.skipped(task, cancelled=home.status is TaskStatus.CANCELLED)
        return True

    # From a buffer to a start.

    def next_chunk(self, size: int, counts: Mapping[int, int], chunkable: Callable[[Job], bool],
                   recheck: list[Job]) -> list[Job]:
        """Up to `size` jobs to start together, in weighted order: a run of `chunkable`
        jobs, or one job that must run alone (one that is not chunkable and comes after
        others is put back, and its topic goes first next time). Jobs whose shard's
        cancel count is no longer `counts`' are moved to `recheck` instead."""
        buffers = self._buffers
        served = self._stats.served
        chunk: list[Job] = []
        while len(chunk) < size:
            name, self._owed = (self._owed, None) if self._owed and buffers[self._owed] else (
                self._serving.pick(lambda topic: bool(buffers[topic])), None)
            if name is None:
                break
            job = buffers[name].popleft()
            if counts.get(job.shard, 0) != job.mark_seen:  # a cancel in its shard since it was placed
                recheck.append(job)
                continue
            if not chunkable(job):
                if chunk:  # it runs alone, first thing next time round: its pick stands
                    buffers[name].appendleft(job)
                    self._owed = name
                    break
                served[name] = served.get(name, 0) + 1
                chunk.append(job)
                break
            served[name] = served.get(name, 0) + 1
            chunk.append(job)
        return chunk

    def recheck(self, jobs: list[Job]) -> None:
        """Send placed jobs back through a required check: their shard had a cancel since."""
        self._stats.cancel_rechecks += len(jobs)
        decoded: Decoded = []
        for job in jobs:
            self.release(job)
            decoded += [(delivery, job.message) for delivery in (job.delivery, *job.followers)]
        self._send_to_check(decoded, [job.message.task.id for job in jobs], self._cancel_watch.marks, True)

    # Flow control and revocations.

    def flow_control(self, consumer: Consumer) -> None:
        """Pause a topic whose buffer is full (resume at half), and every topic while
        too much is in hand: at the checker, or received and not yet settled (a store
        outage must not turn into unbounded memory and handlers running ahead of it).
        Full is `buffer_per_topic` messages, or fewer when messages are large: about
        `buffer_bytes_per_topic` at the mean size received (10 at least)."""
        limit = min(self._buffer_per_topic, max(10, int(self._buffer_bytes_per_topic / self._message_bytes)))
        held = (self.checking >= 4 * self._poll_batch
                or self._commits.outstanding() >= self._max_outstanding)
        for name, buffer in self._buffers.items():
            full = len(buffer) >= limit or (name in self._paused and len(buffer) >= limit // 2)
            want = held or full
            if want and name not in self._paused:
                consumer.pause([self._topics[name]])
                self._paused.add(name)
            elif not want and name in self._paused:
                consumer.resume([self._topics[name]])
                self._paused.discard(name)
        self.paused_view = tuple(sorted(self._paused))

    def revoked(self, partitions: list[TopicPartition]) -> None:
        """Partitions taken away: drop their buffered jobs, and the batches of them at
        the checker when they come back; the next owner receives them."""
        lost = set(partitions)
        for partition in partitions:
            self._first_seen.pop(partition, None)
            self._revoked_count[partition] = self._revoked_count.get(partition, 0) + 1
        for name, buffer in self._buffers.items():
            kept = [job for job in buffer if (job.delivery.topic, job.delivery.partition) not in lost]
            if len(kept) != len(buffer):
                for job in buffer:
                    if (job.delivery.topic, job.delivery.partition) in lost:
                        self.release(job)
                self._buffers[name] = deque(kept)
