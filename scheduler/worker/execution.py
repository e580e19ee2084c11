"""`Execution`: the handlers' side of a worker: slots, handler threads, the event loop,
each attempt's `Context`, and timeouts.

Slots. At most `concurrency` slots are taken at a time; a slot is a handler thread
running a chunk of plain jobs, or one `async` job on the event loop. `launch` takes a
slot and hands the jobs over; the slot is given back when the last job of the chunk
reports (`Finished.frees_slot`).

Chunks. A plain handler of a type whose recent runs averaged under `CHUNK_BELOW_S` (and
that has no timeout) is `chunkable`: the main loop may hand up to `CHUNK_MAX` such jobs
to one thread, run one after another, because for such a handler the hand-off between
threads costs more than the handler. If the worker stops while a chunk runs, the jobs
whose turn has not come are reported `skipped`: never run, never settled, so they are
delivered again to the next owner.

Starts. However long after the main loop's decision a handler's turn comes (behind a
slow job of its chunk, on an event loop another handler blocks, after a step's check),
`may_start` is asked at that moment, on the handler's own thread, and a job it refuses
is not run but handed back (`Finished.recheck`): `scheduler.cancels` gives the rule.

Timeouts. An `async` handler past its timeout is cancelled (`asyncio.timeout`) and
reports the `TimeoutError` itself. A plain handler cannot be stopped from outside its
thread: past its timeout (`expire`) the attempt is settled as failed (and retried), the
thread's eventual result is ignored, and its slot stays taken until it returns, so a
stuck handler shows as lost concurrency, never as extra threads. When every slot is held
by such a zombie the worker stops, so that other workers take its partitions.

Threads. Handler threads and the event loop thread only run handlers and put a
`Finished` on the completions queue; they touch no other state. `launch`, `collect` and
`expire` run on the main loop, which alone owns the slots, the running jobs, the
zombies and the measured durations; `collect` and `expire` yield what the main loop must
settle.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import logging
import queue
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from scheduler.model import decode_payload
from scheduler.ports import EffectLedger
from scheduler.retention import DEFAULT_RETENTION_S
from scheduler.worker.app import Handler
from scheduler.worker.context import CLAIM_S, Context
from scheduler.worker.job import Job
from scheduler.worker.settle import Plan, running_report
from scheduler.worker.stats import WorkerStats, wall_clock_ms
from scheduler.worker.visible import WorkerVisibility
from scheduler.workflows import steps
from scheduler.workflows.engine import Workflows

log = logging.getLogger("scheduler.worker.runtime")  # the worker logs under one name, whichever part writes

RUNNING_REPORT_AFTER_S = 1.0
"""How long an attempt runs before its `running` status is written. Most attempts end
sooner and write only how they ended: one status write instead of two, which is where
most of the store's work per task went. `get` shows such an attempt as not yet started
(or, for a retry, as its previous attempt's `failed`) until then (the counts of
`scheduler status` are the worker's own, and the store orders reports by
`report_order` whether or not `running` was written: a cancel outranks every attempt,
reported or not). 0 writes `running` at every start."""

CHUNK_BELOW_S = 0.001
"""Plain handlers of a type whose recent runs averaged less than this are started in
chunks; slower ones, one per thread."""


CHUNK_MAX = 16
"""Most plain jobs handed to one handler thread at once (see `Worker._start_ready`)."""


@dataclass(slots=True)
class Finished:
    job: Job
    error: BaseException | None
    payload_error: str | None = None
    context: Context | None = None
    frees_slot: bool = True
    """The last job of its chunk (or a job run alone): its thread is free again."""
    skipped: bool = False
    """Not run: the worker was stopping before the job's turn in its chunk came."""
    recheck: bool = False
    """Not run: when its turn came, `may_start` said no (a cancel may concern it); it
    goes back through the home-row check."""
    duration_s: float | None = None
    result: bytes | None = None
    """A workflow step's result, encoded (`scheduler.workflows.steps`); None otherwise."""


class Execution:
    def __init__(self, stats: WorkerStats, *, concurrency: int, member: str, ledger: EffectLedger | None,
                 settle: Callable[[Plan], None], stop: threading.Event,
                 on_started: Callable[[Job], None] | None = None,
                 clock_ms: Callable[[], int] = wall_clock_ms, workflows: Workflows | None = None,
                 running_report_after_s: float = RUNNING_REPORT_AFTER_S,
                 may_start: Callable[[Job], bool] | None = None,
                 retention_s: int = DEFAULT_RETENTION_S) -> None:
        self._stats = stats
        self._retention_s = retention_s
        """The store's, for how long `ctx.once` keeps what it records (`Context.retention_s`)."""
        self._may_start = may_start
        """Asked on the handler's own thread (or the event loop) at the moment its handler
        would begin, after everything else that comes first: whether it may still start
        (`scheduler.cancels`). None: always."""
        self._running_report_after_s = running_report_after_s
        self._unreported: deque[Job] = deque()
        """Started jobs in start order whose `running` report is not yet due
        (`report_running`)."""
        self._workflows = workflows
        self._clock_ms = clock_ms
        self.concurrency = concurrency
        self._ledger = ledger
        self._settle = settle
        self._stop = stop
        self._on_started = on_started
        self.visible: WorkerVisibility | None = None
        """Told of every attempt started (`scheduler status`)."""
        self.busy = 0
        """Slots in use: handler threads running a chunk, and `async` jobs."""
        self.running: dict[Job, None] = {}
        self.zombies = 0
        """Plain handlers still running past their timeout (their attempts are settled)."""
        self._durations: dict[str, float] = {}
        """Recent mean handler time by task type (seconds), for chunking."""
        self._completions: queue.SimpleQueue[Finished] = queue.SimpleQueue()
        self._early: list[Finished] = []
        self._executor = concurrent.futures.ThreadPoolExecutor(concurrency, thread_name_prefix="handler")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._instance = f"{member}-{uuid.uuid4().hex[:8]}"
        """This process's name in effect claims: unique even if two share a member name."""

    def start(self, handlers: Iterable[Handler]) -> None:
        if any(handler.is_async for handler in handlers):
            self._start_loop()

    def close(self) -> None:
        """Start no more handlers; stop the event loop (a plain handler thread that is
        still running cannot be stopped, and is left to finish)."""
        self._executor.shutdown(wait=False, cancel_futures=True)
        self._stop_loop()

    def chunkable(self, job: Job) -> bool:
        handler = job.handler
        return (not handler.is_async and handler.policy.timeout_s is None
                and self._durations.get(handler.type, CHUNK_BELOW_S) < CHUNK_BELOW_S)

    def launch(self, jobs: list[Job]) -> None:
        """Take a slot and start the jobs in it: a chunk of plain jobs, or one job."""
        now = time.monotonic()
        wall = self._clock_ms()
        self._stats.start_lateness.add_elapsed(wall, [job.message.task.run_at_ms for job in jobs])
        calls = []
        for job in jobs:
            task = job.message.task
            timeout = job.handler.policy.timeout_s
            job.started_at = now
            job.started_ms = wall
            job.deadline = None if timeout is None else now + timeout
            self.running[job] = None
            if self._on_started is not None:
                self._on_started(job)
            if self._running_report_after_s <= 0:
                self._settle(Plan(None, report=running_report(task)))
            else:
                self._unreported.append(job)
            context = Context(task, job.message.fence, self._ledger, claim_s=(timeout or CLAIM_S) + 5.0,
                              worker=self._instance, retention_s=self._retention_s)
            context.workflow = steps.step_context(self._workflows, task)
            calls.append((job, context))
        self._stats.started += len(jobs)
        if self.visible is not None:
            self.visible.started(jobs)
        self._stats.launches += 1
        self.busy += 1
        if jobs[0].handler.is_async:
            if self._loop is None:
                self._start_loop()
            assert self._loop is not None
            asyncio.run_coroutine_threadsafe(self._call_async(*calls[0]), self._loop)
        else:
            self._executor.submit(self._call, calls)

    def wait_for_completion(self, timeout_s: float) -> None:
        """Block until a handler finishes (a slot frees), at most `timeout_s`."""
        try:
            self._early.append(self._completions.get(timeout=timeout_s))
        except queue.Empty:
            pass

    def collect(self) -> Iterator[Finished]:
        """The jobs that finished since the last call, each once, freeing their slots:
        to settle, or (`skipped`) to forget. A zombie's late return only frees its slot."""
        while True:
            if self._early:
                finished = self._early.pop()
            else:
                try:
                    finished = self._completions.get_nowait()
                except queue.Empty:
                    return
            job = finished.job
            if finished.frees_slot:
                self.busy -= 1
            if job.finished:  # a plain handler returning after its timeout was settled
                self.zombies -= 1
                continue
            job.finished = True
            del self.running[job]
            if finished.skipped or finished.recheck:
                self._stats.started -= 1
                if self.visible is not None:
                    self.visible.unstarted(job)
                yield finished
                continue
            if finished.duration_s is not None:
                held = self._durations.get(job.handler.type)
                self._durations[job.handler.type] = finished.duration_s if held is None \
                    else 0.8 * held + 0.2 * finished.duration_s
            if finished.context is not None:
                self._stats.effects_run += finished.context.effects_run
                self._stats.effects_skipped += finished.context.effects_skipped
            yield finished

    def report_running(self) -> None:
        """Report `running` for the jobs started `running_report_after_s` ago or more
        that have not finished, and forget the finished ones. Start order is deadline
        order, so no job is looked at twice, nor held long after it finished."""
        due = time.monotonic() - self._running_report_after_s
        unreported = self._unreported
        while unreported and (unreported[0].finished or unreported[0].started_at <= due):
            job = unreported.popleft()
            if not job.finished:
                self._settle(Plan(None, report=running_report(job.message.task)))

    def expire(self) -> Iterator[tuple[Job, TimeoutError]]:
        """Plain jobs past their timeout, each once, with the error to settle them by;
        they become zombies until their threads return."""
        now = time.monotonic()
        for job in [job for job in self.running if job.deadline is not None and now > job.deadline]:
            if job.handler.is_async:
                continue  # asyncio.timeout cancels it and it reports the timeout itself
            job.finished = True
            del self.running[job]
            self.zombies += 1
            self._stats.timed_out += 1
            if self.zombies >= self.concurrency:
                self._stats.stuck += 1
                log.error("every handler thread is stuck past its timeout; stopping so that other workers "
                          "take this worker's partitions")
                self._stop.set()
            yield job, TimeoutError(f"handler ran past its {job.handler.policy.timeout_s} s timeout")

    def _call(self, calls: list[tuple[Job, Context]]) -> None:
        """On a handler thread: run each job of the chunk in turn."""
        last = len(calls) - 1
        for n, (job, context) in enumerate(calls):
            if n and self._stop.is_set():
                self._completions.put(Finished(job, None, frees_slot=n == last, skipped=True))
                continue
            self._completions.put(self._run_one(job, context, frees_slot=n == last))

    def _run_one(self, job: Job, context: Context, *, frees_slot: bool) -> Finished:
        try:
            payload = decode_payload(job.message.task.payload)
        except Exception as exc:  # a payload msgpack cannot read: no handler could
            return Finished(job, exc, payload_error=f"payload cannot be decoded: {exc}", frees_slot=frees_slot)
        began = time.perf_counter()
        encoded = None
        try:
            if context.workflow is not None:
                start = steps.before(context.workflow.workflows, job.message.task)
                if start.done:  # the member ended before (its message is delivered again)
                    return Finished(job, None, context=context, frees_slot=frees_slot, result=start.result)
            if self._may_start is not None and not self._may_start(job):
                return Finished(job, None, frees_slot=frees_slot, recheck=True)
            result = job.handler.function(context, payload)
            if inspect.isawaitable(result):  # an async handler behind a plain wrapper
                result = asyncio.run(_awaited(result))
            if context.workflow is not None:
                encoded = steps.encode_result(result)
        except BaseException as exc:  # a handler's failure is an outcome, never the worker's
            return Finished(job, exc, context=context, frees_slot=frees_slot,
                            duration_s=time.perf_counter() - began)
        return Finished(job, None, context=context, frees_slot=frees_slot, duration_s=time.perf_counter() - began,
                        result=encoded)

    async def _call_async(self, job: Job, context: Context) -> None:
        try:
            payload = decode_payload(job.message.task.payload)
        except Exception as exc:
            self._completions.put(Finished(job, exc, payload_error=f"payload cannot be decoded: {exc}"))
            return
        encoded = None
        try:
            if context.workflow is not None:
                start = await steps.before_async(context.workflow.workflows, job.message.task)
                if start.done:
                    self._completions.put(Finished(job, None, context=context, result=start.result))
                    return
            if self._may_start is not None and not self._may_start(job):
                self._completions.put(Finished(job, None, recheck=True))
                return
            # Awaited here, not through `wait_for`: that would make the handler a task of
            # its own, begun only on a later turn of the loop, which a handler blocking
            # the loop can delay past what `may_start` answered for.
            async with asyncio.timeout(job.handler.policy.timeout_s):
                result = await job.handler.function(context, payload)
            if context.workflow is not None:
                encoded = steps.encode_result(result)
        except BaseException as exc:
            self._completions.put(Finished(job, exc, context=context))
            return
        self._completions.put(Finished(job, None, context=context, result=encoded))

    def _start_loop(self) -> None:
        loop = self._loop = asyncio.new_event_loop()
        self._loop_thread = threading.Thread(target=loop.run_forever, name="handler-loop", daemon=True)
        self._loop_thread.start()

    def _stop_loop(self) -> None:
        loop = self._loop
        if loop is None:
            return
        loop.call_soon_threadsafe(loop.stop)
        self._loop_thread.join(5)
        if not self._loop_thread.is_alive():
            loop.close()


async def _awaited(awaitable: Any) -> Any:
    return await awaitable
