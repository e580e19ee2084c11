"""What became of each written task, the bound it is held to, and the figures of a run:
per write path and due offset, acknowledged / ran / lateness p50, p99, max; per cancel
path, cancelled / started after the cancel returned. Pure: no I/O, no clock.

The bound
---------
A row acknowledged at W with run_at R fires (`scheduler.dispatcher.shard`)

- by max(R, W) + `second_look_ms` + one slice (1 s): when W is before the second look
  of R's slice, the bucket read, the verify or the second look finds it;
- by W + the sweep interval + the read: when W is after that second look and R is
  within the last 90 s behind the cursor at the next sweep (every offset written here
  is: the earliest is 60 s before its write).

So every write fires by max(R, W) + `promise_ms(sweep)`, the larger of the two. A
schedule's run is created by the dispatcher's first creation pass after the schedule was
stored (a pass every `SCHEDULE_PASS_MS`) and handed off to the run's shard, so it fires
by max(slot, A) + `SCHEDULE_PASS_MS` + the hand-off, A being when the add returned.
What a test asserts is the handler's start, so each bound also gets `PICKUP_MS` (the
worker's way from the ready topic to a started handler) and `LOAD_MARGIN_MS` (this
machine kind: 2 cores shared with Cassandra, Kafka and ZooKeeper, where a process can
wait that long for a core). A task over its bound is listed with its timings.

Lateness is first handler start - max(R, W): W is when the write returned to the
caller, so for the `scheduler submit` paths, where W is when the command printed its
answer, a task due at once can start before W (negative lateness).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from bench.nine.report import percentile
from scheduler.model import TaskId

SLICE_MS = 1000
SECOND_LOOK_MS = 1000
"""The dispatcher's `second_look_ms`: a slice is counted again this long after it ended."""
READ_MS = 500
"""A sweep's count, the re-read of the bucket whose count differed, and the publish."""
SCHEDULE_PASS_MS = 5000
"""The dispatcher's `schedule_interval_ms`: a creation pass per held shard this often."""
PICKUP_MS = 1000
"""Published -> handler started: the worker's poll, and its copy of the cancel marks,
read every 200 ms, which must be younger than 1.5 s for anything to start
(`scheduler.cancels.MAX_AGE_MS`)."""
LOAD_MARGIN_MS = 2000
"""Two cores shared by the servers, the dispatcher, the worker and the writers: a
process that is ready to run may wait this long for a core (the nine o'clock bench
measured handler starts p99 0.5 s late under a far heavier load)."""

SCHEDULE = "schedule"
NEXT_SLOT = "next slot"
"""The offset column of a schedule's run: its slot is the first one after the add."""


def promise_ms(path: str, sweep_interval_ms: int) -> int:
    """How long after max(run_at, acknowledged) the design says a task of `path` fires."""
    if path == SCHEDULE:
        return SCHEDULE_PASS_MS + READ_MS
    return max(SECOND_LOOK_MS + SLICE_MS, sweep_interval_ms + READ_MS)


def bound_ms(path: str, sweep_interval_ms: int) -> int:
    """The most a task's first handler start may be after max(run_at, acknowledged)."""
    return promise_ms(path, sweep_interval_ms) + PICKUP_MS + LOAD_MARGIN_MS


@dataclass(frozen=True)
class Written:
    """One acknowledged write: `offset_ms` is run_at - the moment it was asked for (None for a
    schedule's run, due at the schedule's next slot); `acked_ms` is when the write returned."""

    path: str
    offset_ms: int | None
    task_id: TaskId
    asked_ms: int
    acked_ms: int

    @property
    def run_at_ms(self) -> int:
        return self.task_id.run_at_ms

    @property
    def due_ms(self) -> int:
        """max(run_at, acknowledged): the earliest the task can be expected to start."""
        return max(self.run_at_ms, self.acked_ms)

    @property
    def offset(self) -> str:
        return NEXT_SLOT if self.offset_ms is None else f"{self.offset_ms / 1000:+g} s"


@dataclass(frozen=True)
class NotWritten:
    """A write that was refused or not acknowledged: nothing is expected of it."""

    path: str
    offset_ms: int | None
    reason: str


@dataclass(frozen=True)
class Seen:
    """One written task and what became of it: its handler starts and its publishes (ms)."""

    written: Written
    starts: tuple[int, ...]
    stamps: tuple[int, ...]

    @property
    def ran(self) -> bool:
        return bool(self.starts)

    @property
    def lateness_ms(self) -> int | None:
        return self.starts[0] - self.written.due_ms if self.starts else None

    @property
    def early(self) -> bool:
        """Started, or published, before its run_at."""
        run_at = self.written.run_at_ms
        return bool((self.starts and self.starts[0] < run_at) or (self.stamps and self.stamps[0] < run_at))

    def describe(self) -> dict[str, Any]:
        w = self.written
        return {"path": w.path, "offset": w.offset, "id": str(w.task_id), "run_at_ms": w.run_at_ms,
                "asked_ms": w.asked_ms, "acked_ms": w.acked_ms, "starts_ms": list(self.starts),
                "published_ms": list(self.stamps), "lateness_ms": self.lateness_ms}


def seen(written: Iterable[Written], starts: dict[TaskId, list[int]], stamps: dict[TaskId, list[int]]) -> list[Seen]:
    return [Seen(w, tuple(sorted(starts.get(w.task_id, ()))), tuple(sorted(stamps.get(w.task_id, ()))))
            for w in written]


def cell_figures(cell: Sequence[Seen], bound: int) -> dict[str, Any]:
    lateness = sorted(s.lateness_ms for s in cell if s.lateness_ms is not None)
    return {"acknowledged": len(cell), "ran": sum(s.ran for s in cell),
            "started_twice": sum(len(s.starts) > 1 for s in cell), "early": sum(s.early for s in cell),
            "lateness_ms": {"p50": percentile(lateness, 0.5), "p99": percentile(lateness, 0.99),
                            "max": lateness[-1] if lateness else None},
            "bound_ms": bound, "over_bound": sum(value > bound for value in lateness)}


def write_figures(results: Sequence[Seen], not_written: Sequence[NotWritten], sweep_interval_ms: int,
                  paths: Sequence[str]) -> dict[str, Any]:
    """Figures by path and offset, and every task that missed a promise, described."""
    cells: dict[tuple[str, str], list[Seen]] = {}
    for s in sorted(results, key=lambda s: (paths.index(s.written.path), s.written.offset_ms or 0)):
        cells.setdefault((s.written.path, s.written.offset), []).append(s)
    rows = [{"path": path, "offset": offset, **cell_figures(cell, bound_ms(path, sweep_interval_ms))}
            for (path, offset), cell in cells.items()]
    lateness = sorted(s.lateness_ms for s in results if s.lateness_ms is not None)
    return {
        "cells": rows,
        "total": {"acknowledged": len(results), "not_acknowledged": len(not_written),
                  "ran": sum(s.ran for s in results), "never_ran": sum(not s.ran for s in results),
                  "early": sum(s.early for s in results), "started_twice": sum(len(s.starts) > 1 for s in results),
                  "over_bound": sum(row["over_bound"] for row in rows),
                  "lateness_ms": {"p50": percentile(lateness, 0.5), "p99": percentile(lateness, 0.99),
                                  "max": lateness[-1] if lateness else None}},
        "never_ran": [s.describe() for s in results if not s.ran],
        "early": [s.describe() for s in results if s.early],
        "over_bound": [s.describe() | {"bound_ms": bound_ms(s.written.path, sweep_interval_ms)} for s in results
                       if s.lateness_ms is not None and s.lateness_ms > bound_ms(s.written.path, sweep_interval_ms)],
        "not_acknowledged": [{"path": n.path, "offset_ms": n.offset_ms, "reason": n.reason} for n in not_written],
    }


def ms(value: int | None) -> str:
    return "-" if value is None else f"{value:,}"


def write_table(figures: dict[str, Any]) -> list[str]:
    lines = [f"{'write path':<10} {'due offset':>10} {'acked':>6} {'ran':>5} {'p50 ms':>7} {'p99 ms':>7} "
             f"{'max ms':>7} {'bound':>6} {'over':>5} {'early':>5} {'twice':>5}"]
    for row in figures["cells"]:
        late = row["lateness_ms"]
        lines.append(f"{row['path']:<10} {row['offset']:>10} {row['acknowledged']:>6} {row['ran']:>5} "
                     f"{ms(late['p50']):>7} {ms(late['p99']):>7} {ms(late['max']):>7} {ms(row['bound_ms']):>6} "
                     f"{row['over_bound']:>5} {row['early']:>5} {row['started_twice']:>5}")
    total = figures["total"]
    late = total["lateness_ms"]
    lines.append(f"{'all':<10} {'':>10} {total['acknowledged']:>6} {total['ran']:>5} {ms(late['p50']):>7} "
                 f"{ms(late['p99']):>7} {ms(late['max']):>7} {'':>6} {total['over_bound']:>5} {total['early']:>5} "
                 f"{total['started_twice']:>5}")
    return lines


# Cancels.


@dataclass(frozen=True)
class Cancelled:
    """One task of the cancel scenario. `group`: where it was when cancelled (`wheel`: due
    seconds ahead, loaded or about to be; `published`: already in the ready topic, the
    worker busy); `cancel_by` is None for a task kept (not cancelled), which must run."""

    group: str
    written_by: str
    cancel_by: str | None
    task_id: TaskId
    outcome: str | None = None
    asked_ms: int = 0
    answered_ms: int = 0


def cancel_figures(cases: Sequence[Cancelled], starts: dict[TaskId, list[int]],
                   published: set[TaskId]) -> dict[str, Any]:
    """By group and cancel path: cancelled (answered `cancelled`), published anyway (the
    workers had to skip them), started at all, started after the cancel returned; kept
    tasks and how many of them ran."""
    rows: dict[tuple[str, str], dict[str, int]] = {}
    broken: list[dict[str, Any]] = []
    for case in cases:
        row = rows.setdefault((case.group, case.cancel_by or "kept"), {
            "tasks": 0, "cancelled": 0, "other_answer": 0, "published": 0, "started": 0,
            "started_after_answer": 0})
        row["tasks"] += 1
        task_starts = starts.get(case.task_id, [])
        row["published"] += case.task_id in published
        row["started"] += bool(task_starts)
        if case.cancel_by is None:
            if not task_starts:
                broken.append({"problem": "kept task never ran", **describe_case(case, task_starts)})
            continue
        if case.outcome != "cancelled":
            row["other_answer"] += 1
            broken.append({"problem": f"cancel answered {case.outcome!r}", **describe_case(case, task_starts)})
            continue
        row["cancelled"] += 1
        late = [at for at in task_starts if at >= case.answered_ms]
        row["started_after_answer"] += bool(late)
        if task_starts:
            broken.append({"problem": "a cancelled task started", **describe_case(case, task_starts)})
    return {"rows": [{"group": group, "cancel_by": by, **row} for (group, by), row in rows.items()],
            "problems": broken}


def describe_case(case: Cancelled, task_starts: Sequence[int]) -> dict[str, Any]:
    return {"group": case.group, "written_by": case.written_by, "cancel_by": case.cancel_by,
            "id": str(case.task_id), "run_at_ms": case.task_id.run_at_ms, "outcome": case.outcome,
            "asked_ms": case.asked_ms, "answered_ms": case.answered_ms, "starts_ms": list(task_starts)}


def cancel_table(figures: dict[str, Any]) -> list[str]:
    lines = [f"{'where':<10} {'cancel by':<9} {'tasks':>5} {'cancelled':>9} {'published':>9} {'started':>7} "
             f"{'after answer':>12}"]
    for row in figures["rows"]:
        lines.append(f"{row['group']:<10} {row['cancel_by']:<9} {row['tasks']:>5} {row['cancelled']:>9} "
                     f"{row['published']:>9} {row['started']:>7} {row['started_after_answer']:>12}")
    return lines
