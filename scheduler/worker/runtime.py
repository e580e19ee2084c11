"""`Worker`: consumes the ready topics of one pool, runs handlers, settles outcomes.

Threads, and who owns what:

- the **main loop** (`run`) owns the consumer and every piece of bookkeeping: it polls,
  decodes, checks each polled batch against the tasks' home rows, buffers runnable
  tasks per topic, starts them in weighted order (`serving.WeightedServing`), turns
  finished handlers into plans for the settler, and commits positions;
- **handler threads** (a pool of `concurrency`) run plain handlers, and one **event
  loop** thread runs `async def` handlers; together at most `concurrency` at a time;
- the **settler** (`settle.Settler`) makes outcomes durable and hands them back.

A message's life: polled → checked → buffered → started → finished → settled →
committed. Its offset is committed only once it is settled (`progress.Progress`), so a
worker killed at any step loses nothing: the group gives its partitions to another
member, which receives again everything that was not committed.

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
  or a re-fire); and messages with a stale fencing token. A fresh first attempt on a
  steady partition is run without a read: at 9:00 that read would be one more store
  request per task for nothing, since such a message is almost never a repeat, and
  `ctx.once` still guards its effects if it is. The cost: a cancel that lands in the
  second between a task's firing and its start may not stop it (a cancel never stops a
  running attempt either);
- `always` checks every message; `never` none.

Cancels are definite whatever `check` says (`scheduler.cancels`): a `CancelWatch`
keeps the store's cancel marks, read every 200 ms. A message whose shard was marked
within a few minutes of its task's time is checked before it is placed, and the check
is then required (if it fails it is tried again, never skipped); a placed message whose
shard's mark moved since is checked again before it starts; and nothing starts while
the copy of the marks is older than `cancels.MAX_AGE_MS`.

Stale fencing tokens: a message fired under an older shard lease than the current one is
counted (`stale_fence`) and run anyway, for the reason given in `fences`.

Timeouts: a handler past its timeout is failed and retried; how, for plain and `async`
handlers, is in `execution`.
"""

from __future__ import annotations

import concurrent.futures
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from scheduler import cancels
from scheduler.errors import InvalidMessage
from scheduler.model import Message, TaskId, decode_message
from scheduler.ports import (
    CancelMarks,
    Consumer,
    Delivery,
    EffectLedger,
    Handoff,
    Publisher,
    StoredTask,
    TaskStatus,
    TaskStore,
    TopicPartition,
)
from scheduler.worker import dead_letters
from scheduler.worker.app import App
from scheduler.worker.cancel_watch import CancelWatch
from scheduler.worker.commits import Commits
from scheduler.worker.execution import CHUNK_MAX, Execution
from scheduler.worker.fences import Fences
from scheduler.worker.job import Job
from scheduler.worker.outcomes import Outcomes
from scheduler.worker.serving import DEFAULT_WEIGHTS, WeightedServing
from scheduler.worker.settle import Settler
from scheduler.worker.stats import WorkerStats, wall_clock_ms

CHECKS = ("suspect", "always", "never")

log = logging.getLogger(__name__)

ConsumerFactory = Callable[[Callable[[list[TopicPartition]], None]], Consumer]
"""Makes the pool's consumer, given the callback for partitions taken away."""


@dataclass(frozen=True)
class WorkerConfig:
    member: str
    pool: str = "default"
    topics: Mapping[str, str] = field(default_factory=dict)
    """Short name (`high`, `normal`, `low`, `long`) -> topic, of the topics this pool reads."""
    dead_letter_topic: str = "scheduler.dead"
    concurrency: int = 8
    poll_batch: int = 2000
    buffer_per_topic: int = 4000
    """Buffered messages of one topic above which its partitions are paused."""
    max_outstanding: int = 50_000
    """Messages received and not yet settled above which every topic is paused."""
    weights: Mapping[str, int] = field(default_factory=lambda: dict(DEFAULT_WEIGHTS))
    commit_interval_s: float = 0.5
    fence_refresh_s: float = 5.0
    drain_timeout_s: float = 30.0
    """On stop: how long in-flight handlers may take to finish before the worker leaves."""
    shard_count: int = 64
    check: str = "suspect"
    """Which messages are checked against their home rows before running: `always`,
    `never`, or `suspect` (see `CHECKS`)."""
    suspect_window_s: float = 30.0


class Worker:
    """Runs one pool's handlers; `run()` blocks until `stop()` (or SIGTERM via the CLI)."""

    def __init__(
        self,
        app: App,
        config: WorkerConfig,
        *,
        consumer_factory: ConsumerFactory,
        store: TaskStore,
        publisher: Publisher,
        handoff: Handoff | None,
        ledger: EffectLedger | None,
        clock_ms: Callable[[], int] = wall_clock_ms,
        on_started: Callable[[Job], None] | None = None,
    ) -> None:
        if config.concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, got {config.concurrency}")
        self.app = app
        self.config = config
        self.stats = WorkerStats(served=dict.fromkeys(config.topics, 0))
        self._consumer_factory = consumer_factory
        self._store = store
        self._clock_ms = clock_ms
        self._short_names = {topic: name for name, topic in config.topics.items()}
        self._buffers: dict[str, deque[Job]] = {name: deque() for name in config.topics}
        self._paused: set[str] = set()
        self._paused_view: tuple[str, ...] = ()
        self._owed: str | None = None
        """A topic picked whose job was put back to start alone: it goes first next."""
        """A copy of `_paused` for other threads (the stats writer)."""
        self._serving = WeightedServing({name: config.weights.get(name, 1) for name in config.topics})
        self._commits = Commits(self.stats, interval_s=config.commit_interval_s)
        self._active: dict[tuple[TaskId, int], Job] = {}
        """Jobs buffered or running, by (task, attempt)."""
        self._checker = concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="checker")
        self._checked: queue.SimpleQueue[tuple[list[tuple[Delivery, Message]], dict[TaskId, StoredTask] | None,
                                               dict[TopicPartition, int], CancelMarks]] = queue.SimpleQueue()
        self.cancel_watch = CancelWatch(store)
        self._checking = 0
        self._revoked_count: dict[TopicPartition, int] = {}
        self._first_seen: dict[TopicPartition, float] = {}
        """When each partition was assigned to this worker (monotonic)."""
        self._assignment_read_at = 0.0
        self._fences = Fences(store, self.stats, shard_count=config.shard_count, refresh_s=config.fence_refresh_s)
        self._stop = threading.Event()
        self._stopped = threading.Event()
        self._settler = Settler(
            store=store, handoff=handoff, publisher=publisher, dead_letter_topic=config.dead_letter_topic,
            on_settled=self._commits.settled, clock_ms=clock_ms,
        )
        self._outcomes = Outcomes(self.stats, self._settler.submit, clock_ms)
        self._execution = Execution(self.stats, concurrency=config.concurrency, member=config.member, ledger=ledger,
                                    settle=self._settler.submit, stop=self._stop, on_started=on_started)
        self._consumer: Consumer | None = None
        self.abandoned = 0
        """Handlers still running when `run` returned (past the drain timeout)."""

    # Control.

    def stop(self) -> None:
        """Ask the worker to finish in-flight work, commit and leave (from any thread)."""
        self._stop.set()

    def wait_stopped(self, timeout_s: float) -> bool:
        return self._stopped.wait(timeout_s)

    def snapshot(self) -> dict[str, Any]:
        stats = {k: v for k, v in vars(self.stats).items()}
        stats["settler"] = dict(vars(self._settler.stats))
        stats["running"] = len(self._execution.running)
        stats["zombies"] = self._execution.zombies
        stats["buffered"] = {name: len(buffer) for name, buffer in self._buffers.items()}
        stats["paused"] = list(self._paused_view)
        return stats

    def run(self) -> None:
        self.cancel_watch.read_once()  # before the first poll: starts wait for it anyway
        self.cancel_watch.start()
        self._settler.start()
        self._execution.start(self.app.handlers())
        consumer = self._consumer = self._consumer_factory(self._revoked)
        try:
            while not self._stop.is_set():
                self._turn(consumer)
            self._drain(consumer)
        except BaseException:
            # A bug or a fatal queue error: keep what is already settled, then fail loudly.
            self.abandoned = len(self._execution.running) + self._execution.zombies
            try:
                self._commits.take_settled()
                self._commits.maybe_commit(consumer, force=True)
            except BaseException:
                log.exception("committing the settled positions on the way out failed as well")
            raise
        finally:
            try:
                consumer.close()
            finally:
                self._checker.shutdown(wait=False, cancel_futures=True)
                self.cancel_watch.stop()
                self._execution.close()
                self._stopped.set()

    # The main loop.

    def _turn(self, consumer: Consumer) -> None:
        self._take_checked()
        self._note_assignment(consumer)
        full = self._execution.busy >= self.config.concurrency
        startable = not full and any(self._buffers.values())
        # Poll every turn, even with every topic paused: a member that stops polling
        # is taken for dead and loses its partitions.
        # Full: poll without waiting, then wait on the completions (a freed slot wakes it).
        timeout = 0.0 if startable or full else 0.005 if (self._checking or self._execution.running) else 0.1
        deliveries = consumer.poll(self.config.poll_batch, timeout)
        if deliveries:
            self._admit(deliveries)
        elif full:
            self._execution.wait_for_completion(0.005)  # a slot frees when a handler finishes: wake then
        self._start_ready()
        self._collect()
        self._commits.take_settled()
        self._expire()
        self._flow_control(consumer)
        self._commits.maybe_commit(consumer)
        self._fences.maybe_refresh()

    def _note_assignment(self, consumer: Consumer) -> None:
        """Record when each partition was assigned to this worker (at most every 0.1 s):
        the start of its window of suspect messages."""
        now = time.monotonic()
        if now - self._assignment_read_at < 0.1:
            return
        self._assignment_read_at = now
        for partition in consumer.assignment():
            self._first_seen.setdefault(partition, now)

    def _admit(self, deliveries: list[Delivery]) -> None:
        self.stats.received += len(deliveries)
        decoded: list[tuple[Delivery, Message]] = []
        for delivery in deliveries:
            self._commits.received(delivery)
            try:
                decoded.append((delivery, decode_message(delivery.value)))
            except InvalidMessage as exc:
                self.stats.undecodable += 1
                self._outcomes.dead(delivery, None, dead_letters.UNDECODABLE, str(exc))
        marks = self.cancel_watch.marks
        shard_count = self.config.shard_count
        suspects: list[TaskId] = []
        required = False
        for delivery, message in decoded:
            self._fences.note(message)
            task = message.task
            if cancels.needs_check(marks.at.get(task.id.shard(shard_count)), task.run_at_ms):
                self.stats.cancel_checks += 1
                required = True
                suspects.append(task.id)
            elif self._suspect(delivery, message):
                suspects.append(task.id)
        if not suspects:
            self._place(decoded, {}, marks)
            return
        self._send_to_check(decoded, suspects, marks, required)

    def _send_to_check(self, decoded: list[tuple[Delivery, Message]], suspects: list[TaskId], marks: CancelMarks,
                       required: bool) -> None:
        # The check is store I/O: it runs on the checker thread, so the main loop goes on
        # starting and settling work meanwhile. A batch whose partitions are revoked
        # before it returns is dropped (`_revoked_count`): the next owner has it.
        self._checking += len(decoded)
        revocations = {p: self._revoked_count.get(p, 0) for p in {(d.topic, d.partition) for d, _ in decoded}}
        self._checker.submit(self._check, decoded, suspects, revocations, marks, required)

    def _check(self, decoded: list[tuple[Delivery, Message]], suspects: list[TaskId],
               revocations: dict[TopicPartition, int], marks: CancelMarks, required: bool = False) -> None:
        """On the checker thread; whatever happens, the batch goes back to the main loop.
        A `required` check (a cancel may concern the batch) is tried until it succeeds or
        the worker stops; another runs unchecked if it fails."""
        homes: dict[TaskId, StoredTask] | None = None
        delay = 0.1
        try:
            homes = self._homes(suspects)
            while homes is None and required and not self._stop.wait(delay):
                delay = min(delay * 2, 2.0)
                homes = self._homes(suspects)
        finally:  # stopping with a required check undone: `_take_checked` drops the batch
            self._checked.put((decoded, homes, revocations, marks))

    def _take_checked(self) -> None:
        while True:
            try:
                decoded, homes, revocations, marks = self._checked.get_nowait()
            except queue.Empty:
                return
            self._checking -= len(decoded)
            if self._stop.is_set():
                continue  # draining: never started, so delivered again to the next owner
            kept = [(d, m) for d, m in decoded
                    if self._revoked_count.get((d.topic, d.partition), 0) == revocations[(d.topic, d.partition)]]
            self._place(kept, homes, marks)

    def _place(self, decoded: list[tuple[Delivery, Message]], homes: dict[TaskId, StoredTask] | None,
               marks: CancelMarks) -> None:
        """Skip what the home rows say must not run; buffer the rest by topic, each with
        its shard's cancel count as `marks` had it."""
        shard_count = self.config.shard_count
        for delivery, message in decoded:
            task = message.task
            if homes is not None and self._skip(task.attempt, homes.get(task.id)):
                self._commits.settle(delivery)
                continue
            handler = self.app.lookup(task.type)
            if handler is None:
                self.stats.unknown_type += 1
                self._outcomes.dead(delivery, message, dead_letters.UNKNOWN_TYPE,
                           f"no handler for task type {task.type!r} in app {self.app.name!r}")
                continue
            key = (task.id, task.attempt)
            active = self._active.get(key)
            if active is not None:
                # The same attempt again while this worker still holds it: after a
                # rebalance hands back a partition whose messages were in flight, or a
                # copy a dispatcher published twice. Run it once; settle both.
                active.followers.append(delivery)
                self.stats.merged += 1
                continue
            name = self._short_names.get(delivery.topic, next(iter(self._buffers)))
            shard = task.id.shard(shard_count)
            job = self._active[key] = Job(delivery, message, handler, name, shard=shard,
                                          mark_seen=marks.counts.get(shard, 0))
            self._buffers[name].append(job)

    def _suspect(self, delivery: Delivery, message: Message) -> bool:
        """Whether to check this message against its home row (see `CHECKS`)."""
        check = self.config.check
        if check != "suspect":
            return check == "always"
        partition = (delivery.topic, delivery.partition)
        now = time.monotonic()
        first_seen = self._first_seen.setdefault(partition, now)  # normally set by `_note_assignment`
        return (
            message.task.attempt > 1
            or now - first_seen < self.config.suspect_window_s
            or self._clock_ms() - delivery.timestamp_ms > self.config.suspect_window_s * 1000
            or self._fences.is_stale(message)
        )

    def _homes(self, ids: list[TaskId]) -> dict[TaskId, StoredTask] | None:
        if not ids:
            return {}
        try:
            return self._store.get_many(ids)
        except Exception as exc:  # any failure: run unchecked rather than stall
            self.stats.check_failures += 1
            log.warning("home-row check of %d tasks failed; running them unchecked: %s", len(ids), exc)
            return None

    def _skip(self, attempt: int, home: StoredTask | None) -> bool:
        """Whether the home row says this attempt must not run (see the module docstring)."""
        if home is None:
            return False
        if home.status is TaskStatus.CANCELLED:
            self.stats.skipped_cancelled += 1
            return True
        if home.status.finished:
            self.stats.skipped_finished += 1
            return True
        if home.status_attempt > attempt or (home.status_attempt == attempt and home.status is TaskStatus.FAILED):
            self.stats.skipped_superseded += 1
            return True
        return False

    def _start_ready(self) -> None:
        """Start buffered jobs while slots are free, in weighted order.

        A slot is a handler thread (or an `async` job). Under a backlog, jobs of a fast
        type (recent runs under `CHUNK_BELOW_S` on average) are handed to a thread in
        chunks of up to `CHUNK_MAX`, run one after another: for such a handler the
        hand-off between threads costs more than the handler, and with every slot busy
        anyway the order of starts is the same. Everything else starts alone: jobs of a
        slow or not yet measured type (a chunk would make them wait behind each other
        while other threads idle), jobs with a timeout, and `async` jobs. With a short
        backlog, chunks shrink to one job each.
        """
        buffers = self._buffers
        concurrency = self.config.concurrency
        if self._execution.busy < concurrency and any(buffers.values()) and not self.cancel_watch.fresh():
            self.stats.waited_for_marks += 1
            return  # a cancel may have been written since: start nothing until the marks are read
        counts = self.cancel_watch.marks.counts
        recheck: list[Job] = []
        while self._execution.busy < concurrency:
            total = sum(len(buffer) for buffer in buffers.values())
            if not total:
                break
            size = min(CHUNK_MAX, max(1, total // (concurrency - self._execution.busy)))
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
                if not self._execution.chunkable(job):
                    if chunk:  # it runs alone, first thing next time round: its pick stands
                        buffers[name].appendleft(job)
                        self._owed = name
                        break
                    self.stats.served[name] = self.stats.served.get(name, 0) + 1
                    chunk.append(job)
                    break
                self.stats.served[name] = self.stats.served.get(name, 0) + 1
                chunk.append(job)
            if not chunk:
                break
            self._execution.launch(chunk)
        if recheck:
            self._recheck(recheck)

    def _recheck(self, jobs: list[Job]) -> None:
        """Send placed jobs back through a required check: their shard had a cancel since."""
        self.stats.cancel_rechecks += len(jobs)
        decoded: list[tuple[Delivery, Message]] = []
        for job in jobs:
            self._active.pop((job.message.task.id, job.message.task.attempt), None)
            decoded += [(delivery, job.message) for delivery in (job.delivery, *job.followers)]
        self._send_to_check(decoded, [job.message.task.id for job in jobs], self.cancel_watch.marks, True)

    def _collect(self) -> None:
        for finished in self._execution.collect():
            if finished.skipped:  # never run, never settled: delivered again to the next owner
                self._active.pop((finished.job.message.task.id, finished.job.message.task.attempt), None)
            else:
                self._outcome(finished.job, finished.error, finished.payload_error)

    def _expire(self) -> None:
        for job, error in self._execution.expire():
            self._outcome(job, error, None)

    def _outcome(self, job: Job, error: BaseException | None, payload_error: str | None) -> None:
        self._outcomes.settle(job, error, payload_error)
        self._active.pop((job.message.task.id, job.message.task.attempt), None)

    def _flow_control(self, consumer: Consumer) -> None:
        """Pause a topic whose buffer is full (resume at half), and every topic while
        too much is in hand: at the checker, or received and not yet settled (a store
        outage must not turn into unbounded memory and handlers running ahead of it)."""
        limit = self.config.buffer_per_topic
        held = (self._checking >= 4 * self.config.poll_batch
                or self._commits.outstanding() >= self.config.max_outstanding)
        for name, buffer in self._buffers.items():
            full = len(buffer) >= limit or (name in self._paused and len(buffer) >= limit // 2)
            want = held or full
            if want and name not in self._paused:
                consumer.pause([self.config.topics[name]])
                self._paused.add(name)
            elif not want and name in self._paused:
                consumer.resume([self.config.topics[name]])
                self._paused.discard(name)
        self._paused_view = tuple(sorted(self._paused))

    def _revoked(self, partitions: list[TopicPartition]) -> None:
        """Partitions taken away (called inside `poll`): commit what is settled of them,
        drop their buffered messages; their unsettled ones go to the next owner."""
        self.stats.revoked += len(partitions)
        self._commits.revoked(self._consumer, partitions)
        lost = set(partitions)
        for partition in partitions:
            self._first_seen.pop(partition, None)
            self._revoked_count[partition] = self._revoked_count.get(partition, 0) + 1
        for name, buffer in self._buffers.items():
            kept = [job for job in buffer if (job.delivery.topic, job.delivery.partition) not in lost]
            if len(kept) != len(buffer):
                for job in buffer:
                    if (job.delivery.topic, job.delivery.partition) in lost:
                        self._active.pop((job.message.task.id, job.message.task.attempt), None)
                self._buffers[name] = deque(kept)

    def _drain(self, consumer: Consumer) -> None:
        """Stop starting work, let running handlers finish, settle, commit."""
        for name in self._buffers:
            self._buffers[name].clear()  # never started: the next owner receives them
        consumer.pause(list(self.config.topics.values()))
        deadline = time.monotonic() + self.config.drain_timeout_s
        while (self._execution.running or self._checking) and time.monotonic() < deadline:
            consumer.poll(self.config.poll_batch, 0.05)  # keeps the membership alive
            self._take_checked()
            self._collect()
            self._expire()
            self._commits.take_settled()
        self.abandoned = len(self._execution.running) + self._execution.zombies
        if self._execution.running:
            log.warning("%d handlers still running at the drain timeout; their tasks will be delivered again",
                        len(self._execution.running))
        self._settler.begin_stop(max(1.0, deadline - time.monotonic()))
        while not self._settler.stopped():
            consumer.poll(self.config.poll_batch, 0.05)
            self._commits.take_settled()
        self._commits.take_settled()
        self._commits.maybe_commit(consumer, force=True)


async def _awaited(awaitable: Any) -> Any:
    return await awaitable
