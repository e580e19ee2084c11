"""The write-paths scenario (`bench/writes`) run on one test's deployment by real
`scheduler dispatcher` and `scheduler worker` processes, and what the tests hold it to;
the same for the embedded backend and the real servers.

`check_write_paths`: a task written through each path (`bench.writes.scenario.PATHS`) at
each due offset from 60 s ago to 5 s ahead, and a schedule's next slot, each

- runs: its handler starts (at least once: a repeat is allowed, and reported);
- never early: neither its first handler start nor any publish of it in the ready
  topics is before its run_at;
- within its bound: first start - max(run_at, acknowledged) at most
  `bench.writes.figures.bound_ms`, which for the dispatcher's `--sweep-interval 2` is
  the design's 2.5 s (a slice's second look, or a sweep and its read) plus 1 s for the
  worker to pick the message up and 2 s for this 2-core machine's load; a schedule's run,
  created by the dispatcher's next creation pass (every 5 s), 5.5 s plus the same.

`check_cancels`: every cancel that answered `cancelled` (through `connect`, `Client(store)`
without a hand-off, and `scheduler cancel`), of a task in the dispatcher's wheel or
already published and waiting for a busy worker whose `--check` is `never`, is never
started; every task kept runs (`bench.writes.cancelling`).

A failure prints the run's table and every task that missed, with its timings.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench.writes.cancelling import CancelRun, run_cancels
from bench.writes.figures import cancel_figures, cancel_table, write_figures, write_table
from bench.writes.scenario import OFFSETS_MS, PATHS, SDK_PATHS, Plan, WriteRun, producers, run_writes
from tests.dispatchers import Fleet
from tests.workers import Workers

SWEEP_INTERVAL_S = 2
GRACE_MS = 15_000
"""How long past its bound a task that has not started is waited for, so that the
failure says whether it was late (and by how much) or never ran."""
START_TIMEOUT_S = 60


def start(fleet: Fleet, workers: Workers, *worker_args: str, concurrency: int) -> None:
    """One dispatcher (sweeping every `SWEEP_INTERVAL_S`) holding every shard, one worker
    consuming."""
    fleet.start("d", "--sweep-interval", str(SWEEP_INTERVAL_S))
    worker = workers.start("w", *worker_args, concurrency=concurrency)
    fleet.wait_for_split({"d": 64}, timeout_s=START_TIMEOUT_S)
    workers.wait_started(worker, timeout_s=START_TIMEOUT_S)


def logs(fleet: Fleet, workers: Workers) -> str:
    parts = [f"--- {d.name} ---\n{d.log()[-3000:]}" for d in fleet.dispatchers]
    parts += [f"--- worker {w.name} ---\n{w.log()[-3000:]}" for w in workers.workers]
    return "\n".join(parts)


def check_write_paths(fleet: Fleet, workers: Workers) -> WriteRun:
    start(fleet, workers, concurrency=8)
    sink = workers.sink()
    try:
        with producers(fleet.env) as made:
            run = run_writes(made, Plan(), sink, SWEEP_INTERVAL_S * 1000, GRACE_MS)
    finally:
        sink.close()
    figures = write_figures(run.results, run.not_written, SWEEP_INTERVAL_S * 1000, PATHS)
    report = "\n".join(write_table(figures))

    def explain(key: str) -> str:
        return f"{report}\n{key}:\n{json.dumps(figures[key], indent=1)}\n{logs(fleet, workers)}"

    assert not run.not_written, explain("not_acknowledged")
    cells = {(w.path, w.offset_ms) for w in run.written}
    assert cells == {(path, offset) for path in (*SDK_PATHS, "cli") for offset in OFFSETS_MS} | {("schedule", None)}
    assert not figures["never_ran"], explain("never_ran")
    assert not figures["early"], explain("early")
    assert not figures["over_bound"], explain("over_bound")
    assert figures["total"]["ran"] == len(run.written) == figures["total"]["acknowledged"]
    return run


def check_cancels(fleet: Fleet, workers: Workers, directory: Path) -> CancelRun:
    start(fleet, workers, "--check", "never", concurrency=1)
    sink = workers.sink()
    worker = workers.workers[0]

    def stats() -> list[dict[str, Any]]:
        return [worker.stats()]

    try:
        with producers(fleet.env) as made:
            run = run_cancels(made, sink, stats, directory / "let-the-blocker-go")
    finally:
        sink.close()
    figures = cancel_figures(run.cases, run.starts, run.published)
    report = "\n".join(cancel_table(figures))
    detail = f"{report}\n{json.dumps(figures['problems'], indent=1)}\n{logs(fleet, workers)}"
    assert not figures["problems"], detail
    assert run.settled, detail
    assert {case.outcome for case in run.cases if case.cancel_by is not None} == {"cancelled"}, detail
    # The published group was in the ready topics before its cancels: the worker had it.
    assert {case.task_id for case in run.cases if case.group == "published"} <= run.published, detail
    assert run.blocker in run.starts
    return run
