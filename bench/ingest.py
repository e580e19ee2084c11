"""Ingest bench: acknowledged tasks per second through the producer SDK's `submit_many`.

What it measures
----------------
A results-day burst: `--tasks` SMS tasks (default 200,000), all due within one minute
ten minutes ahead, spread over the 64 shards by their ids, about 80% of them for one
"board" tenant and the rest over 1,000 "college-<n>" tenants, each with a ~100-byte
msgpack payload. For each backend (the real Cassandra, the embedded SQLite store):

- raw ceiling: the same rows, in the same shape, written without the SDK. Cassandra:
  the store's own prepared INSERT, single-partition UNLOGGED batches of `--batch-rows`,
  `execute_async` with at most `--in-flight` outstanding; SQLite: `executemany` of the
  store's upsert in transactions of `--chunk-size` rows, WAL, synchronous=FULL. Rows
  are built before the clock starts, so this is what the driver and server can take.
- SDK: `Client(store).submit_many(items, keep_ids=False)` from one process, then
  from N processes (`--processes 1,2`), each opening its own store and submitting its
  share after a common barrier. The items (`Submission`s: type, tenant, run_at and
  payload dict) are made before the clock starts, as the raw rows are, so the timed
  part is the SDK's own work: ids, validation, msgpack, grouping and writing. A task
  counts once the store acknowledged it;
  tasks/s = stored / seconds from the first item to the last acknowledgement (for N
  processes: total stored / (last finish - common start)).

Both figures come from the same run, raw first and the SDK right after, each into a
fresh keyspace (`bench_<hex>_*`) or file, after an untimed warm-up of 5% of the tasks
(in another minute). `ratio` = SDK tasks/s / raw rows/s: the share of the backend's
ceiling the SDK reaches. Every run is then counted back (Cassandra: COUNT(*) of the 64
partitions of the minute; SQLite: COUNT(*) of the minute); a mismatch, a rejected or
failed item, or an unreachable server fails the bench with a non-zero exit.

How to run
----------
    .venv/bin/python deploy/local/cluster.py start     # the local Cassandra, if not running
    .venv/bin/python bench/ingest.py --json            # summary on stderr, JSON on stdout
    .venv/bin/python bench/ingest.py --backend embedded --tasks 500000 --out /tmp/ingest.json

Cassandra is found as the scheduler finds it (`SCHEDULER_CASSANDRA_HOSTS`, ...; the
local cluster by default). Bench keyspaces and files are removed at the end, also on
failure or Ctrl-C, unless `--keep`. Exit status: 0 ok, 1 a failed or lost write,
2 Cassandra unreachable, 130 interrupted.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import multiprocessing
import os
import platform
import queue
import random
import secrets
import shutil
import sqlite3
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from statistics import median
from typing import Any

import click
from cassandra.cluster import Session
from cassandra.query import UNSET_VALUE, BatchStatement, BatchType, PreparedStatement

from scheduler.adapters.cassandra import schema
from scheduler.adapters.cassandra.connection import DRIVER_ERRORS, CassandraConnection, connect
from scheduler.adapters.cassandra.queries import insert_task_statement
from scheduler.adapters.cassandra.store import CassandraTaskStore
from scheduler.adapters.embedded.store import SqliteTaskStore, open_raw_task_file, write_task_rows
from scheduler.errors import StoreError, StoreUnavailable
from scheduler.model import BUCKET_MS, DEFAULT_MAX_ATTEMPTS, Priority, TaskId, encode_payload, from_ms
from scheduler.producer import DEFAULT_CHUNK_SIZE, Client, Submission, SubmitReport
from scheduler.retention import DEFAULT_RETENTION_S, ttl_s
from scheduler.settings import CassandraSettings

BACKENDS = ("embedded", "cassandra")
LEAD_MS = 10 * BUCKET_MS
"""How far ahead the timed minute starts: far enough that no task is due (and moved to
"now" by the SDK) before a run ends."""
WARMUP_SHARE = 0.05
BARRIER_TIMEOUT_S = 300.0
BOARD_SHARE = 0.8
COLLEGES = tuple(f"college-{n}" for n in range(1000))
TASK_TYPE = "sms"


class BenchFailure(Exception):
    """The bench cannot report a figure: a write failed, or rows are missing."""


@dataclass(frozen=True)
class Options:
    tasks: int
    processes: tuple[int, ...]
    batch_rows: int
    in_flight: int
    chunk_size: int
    payload_bytes: int
    keep: bool
    rounds: int = 3

    @property
    def warmup(self) -> int:
        return max(1, int(self.tasks * WARMUP_SHARE))


# The workload.


@dataclass(frozen=True)
class Workload:
    """Generates the burst's items, lazily, for the minute starting at `bucket_ms`."""

    bucket_ms: int
    text_len: int

    @classmethod
    def ahead(cls, payload_bytes: int) -> Workload:
        now_ms = time.time_ns() // 1_000_000
        return cls((now_ms + LEAD_MS) // BUCKET_MS * BUCKET_MS, text_length_for(payload_bytes))

    @property
    def warmup(self) -> Workload:
        """The same workload one minute later: warm-up rows never mix with timed ones."""
        return dataclasses.replace(self, bucket_ms=self.bucket_ms + BUCKET_MS)

    def records(self, count: int, seed: int) -> Iterator[tuple[int, str, dict[str, str]]]:
        """(run_at_ms, tenant, payload) for `count` tasks."""
        rng = random.Random(seed)
        filler = "Visit results.example.in for marks and the revaluation form. " * (self.text_len // 60 + 1)
        for n in range(count):
            tenant = "board" if rng.random() < BOARD_SHARE else COLLEGES[rng.randrange(len(COLLEGES))]
            text = f"Roll no. {rng.randrange(10**7):07d}: your result is out. {filler}"[: self.text_len]
            payload = {"to": f"+9198{rng.randrange(10**8):08d}", "text": text}
            yield self.bucket_ms + n * 997 % BUCKET_MS, tenant, payload

    def submissions(self, count: int, seed: int) -> Iterator[Submission]:
        moments: dict[int, datetime] = {}
        for run_at_ms, tenant, payload in self.records(count, seed):
            run_at = moments.get(run_at_ms) or moments.setdefault(run_at_ms, from_ms(run_at_ms))
            yield Submission(TASK_TYPE, payload, tenant=tenant, run_at=run_at)


def text_length_for(payload_bytes: int) -> int:
    """The text length that makes an encoded payload about `payload_bytes` long."""
    length = max(0, payload_bytes - len(encode_payload({"to": "+919800000000", "text": ""})))
    while length and len(encode_payload({"to": "+919800000000", "text": "x" * length})) > payload_bytes:
        length -= 1
    return length


def mean_payload_bytes(workload: Workload, sample: int = 1000) -> float:
    sizes = [len(encode_payload(payload)) for _, _, payload in workload.records(sample, seed=0)]
    return sum(sizes) / len(sizes)


def raw_rows(workload: Workload, count: int, seed: int, shard_count: int, *, sqlite: bool) -> list[tuple[Any, ...]]:
    """The rows the stores write for these tasks (as `insert_task_statement` and
    `write_task_rows` describe them), built with plain types: the id as a uuid.UUID for
    the driver, as 16 bytes for SQLite."""
    rows = []
    normal = Priority.NORMAL.code
    # As the stores write them: Cassandra's with the partition's TTL (the default retention),
    # SQLite's with no kept_until of their own (the minute's end plus the retention).
    ttl = (None,) if sqlite else (ttl_s(workload.bucket_ms, DEFAULT_RETENTION_S, time.time_ns() // 1_000_000),)
    for run_at_ms, tenant, payload in workload.records(count, seed):
        task_id = TaskId.new(run_at_ms)
        key = task_id.bytes if sqlite else task_id.uuid
        no_key = None if sqlite else UNSET_VALUE  # unset, not null: a bound null is a tombstone
        rows.append((workload.bucket_ms, task_id.shard(shard_count), run_at_ms, key, tenant, TASK_TYPE, normal,
                     encode_payload(payload), 1, DEFAULT_MAX_ATTEMPTS, no_key, 1, *ttl))  # attempt 1, ..., cost 1
    return rows


# Where the rows go.


@dataclass(frozen=True)
class Target:
    """A store to open, in this process or another: a Cassandra keyspace or a SQLite file."""

    backend: str
    cassandra: CassandraSettings | None = None
    path: str | None = None

    @property
    def name(self) -> str:
        return self.cassandra.keyspace if self.cassandra is not None else str(self.path)


def open_store(target: Target, options: Options) -> CassandraTaskStore | SqliteTaskStore:
    if target.cassandra is not None:
        return CassandraTaskStore.open(target.cassandra, batch_rows=options.batch_rows,
                                       max_in_flight=options.in_flight)
    assert target.path is not None
    return SqliteTaskStore(target.path, synchronous="FULL")


class Keyspaces:
    """The bench's keyspaces: created with the scheduler schema, dropped at the end."""

    def __init__(self, connection: CassandraConnection, base: CassandraSettings) -> None:
        self.connection = connection
        self.base = base
        self.prefix = f"bench_{secrets.token_hex(4)}"
        self.created: list[str] = []

    def create(self, suffix: str) -> Target:
        settings = dataclasses.replace(self.base, keyspace=f"{self.prefix}_{suffix}")
        self.created.append(settings.keyspace)
        schema.apply(self.connection, settings)
        return Target("cassandra", cassandra=settings)

    def drop_all(self) -> None:
        for keyspace in self.created:
            try:
                self.connection.session.execute(f"DROP KEYSPACE IF EXISTS {keyspace}", timeout=120)
            except DRIVER_ERRORS as exc:
                echo(f"warning: could not drop keyspace {keyspace}: {exc}")


# Progress.


def echo(text: str) -> None:
    click.echo(text, err=True)


def progress_bar(label: str, length: int) -> Any:
    return click.progressbar(length=length, label=f"{label:<24}", file=sys.stderr, show_pos=True, width=30)


def report_progress(bar: Any) -> Callable[[SubmitReport], None]:
    """A `submit_many` progress callback that moves `bar` to `report.stored`."""
    shown = 0

    def update(report: SubmitReport) -> None:
        nonlocal shown
        bar.update(report.stored - shown)
        shown = report.stored

    return update


# Raw ceilings.


@contextmanager
def inputs_frozen() -> Iterator[None]:
    """Exempt the objects alive now (the prepared rows or items) from garbage collection
    while a timed run goes: a producer streaming its input would not hold them, and
    the collector re-scanning 200,000 of them would be charged to the run."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def send_batches(session: Session, insert: PreparedStatement, rows: Sequence[tuple[Any, ...]], options: Options,
                 on_sent: Callable[[int], None] = lambda _: None) -> tuple[int, list[str]]:
    """Write `rows` as single-partition UNLOGGED batches, at most `in_flight` outstanding;
    return the number of batches and the errors of those that failed."""
    by_partition: dict[tuple[int, int], list[tuple[Any, ...]]] = defaultdict(list)
    for row in rows:
        by_partition[(row[0], row[1])].append(row)
    slots = threading.BoundedSemaphore(options.in_flight)
    errors: list[str] = []
    batches = 0

    def on_error(exc: BaseException) -> None:
        errors.append(f"{type(exc).__name__}: {exc}")
        slots.release()

    for group in by_partition.values():
        for start in range(0, len(group), options.batch_rows):
            batch = BatchStatement(batch_type=BatchType.UNLOGGED)
            for row in group[start:start + options.batch_rows]:
                batch.add(insert, row)
            slots.acquire()
            try:
                future = session.execute_async(batch)
            except DRIVER_ERRORS as exc:
                on_error(exc)
                continue
            future.add_callbacks(callback=lambda _: slots.release(), errback=on_error)
            batches += 1
            on_sent(len(batch))
    for _ in range(options.in_flight):  # every slot back: every batch answered
        slots.acquire()
    return batches, errors


def cassandra_raw(connection: CassandraConnection, target: Target, options: Options,
                  workload: Workload) -> dict[str, Any]:
    assert target.cassandra is not None
    session = connection.session
    insert = session.prepare(insert_task_statement(target.cassandra.keyspace))
    shards = target.cassandra.shard_count
    send_batches(session, insert, raw_rows(workload.warmup, options.warmup, 1, shards, sqlite=False), options)
    rows = raw_rows(workload, options.tasks, 2, shards, sqlite=False)
    with progress_bar("cassandra raw", len(rows)) as bar, inputs_frozen():
        started = time.monotonic()
        batches, errors = send_batches(session, insert, rows, options, bar.update)
        seconds = time.monotonic() - started
    if errors:
        raise BenchFailure(f"cassandra raw: {len(errors)} of {batches} batches failed, first: {errors[0]}")
    return {"rows": len(rows), "batches": batches, "seconds": round(seconds, 3),
            "rows_per_s": round(len(rows) / seconds), "keyspace": target.name}


def write_transactions(db: sqlite3.Connection, rows: Sequence[tuple[Any, ...]], chunk: int,
                       on_written: Callable[[int], None] = lambda _: None) -> None:
    for start in range(0, len(rows), chunk):
        db.execute("BEGIN IMMEDIATE")
        write_task_rows(db, rows[start:start + chunk])
        db.execute("COMMIT")
        on_written(min(chunk, len(rows) - start))


def embedded_raw(target: Target, options: Options, workload: Workload) -> dict[str, Any]:
    assert target.path is not None
    db = open_raw_task_file(target.path)  # the store's own settings and tables
    try:
        write_transactions(db, raw_rows(workload.warmup, options.warmup, 1, 64, sqlite=True), options.chunk_size)
        rows = raw_rows(workload, options.tasks, 2, 64, sqlite=True)
        with progress_bar("embedded raw", len(rows)) as bar, inputs_frozen():
            started = time.monotonic()
            write_transactions(db, rows, options.chunk_size, bar.update)
            seconds = time.monotonic() - started
    except sqlite3.Error as exc:
        raise BenchFailure(f"embedded raw: {exc}") from exc
    finally:
        db.close()
    return {"rows": len(rows), "transactions": -(-len(rows) // options.chunk_size), "seconds": round(seconds, 3),
            "rows_per_s": round(len(rows) / seconds), "file": target.name}


# SDK runs.


@dataclass(frozen=True)
class Share:
    """What one process submitted: times are `time.monotonic()`, comparable across
    processes on one machine."""

    stored: int
    started: float
    finished: float
    problem: str | None

    def as_tuple(self) -> tuple[int, float, float, str | None]:
        """Plain values, to cross a process boundary (a spawned child's classes live in
        `__mp_main__`, which the parent cannot unpickle)."""
        return self.stored, self.started, self.finished, self.problem


def problem_of(report: SubmitReport, expected: int) -> str | None:
    if report.complete and report.stored == expected:
        return None
    errors = report.rejected or report.failed
    return (f"stored {report.stored} of {expected} (consumed {report.consumed}, rejected {len(report.rejected)}, "
            f"failed {len(report.failed)}, stopped early {report.stopped_early})"
            + (f"; first: {errors[0].reason}" if errors else ""))


def submit_share(target: Target, options: Options, workload: Workload, count: int, seed: int,
                 progress: Callable[[SubmitReport], None], barrier: Any = None) -> Share:
    """Open a store, warm up, wait for the others, then time `submit_many` of `count` tasks."""
    store = open_store(target, options)
    try:
        client = Client(store, chunk_size=options.chunk_size)
        warmup_count = max(1, round(options.warmup * count / options.tasks))
        warm = client.submit_many(workload.warmup.submissions(warmup_count, seed + 1), keep_ids=False)
        if problem := problem_of(warm, warmup_count):
            return Share(warm.stored, 0.0, 0.0, f"warm-up: {problem}")
        items = list(workload.submissions(count, seed))  # in memory, as the raw run's rows are
        if barrier is not None:
            barrier.wait(BARRIER_TIMEOUT_S)
        with inputs_frozen():
            started = time.monotonic()
            report = client.submit_many(iter(items), keep_ids=False, progress=progress)
            finished = time.monotonic()
    finally:
        store.close()
    return Share(report.stored, started, finished, problem_of(report, count))


def share_worker(target: Target, options: Options, workload: Workload, count: int, seed: int, barrier: Any,
                 counter: Any, results: Any) -> None:
    """A spawned process's body: submit its share, add progress to `counter`, put its
    `Share` (or the error that stopped it) on `results`."""
    shown = 0

    def progress(report: SubmitReport) -> None:
        nonlocal shown
        with counter.get_lock():
            counter.value += report.stored - shown
        shown = report.stored

    try:
        results.put(submit_share(target, options, workload, count, seed, progress, barrier).as_tuple())
    except BaseException as exc:
        barrier.abort()
        results.put(Share(0, 0.0, 0.0, f"{type(exc).__name__}: {exc}").as_tuple())


def split(total: int, parts: int) -> list[int]:
    return [total // parts + (1 if n < total % parts else 0) for n in range(parts)]


def run_in_processes(target: Target, options: Options, workload: Workload, processes: int, bar: Any) -> list[Share]:
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(processes)
    counter = context.Value("q", 0)
    results = context.Queue()
    workers = [
        context.Process(target=share_worker, name=f"ingest-{n}",
                        args=(target, options, workload, count, 1000 * (n + 1), barrier, counter, results))
        for n, count in enumerate(split(options.tasks, processes))
    ]
    shares: list[Share] = []
    shown = 0
    try:
        for worker in workers:
            worker.start()
        while len(shares) < processes:
            try:
                shares.append(Share(*results.get(timeout=0.25)))
            except queue.Empty:
                if not any(worker.is_alive() for worker in workers) and results.empty():
                    raise BenchFailure(f"{processes - len(shares)} worker process(es) died without a result") from None
            bar.update(counter.value - shown)
            shown = counter.value
        for worker in workers:
            worker.join()
    finally:
        for worker in workers:
            if worker.is_alive():
                worker.terminate()
                worker.join()
    return shares


def sdk_run(backend: str, target: Target, options: Options, workload: Workload, processes: int) -> dict[str, Any]:
    label = f"{backend} sdk {processes}p"
    with progress_bar(label, options.tasks) as bar:
        if processes == 1:
            shares = [submit_share(target, options, workload, options.tasks, 1000, report_progress(bar))]
        else:
            shares = run_in_processes(target, options, workload, processes, bar)
    problems = [share.problem for share in shares if share.problem]
    if problems:
        raise BenchFailure(f"{label}: {'; '.join(problems)}")
    stored = sum(share.stored for share in shares)
    seconds = max(share.finished for share in shares) - min(share.started for share in shares)
    return {"processes": processes, "tasks": stored, "seconds": round(seconds, 3),
            "tasks_per_s": round(stored / seconds), "store": target.name}


# Counting back.


def count_cassandra(connection: CassandraConnection, target: Target, bucket_ms: int) -> int:
    assert target.cassandra is not None
    statement = connection.session.prepare(
        f"SELECT COUNT(*) FROM {target.cassandra.keyspace}.tasks_by_bucket WHERE minute_bucket = ? AND shard = ?"
    )
    return sum(connection.session.execute(statement, (bucket_ms, shard), timeout=60).one()[0]
               for shard in range(target.cassandra.shard_count))


def count_sqlite(target: Target, bucket_ms: int) -> int:
    assert target.path is not None
    db = sqlite3.connect(target.path)
    try:
        return int(db.execute("SELECT COUNT(*) FROM tasks WHERE minute_bucket = ?", (bucket_ms,)).fetchone()[0])
    finally:
        db.close()


def verified(run: str, counted: int, expected: int) -> dict[str, Any]:
    if counted != expected:
        raise BenchFailure(f"{run}: counted {counted:,} rows back, expected {expected:,}: rows were lost")
    return {"run": run, "counted": counted, "expected": expected}


# Per backend.


def bench_backend(
    backend: str,
    options: Options,
    new_target: Callable[[str], Target],
    raw: Callable[[Target, Workload], dict[str, Any]],
    count: Callable[[Target, int], int],
) -> dict[str, Any]:
    """`rounds` rounds of: the raw ceiling, then the SDK at each process count, each into
    a fresh target and counted back. Raw and SDK runs alternate, so a slow spell of the
    machine (a neighbour, a compaction) hits both; each figure is the median of its runs
    and the ratio is taken between medians."""
    raw_runs: list[dict[str, Any]] = []
    sdk_runs: dict[int, list[dict[str, Any]]] = {processes: [] for processes in options.processes}
    checks = []
    for round_ in range(1, options.rounds + 1):
        workload = Workload.ahead(options.payload_bytes)
        target = new_target(f"raw{round_}")
        raw_runs.append(raw(target, workload))
        checks.append(verified(f"raw {round_}", count(target, workload.bucket_ms), options.tasks))
        for processes in options.processes:
            workload = Workload.ahead(options.payload_bytes)
            target = new_target(f"sdk{processes}p{round_}")
            sdk_runs[processes].append(sdk_run(backend, target, options, workload, processes))
            checks.append(verified(f"sdk {processes}p {round_}", count(target, workload.bucket_ms), options.tasks))
    raw_rate = round(median(run["rows_per_s"] for run in raw_runs))
    sdk_results = []
    for processes, runs in sdk_runs.items():
        rate = round(median(run["tasks_per_s"] for run in runs))
        sdk_results.append({"processes": processes, "tasks_per_s": rate, "ratio_to_raw": round(rate / raw_rate, 3),
                            "runs": runs})
    verification = {"counted": sum(c["counted"] for c in checks), "expected": sum(c["expected"] for c in checks),
                    "runs": checks}
    return {"raw": {"rows_per_s": raw_rate, "runs": raw_runs}, "sdk": sdk_results, "verification": verification}


def bench_cassandra(options: Options, connection: CassandraConnection, keyspaces: Keyspaces) -> dict[str, Any]:
    result = bench_backend(
        "cassandra", options, keyspaces.create,
        lambda target, workload: cassandra_raw(connection, target, options, workload),
        lambda target, bucket_ms: count_cassandra(connection, target, bucket_ms),
    )
    base = keyspaces.base
    return {"location": f"{','.join(base.hosts)}:{base.port}", "consistency": base.consistency,
            "replication": base.replication, **result}


def bench_embedded(options: Options, directory: Path) -> dict[str, Any]:
    def new_file(name: str) -> Target:
        path = directory / f"{name}.db"
        if not name.startswith("raw"):
            SqliteTaskStore(path).close()  # the schema in place before several processes open the file
        return Target("embedded", path=str(path))

    result = bench_backend("embedded", options, new_file,
                           lambda target, workload: embedded_raw(target, options, workload), count_sqlite)
    return {"directory": str(directory), "synchronous": "FULL", "journal_mode": "WAL", **result}


# Output.


def summary_lines(results: dict[str, Any]) -> list[str]:
    lines = []
    for backend, result in results.items():
        raw = result["raw"]["rows_per_s"]
        for run in result["sdk"]:
            who = f"{run['processes']} process{'' if run['processes'] == 1 else 'es'}:"
            lines.append(f"{backend:<10} {who:<13} {run['tasks_per_s']:>9,} tasks/s   "
                         f"raw ceiling {raw:>9,} rows/s   ratio {run['ratio_to_raw']:.2f}")
        check = result["verification"]
        lines.append(f"{backend:<10} medians of {len(result['raw']['runs'])} rounds; counted back {check['counted']:,} of {check['expected']:,} rows")
    return lines


def document(argv: Sequence[str], options: Options, workload: Workload, results: dict[str, Any]) -> dict[str, Any]:
    return {
        "command": [sys.executable, *argv],
        "timestamp": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": {"cpu_count": os.cpu_count(), "python": platform.python_version(),
                    "platform": platform.platform()},
        "settings": {"tasks": options.tasks, "warmup_tasks": options.warmup, "processes": list(options.processes),
                     "batch_rows": options.batch_rows, "in_flight": options.in_flight,
                     "chunk_size": options.chunk_size, "payload_bytes": options.payload_bytes,
                     "rounds": options.rounds,
                     "payload_bytes_mean": round(mean_payload_bytes(workload), 1),
                     "board_share": BOARD_SHARE, "colleges": len(COLLEGES)},
        "backends": results,
    }


# Command line.


def parse_args(argv: Sequence[str]) -> tuple[argparse.Namespace, Options]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--backend", choices=[*BACKENDS, "both"], default="both")
    parser.add_argument("--tasks", type=int, default=200_000, help="tasks per timed run (default 200,000)")
    parser.add_argument("--processes", default="1,2", help="SDK process counts, comma-separated (default 1,2)")
    parser.add_argument("--batch-rows", type=int, default=250, help="rows per Cassandra batch (default 250)")
    parser.add_argument("--in-flight", type=int, default=16, help="outstanding Cassandra batches (default 16)")
    parser.add_argument("--chunk-size", type=int, default=DEFAULT_CHUNK_SIZE,
                        help=f"SDK chunk and SQLite transaction size (default {DEFAULT_CHUNK_SIZE:,})")
    parser.add_argument("--payload-bytes", type=int, default=100, help="encoded payload size, about (default 100)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="rounds of raw-then-SDK runs; figures are the medians (default 3)")
    parser.add_argument("--keep", action="store_true", help="keep the bench keyspaces and files")
    parser.add_argument("--json", action="store_true", help="print the JSON document on stdout")
    parser.add_argument("--out", type=Path, help="write the JSON document to this file")
    args = parser.parse_args(argv)
    try:
        processes = tuple(sorted({int(part) for part in args.processes.split(",") if part.strip()}))
    except ValueError:
        parser.error(f"--processes takes comma-separated integers, got {args.processes!r}")
    numbers = (args.tasks, args.batch_rows, args.in_flight, args.chunk_size, args.rounds, *processes)
    if not processes or min(numbers) < 1 or args.payload_bytes < 0:
        parser.error("--tasks, --processes, --batch-rows, --in-flight, --chunk-size and --rounds must be positive")
    options = Options(args.tasks, processes, args.batch_rows, args.in_flight, args.chunk_size, args.payload_bytes,
                      args.keep, args.rounds)
    return args, options


def run(args: argparse.Namespace, options: Options, cleanup: list[Callable[[], None]]) -> dict[str, Any]:
    """Connect to Cassandra first, so an unreachable server fails before anything runs;
    then bench the embedded store first, while Cassandra is idle: after a Cassandra run
    the server flushes and compacts for a while, on the same two cores."""
    backends = BACKENDS if args.backend == "both" else (args.backend,)
    results: dict[str, Any] = {}
    connection: CassandraConnection | None = None
    if "cassandra" in backends:
        base = CassandraSettings.from_env()
        connection = connect(base)
        cleanup.append(connection.close)
        keyspaces = Keyspaces(connection, base)
        if not options.keep:
            cleanup.append(keyspaces.drop_all)
    if "embedded" in backends:
        directory = Path(tempfile.mkdtemp(prefix="bench-ingest-"))
        if not options.keep:
            cleanup.append(lambda: shutil.rmtree(directory, ignore_errors=True))
        results["embedded"] = bench_embedded(options, directory)
    if connection is not None:
        results["cassandra"] = bench_cassandra(options, connection, keyspaces)
    return results


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args, options = parse_args(argv)
    cleanup: list[Callable[[], None]] = []
    try:
        results = run(args, options, cleanup)
    except StoreUnavailable as exc:
        echo(f"error: {exc}")
        return 2
    except (StoreError, BenchFailure) as exc:
        echo(f"error: {exc}")
        return 1
    except KeyboardInterrupt:
        echo("interrupted")
        return 130
    finally:
        for step in reversed(cleanup):
            step()
    doc = document([sys.argv[0], *argv], options, Workload.ahead(options.payload_bytes), results)
    text = json.dumps(doc, indent=2)
    for line in summary_lines(results):
        click.echo(line, err=args.json)
    if args.out:
        args.out.write_text(text + "\n", encoding="utf-8")
    if args.json:
        click.echo(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
