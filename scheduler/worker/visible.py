"""The worker's part in `scheduler status`: it counts the attempts it starts, how they
end (`done`, `retried`, `dead`) and the messages it skips, measures how late handlers
start (start - run_at), and reports what it is running by tenant and type.

The main loop calls in (`started` once per chunk, the others once per message: a lock
and a dict update); the count writer's thread writes it all every two seconds and reads
the running jobs as a look (`scheduler.visibility.writer`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Sequence

from scheduler.model import Task
from scheduler.ports import CountStore
from scheduler.visibility.counts import Pair
from scheduler.visibility.histogram import LatencyHistogram
from scheduler.visibility.writer import DEFAULT_INTERVAL_S, CountWriter, Gauges, new_writer_id
from scheduler.worker.job import Job


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


class WorkerVisibility:
    def __init__(self, store: CountStore, member: str, *, running: Callable[[], Collection[Job]],
                 start_lateness: LatencyHistogram, detail: Callable[[], dict[str, object]] | None = None,
                 interval_s: float = DEFAULT_INTERVAL_S, clock_ms: Callable[[], int] = wall_ms) -> None:
        """`start_lateness`: the worker's own (`WorkerStats.start_lateness`), which the
        execution adds each launch to."""
        self.start_lateness = start_lateness
        self._running = running
        self._detail = detail
        self._clock = clock_ms
        self.writer = CountWriter(store, "worker", writer=new_writer_id(f"worker-{member}"), gauges=self._gauges,
                                  lateness={"start": lambda: self.start_lateness}, interval_s=interval_s,
                                  clock_ms=clock_ms)
        self.events = self.writer.counter

    def start(self) -> None:
        self.writer.start()

    def stop(self) -> None:
        self.writer.stop()

    def started(self, jobs: Sequence[Job]) -> None:
        for job in jobs:
            task = job.message.task
            self.events.add("started", task.tenant, task.type)

    def unstarted(self, job: Job) -> None:
        """A job told `started` whose handler never began (`execution.Finished.skipped`
        or `recheck`)."""
        task = job.message.task
        self.events.add("started", task.tenant, task.type, -1)

    def ended(self, event: str, task: Task) -> None:
        """`done`, `retried` or `dead`."""
        self.events.add(event, task.tenant, task.type)

    def skipped(self, task: Task, *, cancelled: bool) -> None:
        self.events.add("skipped_cancelled" if cancelled else "skipped", task.tenant, task.type)

    def _gauges(self) -> Gauges:
        running: dict[Pair, int] = {}
        for job in list(self._running()):
            task = job.message.task
            pair = (task.tenant, task.type)
            running[pair] = running.get(pair, 0) + 1
        return Gauges(running=running, detail=self._detail() if self._detail is not None else {})
