"""`Worker`: consumes the ready topics of one pool, runs handlers, settles outcomes.

The worker is an assembly of parts, each in a module of its own, and a main loop that
calls into them:

- `intake`: from a poll to a start: decoding, the home-row check (`CHECKS`), cancels,
  merging repeats, the buffers per topic, the weighted order of starts, flow control;
- `execution`: slots, handler threads, the event loop, each attempt's `Context`,
  chunks, timeouts;
- `outcomes`: what a finished attempt must make durable (a report, the next attempt
  with its backoff, a dead letter), as a plan for the settler;
- `settle`: the settler, which writes the plans and hands their deliveries back;
- `commits`: received and settled offsets, and committing them;
- `fences` (stale fencing tokens, counted and still run), `cancel_watch` (the copy of
  the cancel marks), `stats` (the counters every part writes its own of).

A message's life: polled → checked → buffered → started → finished → settled →
committed. Its offset is committed only once it is settled (`commits`), so a
worker killed at any step loses nothing: the group gives its partitions to another
member, which receives again everything that was not committed.

Threads, and who owns what. One rule: **the main loop owns all the bookkeeping**. Every
other thread works on what it was handed and hands its result back through a queue; the
two background readers (cancel marks, fencing tokens) only replace, one value at a
time, something the main loop reads.

- the **main loop** (`run`) owns the consumer and every part's bookkeeping: intake's
  buffers, active jobs and pauses; execution's slots, running jobs and zombies; the
  commit positions; the fencing tokens (which the fences thread may only raise). It
  hands work on by calling into the parts, and outcomes to the settler with
  `Settler.submit`;
- two **checker** threads (`intake`) read home rows; each checked batch comes back on
  intake's checked queue (`Intake.take_checked`);
- the **handler threads** (`concurrency` of them) and one **event loop** thread
  (`execution`) run handlers, at most `concurrency` at a time; each result comes back
  on the completions queue (`Execution.collect`);
- the **settler** and its **completions** thread (`settle`) write the plans and tell
  the shards' owners which attempts finished; settled deliveries come back on the
  settled queue (`Commits.take_settled`);
- the **cancel-marks** thread (`cancel_watch`) reads the marks every 200 ms and
  replaces `CancelWatch.marks` whole; a short-lived **fences** thread (`fences`) reads
  the shards' tokens now and then and raises a shard's token in place.

No locks: the queues are `queue.SimpleQueue`, and what other threads read without one
(the counters, `Execution.running`, `Intake.paused_view`, the marks, a shard's token)
is replaced or bumped one value at a time, so a reader sees it a moment old at worst.
The consumer calls `_revoked` from inside `poll`, so on the main loop too. `stop()` (any
thread, or `Execution.expire` when every slot is stuck) sets an event read by the main
loop, the checker (a required check stops retrying) and the handler threads (a chunk's
jobs not yet begun are skipped); `snapshot()` reads from the stats file's thread.

One turn of the main loop: place what the checker returned; poll (never skipped: a
member that stops polling loses its partitions) and admit the batch; start buffered jobs
in free slots (`_start_ready`: nothing starts while the copy of the cancel marks is too
old); settle what finished or timed out; take what the settler made durable; pause or
resume topics; commit; refresh the fencing tokens. A job is released from intake's
active set once its outcome is planned, so a later copy of the attempt may run again.

Stale fencing tokens: a message fired under an older shard lease than the current one is
counted (`stale_fence`) and run anyway, for the reason given in `fences`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from scheduler.errors import SchedulerError
from scheduler.ports import Consumer, CountStore, EffectLedger, Handoff, Publisher, TaskStore, TopicPartition
from scheduler.ports.workflows import WorkflowStore
from scheduler.producer import Client
from scheduler.visibility.labels import TypeLabels
from scheduler.worker.app import App
from scheduler.worker.cancel_watch import CancelWatch
from scheduler.worker.commits import Commits
from scheduler.worker.execution import CHUNK_MAX, RUNNING_REPORT_AFTER_S, Execution
from scheduler.worker.fences import Fences
from scheduler.worker.intake import CHECKS as CHECKS  # re-exported: the CLI's choices of --check
from scheduler.worker.intake import Intake
from scheduler.worker.job import Job
from scheduler.worker.outcomes import Outcomes
from scheduler.worker.serving import DEFAULT_WEIGHTS
from scheduler.worker.settle import Settler, SettlerStats
from scheduler.worker.stats import WorkerStats, wall_clock_ms
from scheduler.worker.visible import WorkerVisibility
from scheduler.workflows.engine import Workflows

log = logging.getLogger(__name__)

LEAVE_S = 10.0
"""After a stop's drain timeout, the most a worker process spends settling, committing,
leaving its group and writing its last counts before it exits regardless
(`scheduler worker` enforces it): those wait on servers, and a broker or store that
does not answer must not hold a stopping worker for ever. What it leaves uncommitted is
delivered again to the other workers, as after a kill."""

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
    poll_batch: int = 5000
    buffer_per_topic: int = 20_000
    """Buffered messages of one topic above which its partitions are paused (resumed at
    half). Pausing drops what the consumer had fetched ahead, so after a resume the
    partitions are fetched again from the broker: what is left buffered must last that
    long. Half of 20,000 is half a second at 20,000 tasks a second; with 4,000 (and polls
    of 2,000) a worker with a backlog sat waiting on those fetches, at ~8,000 a second."""
    buffer_bytes_per_topic: int = 32 << 20
    """The same bound in bytes (at the mean message size received), so that large
    payloads do not multiply the memory a full buffer holds."""
    max_outstanding: int = 120_000
    """Messages received and not yet settled above which every topic is paused: above
    what four full buffers and the checker's share hold (4 x 20,000 + 4 x 5,000), so
    that it pauses only when settling falls behind (a store outage), not in a backlog."""
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
    lag_interval_s: float = 2.0
    """How often the main loop asks the consumer for its lag (`WorkerStats.consumer_lag`)."""
    running_report_after_s: float = RUNNING_REPORT_AFTER_S
    """How long a first attempt runs before `running` is written (`execution.RUNNING_REPORT_AFTER_S`)."""


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
        counts: CountStore | None = None,
        workflows: WorkflowStore | None = None,
    ) -> None:
        if config.concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, got {config.concurrency}")
        self.app = app
        self.config = config
        self.stats = WorkerStats(served=dict.fromkeys(config.topics, 0), types=TypeLabels(fixed=app.types()))
        self._consumer_factory = consumer_factory
        self._consumer: Consumer | None = None
        self._stop = threading.Event()
        self._stopped = threading.Event()
        self.abandoned = 0
        """Handlers still running when `run` returned (past the drain timeout)."""
        self._lag_read_at = 0.0
        self._short_names = {topic: name for name, topic in config.topics.items()}
        self.cancel_watch = CancelWatch(store)
        self._commits = Commits(self.stats, interval_s=config.commit_interval_s)
        self.visible = None if counts is None else WorkerVisibility(
            counts, config.member, running=lambda: self._execution.running, start_lateness=self.stats.start_lateness,
            detail=self._detail)
        self.workflows = None if workflows is None else Workflows(
            workflows, Client(store, handoff=handoff, events=None if self.visible is None else self.visible.events))
        """Steps of workflows: checked before they start, followed when they end."""
        self._settler = Settler(
            store=store, handoff=handoff, publisher=publisher, dead_letter_topic=config.dead_letter_topic,
            on_settled=self._commits.settled, clock_ms=clock_ms,
            on_steps=None if self.workflows is None else self.workflows.ended_many,
        )
        self._outcomes = Outcomes(self.stats, self._settler.submit, clock_ms, member=config.member)
        self._fences = Fences(store, self.stats, shard_count=config.shard_count, refresh_s=config.fence_refresh_s)
        self._intake = Intake(
            app, self.stats, topics=config.topics, weights=config.weights, store=store,
            cancel_watch=self.cancel_watch, fences=self._fences, commits=self._commits, outcomes=self._outcomes,
            stop=self._stop, clock_ms=clock_ms, shard_count=config.shard_count, check=config.check,
            suspect_window_s=config.suspect_window_s, poll_batch=config.poll_batch,
            buffer_per_topic=config.buffer_per_topic, max_outstanding=config.max_outstanding,
            buffer_bytes_per_topic=config.buffer_bytes_per_topic,
        )
        self._execution = Execution(self.stats, concurrency=config.concurrency, member=config.member, ledger=ledger,
                                    settle=self._settler.submit, stop=self._stop, on_started=on_started,
                                    clock_ms=clock_ms, workflows=self.workflows,
                                    running_report_after_s=config.running_report_after_s,
                                    may_start=lambda job: self.cancel_watch.allows(job.shard, job.mark_seen),
                                    retention_s=store.retention_s)
        self._intake.visible = self._outcomes.visible = self._execution.visible = self.visible

    # Control.

    def stop(self) -> None:
        """Ask the worker to finish in-flight work, commit and leave (from any thread)."""
        self._stop.set()

    def wait_stopped(self, timeout_s: float) -> bool:
        return self._stopped.wait(timeout_s)

    @property
    def settler_stats(self) -> SettlerStats:
        return self._settler.stats

    def running(self) -> int:
        """Attempts running now (from any thread: a moment old at worst)."""
        return len(self._execution.running)

    def buffered_by_topic(self) -> dict[str, int]:
        """Jobs waiting for a slot, by topic short name (from any thread, as `running`)."""
        return self._intake.buffered_by_topic()

    def snapshot(self) -> dict[str, Any]:
        stats = self.stats.document()
        stats["settler"] = dict(vars(self._settler.stats))
        stats["running"] = len(self._execution.running)
        stats["zombies"] = self._execution.zombies
        stats["buffered"] = self._intake.buffered_by_topic()
        stats["paused"] = list(self._intake.paused_view)
        return stats

    def _detail(self) -> dict[str, object]:
        """What the worker reports of itself at each count write (a look from that thread)."""
        return {"member": self.config.member, "topics": list(self.config.topics),
                "buffered": sum(self._intake.buffered_by_topic().values()), "started": self.stats.started,
                "done": self.stats.done}

    def run(self) -> None:
        if self.visible is not None:
            self.visible.start()
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
                self._intake.close()
                self.cancel_watch.stop()
                self._execution.close()
                if self.visible is not None:
                    self.visible.stop()
                self._stopped.set()

    # The main loop.

    def _turn(self, consumer: Consumer) -> None:
        intake, execution = self._intake, self._execution
        intake.take_checked()
        intake.note_assignment(consumer)
        full = execution.busy >= self.config.concurrency
        startable = not full and intake.has_buffered()
        # Poll every turn, even with every topic paused: a member that stops polling
        # is taken for dead and loses its partitions.
        # Full: poll without waiting, then wait on the completions (a freed slot wakes it).
        timeout = 0.0 if startable or full else 0.005 if (intake.checking or execution.running) else 0.1
        deliveries = consumer.poll(self.config.poll_batch, timeout)
        if deliveries:
            intake.admit(deliveries)
        elif full:
            execution.wait_for_completion(0.005)  # a slot frees when a handler finishes: wake then
        self._start_ready()
        self._collect()
        self._commits.take_settled()
        self._expire()
        execution.report_running()
        intake.flow_control(consumer)
        self._commits.maybe_commit(consumer)
        self._fences.maybe_refresh()
        self._read_lag(consumer)

    def _read_lag(self, consumer: Consumer) -> None:
        """Every `lag_interval_s`: the consumer's lag, summed by topic, into the stats."""
        now = time.monotonic()
        if now - self._lag_read_at < self.config.lag_interval_s:
            return
        self._lag_read_at = now
        try:
            by_partition = consumer.lag()
        except SchedulerError as exc:
            self.stats.lag_failures += 1
            log.debug("reading the consumer's lag failed: %s", exc)
            return
        lag = dict.fromkeys(self.config.topics, 0)
        for (topic, _partition), behind in by_partition.items():
            name = self._short_names.get(topic)
            if name is not None:
                lag[name] += behind
        self.stats.consumer_lag = lag

    def _start_ready(self) -> None:
        """Start buffered jobs while slots are free, in weighted order (`Intake.next_chunk`).

        A slot is a handler thread (or an `async` job). Under a backlog, jobs of a fast
        type (recent runs under `CHUNK_BELOW_S` on average) are handed to a thread in
        chunks of up to `CHUNK_MAX`, run one after another: for such a handler the
        hand-off between threads costs more than the handler, and with every slot busy
        anyway the order of starts is the same. Everything else starts alone: jobs of a
        slow or not yet measured type (a chunk would make them wait behind each other
        while other threads idle), jobs with a timeout, and `async` jobs. With a short
        backlog, chunks shrink to one job each.
        """
        intake, execution = self._intake, self._execution
        concurrency = self.config.concurrency
        if execution.busy < concurrency and intake.has_buffered() and not self.cancel_watch.fresh():
            self.stats.waited_for_marks += 1
            return  # a cancel may have been written since: start nothing until the marks are read
        counts = self.cancel_watch.marks.counts
        recheck: list[Job] = []
        while execution.busy < concurrency:
            total = intake.buffered()
            if not total:
                break
            size = min(CHUNK_MAX, max(1, total // (concurrency - execution.busy)))
            chunk = intake.next_chunk(size, counts, execution.chunkable, recheck)
            if not chunk:
                break
            execution.launch(chunk)
        if recheck:
            intake.recheck(recheck)

    def _collect(self) -> None:
        for finished in self._execution.collect():
            if finished.recheck:  # not begun: a cancel may have come since it was placed
                self._intake.recheck([finished.job])
            elif finished.skipped:  # never run, never settled: delivered again to the next owner
                self._intake.release(finished.job)
            else:
                self._settle(finished.job, finished.error, finished.payload_error, finished.result)

    def _expire(self) -> None:
        for job, error in self._execution.expire():
            self._settle(job, error, None)

    def _settle(self, job: Job, error: BaseException | None, payload_error: str | None,
                result: bytes | None = None) -> None:
        self._outcomes.settle(job, error, payload_error, result)
        self._intake.release(job)

    def _revoked(self, partitions: list[TopicPartition]) -> None:
        """Partitions taken away (called inside `poll`): commit what is settled of them,
        drop their buffered messages; their unsettled ones go to the next owner."""
        self.stats.revoked += len(partitions)
        self._commits.revoked(self._consumer, partitions)
        self._intake.revoked(partitions)

    def _drain(self, consumer: Consumer) -> None:
        """Stop starting work, let running handlers finish, settle, commit."""
        intake, execution = self._intake, self._execution
        intake.clear()
        consumer.pause(list(self.config.topics.values()))
        deadline = time.monotonic() + self.config.drain_timeout_s
        while (execution.running or intake.checking) and time.monotonic() < deadline:
            consumer.poll(self.config.poll_batch, 0.05)  # keeps the membership alive
            intake.take_checked()
            self._collect()
            self._expire()
            self._execution.report_running()
            self._commits.take_settled()
        self.abandoned = len(execution.running) + execution.zombies
        if execution.running:
            log.warning("%d handlers still running at the drain timeout; their tasks will be delivered again",
                        len(execution.running))
        self._settler.begin_stop(max(1.0, deadline - time.monotonic()))
        while not self._settler.stopped():
            consumer.poll(self.config.poll_batch, 0.05)
            self._commits.take_settled()
        self._commits.take_settled()
        self._commits.maybe_commit(consumer, force=True)
