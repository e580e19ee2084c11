"""`--fill N`: a table that already holds N other tasks when the burst comes, so the
burst's figures can be set against a fresh table's (the read of minute M should not
care how much else the table holds).

Half the tasks are due in future minutes, half were due in past minutes and are
finished (status `done`, with the attempt's history record, as a worker leaves them).
Neither half comes near the burst: the future half starts `FILL_NEAREST_S` from now,
the past half ends that long ago, each spread evenly over `FILL_SPAN_S` of minutes.
Past tasks lie before the keyspace was made, which is where a new shard owner starts,
so no dispatcher fires or sweeps them.

The tasks are written through the store (`insert`, then `record_status` for the past
half), minute by minute so each partition's rows go out in one batch, by
`--fill-processes` processes (the driver's serialising is most of the cost, and one
process holds one core). Then the memtable is flushed and the bench waits until the
table's compactions have settled (`bench.disk.settle`) before anything else starts,
and measures what the table takes on disk."""

from __future__ import annotations

import multiprocessing
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from bench.disk import compacted, settle, table_directories, usage
from scheduler.adapters.cassandra.connection import connect
from scheduler.adapters.cassandra.store import CassandraTaskStore
from scheduler.model import BUCKET_MS, DEFAULT_MAX_ATTEMPTS, Priority, Task, TaskId, encode_payload, minute_bucket
from scheduler.ports import StatusReport, TaskStatus
from scheduler.settings import CassandraSettings
from scheduler.visibility.history import AttemptRecord

from .common import BenchFailure, echo
from .settings import BOARD_SHARE, TASK_TYPE

FILL_NEAREST_S = 6 * 3600
"""The fill's tasks are at least this far from now, either way: far from the burst's
minute, the dispatchers' first look-back (an hour) and their sweep horizon."""
FILL_SPAN_S = 3 * 86_400
"""Each half is spread over this many seconds of minutes."""
FILL_JOB_TASKS = 20_000
"""About how many tasks one job of a fill process writes (whole minutes)."""
FILL_SETTLE_QUIET_S = 15.0
FILL_SETTLE_TIMEOUT_S = 900.0
FILL_COLLEGES = 5000


@dataclass(frozen=True)
class FillJob:
    """Minutes `first` to `last` (indexes into the half's minutes, `last` excluded) of
    the past (`done`) or future half."""

    done: bool
    first_minute_ms: int
    total: int
    minutes: int
    first: int
    last: int

    def count(self, index: int) -> int:
        """Tasks of minute `index`: the half's total spread evenly over its minutes."""
        return self.total * (index + 1) // self.minutes - self.total * index // self.minutes


@dataclass(frozen=True)
class FillPlan:
    tasks: int
    now_ms: int

    @property
    def minutes(self) -> int:
        return FILL_SPAN_S * 1000 // BUCKET_MS

    @property
    def future_first_ms(self) -> int:
        return minute_bucket(self.now_ms + FILL_NEAREST_S * 1000) + BUCKET_MS

    @property
    def past_first_ms(self) -> int:
        return minute_bucket(self.now_ms - FILL_NEAREST_S * 1000) - self.minutes * BUCKET_MS

    def jobs(self) -> list[FillJob]:
        halves = ((True, self.past_first_ms, self.tasks // 2), (False, self.future_first_ms,
                                                                 self.tasks - self.tasks // 2))
        jobs = []
        for done, first_ms, total in halves:
            if not total:
                continue
            step = max(1, FILL_JOB_TASKS * self.minutes // total)
            jobs += [FillJob(done, first_ms, total, self.minutes, first, min(first + step, self.minutes))
                     for first in range(0, self.minutes, step)]
        return jobs


_store: CassandraTaskStore | None = None
_text_len = 0


def _open(settings: CassandraSettings, text_len: int) -> None:
    """A fill process's store, opened once."""
    global _store, _text_len
    _store = CassandraTaskStore.open(settings, max_in_flight=32)
    _text_len = text_len


def _write(job: FillJob) -> tuple[int, int, int]:
    """Write one job's tasks (and the past ones' `done` reports): rows, reports, partitions."""
    assert _store is not None
    rng = random.Random(job.first_minute_ms * 2 + job.first * 2 + job.done)
    filler = "Your fee receipt and timetable are at portal.example.in. " * (_text_len // 56 + 1)
    tasks: list[Task] = []
    partitions: set[tuple[int, int]] = set()
    shards = _store.shard_count
    for index in range(job.first, job.last):
        minute_ms = job.first_minute_ms + index * BUCKET_MS
        for _ in range(job.count(index)):
            run_at_ms = minute_ms + rng.randrange(BUCKET_MS)
            tenant = "board" if rng.random() < BOARD_SHARE else f"college-{rng.randrange(1, FILL_COLLEGES + 1)}"
            text = f"Roll no. {rng.randrange(10**7):07d}: {filler}"[:_text_len]
            payload = encode_payload({"to": f"+9198{rng.randrange(10**8):08d}", "text": text})
            task_id = TaskId.new(run_at_ms)
            tasks.append(Task.unchecked(task_id, tenant, TASK_TYPE, payload, run_at_ms, Priority.NORMAL, 1,
                                        DEFAULT_MAX_ATTEMPTS, None))
            partitions.add((minute_ms, task_id.shard(shards)))
    failures = _store.insert(tasks)
    if failures:
        raise BenchFailure(f"fill: {len(failures)} batches not written, first: {failures[0].reason}")
    reports = 0
    if job.done:
        done = [StatusReport(task.id, 1, TaskStatus.DONE, None,
                             AttemptRecord(1, task.run_at_ms + 40, task.run_at_ms + 90, task.run_at_ms + 140,
                                           f"worker-{task.id.shard(8)}", "done").encode())
                for task in tasks]
        _store.record_status(done)
        reports = len(done)
    return len(tasks), reports, len(partitions)


def fill(settings: CassandraSettings, tasks: int, processes: int, text_len: int,
         progress: Callable[[int], None]) -> tuple[dict[str, Any], FillPlan]:
    """Write the fill, let the table settle, and measure it: the `fill` part of the
    document, and the plan (where its tasks are)."""
    plan = FillPlan(tasks, time.time_ns() // 1_000_000)
    jobs = plan.jobs()
    since = datetime.now(timezone.utc)
    echo(f"fill: {tasks:,} tasks ({tasks // 2:,} done in the past, {tasks - tasks // 2:,} due in the future, "
         f"{FILL_SPAN_S // 86_400} days of minutes each side, {FILL_NEAREST_S // 3600} h or more from now) "
         f"by {processes} process(es) ...")
    rows = reports = partitions = 0
    started = time.monotonic()
    last_echo = started
    context = multiprocessing.get_context("spawn")  # the parent holds driver threads: no fork
    with context.Pool(processes, initializer=_open, initargs=(settings, text_len)) as pool:
        for job_rows, job_reports, job_partitions in pool.imap_unordered(_write, jobs):
            rows += job_rows
            reports += job_reports
            partitions += job_partitions
            progress(rows)
            if time.monotonic() - last_echo >= 15:
                last_echo = time.monotonic()
                echo(f"fill: {rows:,} of {tasks:,} rows, {rows / (last_echo - started):,.0f} rows/s, "
                     f"load {os.getloadavg()[0]:.1f}")
    seconds = time.monotonic() - started
    echo(f"fill: {rows:,} rows and {reports:,} done reports in {seconds:.1f} s ({rows / seconds:,.0f} rows/s); "
         "flushing and waiting for compactions to settle ...")
    connection = connect(settings)
    try:
        session = connection.session
        directories = table_directories(session, settings.keyspace, "tasks_by_bucket")
        settle_s, settled = settle(session, settings.keyspace, "tasks_by_bucket", directories,
                                   quiet_s=FILL_SETTLE_QUIET_S, timeout_s=FILL_SETTLE_TIMEOUT_S)
        disk = usage(directories) if directories else None
        history = compacted(session, settings.keyspace, "tasks_by_bucket", since)
    finally:
        connection.close()
    figures: dict[str, Any] = {
        "rows": rows, "done_reports": reports, "future": tasks - tasks // 2, "past_done": tasks // 2,
        "partitions": partitions, "processes": processes, "seconds": round(seconds, 1),
        "rows_per_s": round(rows / seconds), "writes_per_s": round((rows + reports) / seconds),
        "settle_s": round(settle_s, 1), "settled": settled, "settle_quiet_s": FILL_SETTLE_QUIET_S,
        "loadavg_after": os.getloadavg(), "settled_at": datetime.now(timezone.utc).isoformat(timespec="seconds"), "compactions": history.as_dict(),
        "disk": None if disk is None else {
            **disk.as_dict(), "bytes_per_task": round(disk.bytes / rows, 1) if rows else None,
            "data_bytes_per_task": round(disk.data_bytes / rows, 1) if rows else None,
            "bytes_per_partition": round(disk.bytes / partitions) if partitions else None,
            "directories": [str(path) for path in directories]},
        "future_from": datetime.fromtimestamp(plan.future_first_ms / 1000, timezone.utc).isoformat(),
        "past_from": datetime.fromtimestamp(plan.past_first_ms / 1000, timezone.utc).isoformat(),
    }
    echo(f"fill: settled after {settle_s:.1f} s" + ("" if settled else " (TIMED OUT: compactions still running)")
         + ("" if disk is None else f"; {disk.bytes / 2**20:,.1f} MiB on disk in {disk.sstables} SSTables, "
            f"{disk.bytes / max(rows, 1):,.1f} B a task"))
    return figures, plan
