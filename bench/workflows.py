"""Workflows bench: a wide fan-out/fan-in workflow end to end, and many small chains a
second, on real `scheduler dispatcher` and `scheduler worker` processes; with the store
writes each step member costs, counted twice over.

What it measures
----------------
On a deployment of its own (`--backend cassandra`: a keyspace, topics and ZooKeeper root
on the real servers; `--backend embedded`: the SQLite files in the work directory), one
dispatcher and `--workers` (3) `scheduler worker --app bench.workflow_app:app
--concurrency C` (16) processes, whose one handler, `step`, does nothing and returns
None: what is timed is the workflow machinery around it. After a one-step warm-up
workflow (so the workers are consuming) and `--idle-s` (5) seconds with nothing to do
(the background writes' rate, below), two phases:

(a) fan-out/fan-in: one workflow, `part` of `--width` (1,000) members (the root, created
    by the submit) and `join` after it (one member, created by the part whose end finds
    every part done). Timed from just before `client.workflows.submit` to the moment the
    workflow's state became `succeeded` (`ended_ms` of its stored record, written by the
    worker that ran the join) and to the moment the bench's polling (every 100 ms) saw
    it; in between, from the store: the first and the last part's end, the join's claim
    (when it was created) and its end.
(b) chains: `--small` (2,000) workflows `a -> b -> c` (one member each) submitted at
    once from `--submitters` (8) threads of one client. Workflows a second = workflows /
    (the last one's `ended_ms` - the first submit's start); steps a second the same with
    3 steps each; latency of each = `ended_ms` - `created_ms` of its record (p50, p90,
    p99, max); the submit rate.

Every workflow must end `succeeded` (else exit 1); a phase ends once the workers' stats
show every step done and every status durable. On both backends the ready topics'
partitions are spread over the workers (`steps_done.by_worker`).

Store writes per step member, two real counts per phase (members: width + 1 in (a), 3
per chain in (b)):

- client: every call of the task store's and the workflow store's methods, in the
  worker processes and in the bench's submitting process (`bench/workflow_app.py` wraps
  the methods of both backends' store classes where it is imported: the workers import
  it as their app), by method: calls and items (tasks inserted, status reports, rows a
  `members` read returned). Writes are `record_member`, `claim`, `mark_created`,
  `transition`, `create` (workflow store) and `insert`, `record_status` (task store).
  Not counted: the dispatcher's calls (it has no app; its writes are time-driven
  cursor advances), and the counts store's.
- server, everything every process wrote, by table. Cassandra: the node's own table
  metrics in the virtual tables `system_views.coordinator_write_latency` (write
  requests it coordinated: a plain write or a batch is one; a conditional write is not
  counted there), `local_write_latency` (partition mutations applied: a batch's
  partitions each, and each *applied* conditional write) and `coordinator_read_latency`
  (read requests, a conditional write's read too), of every host the driver knows,
  before and after; and `system.paxos` mutations (three for an applied conditional
  write, two for a refused one, on one node), which is the whole cluster's: other
  clients' conditional writes land there too (the run's own dispatcher's cursor
  advances are background, below). `conditional_applied` = partition_writes -
  write_requests of a table: every plain write of the schema touches one partition (a
  batch is grouped by partition), so the rest are applied conditional writes. SQLite:
  triggers the bench adds to its own `tasks.db` and `counts.db` (after the processes
  opened them) count the rows inserted, updated and deleted in each table (an upsert
  that updates counts as an update; an ignored insert as nothing); each adds one
  counter update to the write it counts.
  `queue.db` (the embedded Kafka) and `coordinator.db` (ZooKeeper) are not counted.
  Background: the same counts over the idle window give each table's rate when nothing
  runs (cursor advances, heartbeats, count flushes); `net` = raw - rate x the phase's
  length, floored at 0, and the per-member figures are of `net`.

How to run
----------
    .venv/bin/python bench/workflows.py --backend embedded --out /tmp/workflows-embedded.json
    .venv/bin/python bench/workflows.py --backend cassandra --out /tmp/workflows-cassandra.json
    .venv/bin/python bench/workflows.py --backend embedded --width 100 --small 100   # a quick check
    .venv/bin/python bench/workflows.py --help    # --workers, --concurrency, --submitters, --idle-s, ...

`--width 0` or `--small 0` leaves that phase out. Servers are found as the scheduler
finds them (`SCHEDULER_CASSANDRA_HOSTS`, ...; the local cluster by default). The
keyspace, topics and ZooKeeper root (or the SQLite files) are removed at the end unless
`--keep`; the processes are always stopped, also on Ctrl-C or SIGTERM. Exit status: 0
ran, 1 a workflow did not succeed in time or a process failed, 2 a server unreachable,
130 interrupted.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import platform
import secrets
import shutil
import signal
import sqlite3
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Protocol

from confluent_kafka import KafkaException

# Run as a script, only bench/ itself is on the path: the parts are imported as the
# package `bench`, from the repository root.
ROOT = str(Path(__file__).resolve().parents[1])
if ROOT not in sys.path:
    sys.path.append(ROOT)

import scheduler
from bench.nine.common import BenchFailure, echo, now_ms
from bench.nine.deployment import Deployment, Fleet
from bench.nine.proc import cpu_snapshot, cpu_window, server_pids
from bench.nine.report import percentile
from bench.nine.settings import LEASE_TIMEOUT_S, SHARDS
from bench.nine.workers import WorkerFleet, all_settled
from bench.workflow_app import CALLS, CALLS_ENV, install, read_calls
from scheduler.errors import CoordinatorUnavailable, QueueUnavailable, SchedulerError, StoreUnavailable
from scheduler.ports.workflows import WorkflowRecord, WorkflowState
from scheduler.producer import Client
from scheduler.workflows.definition import Step, Workflow

APP = "bench.workflow_app:app"
TENANT = "bench"
STEP = "step"
POLL_S = 0.1
PROGRESS_S = 2.0
START_TIMEOUT_S = 60.0
CALLS_SETTLE_S = 1.2
"""The workers write their call counts every 0.5 s: waited after a phase settles."""
EMBEDDED_TOPIC_PREFIX = "workflow-bench"
COUNTER_TABLE = "bench_write_counts"
OPS = ("insert", "update", "delete")


@dataclass(frozen=True)
class Options:
    backend: str
    width: int
    small: int
    workers: int
    concurrency: int
    submitters: int
    idle_s: float
    timeout_s: float | None
    keep: bool
    work_dir: Path | None


def parse_args(argv: Sequence[str]) -> tuple[argparse.Namespace, Options]:
    parser = argparse.ArgumentParser(
        description="Workflows on real dispatcher and worker processes: one --width fan-out/fan-in workflow from "
                    "submit to succeeded, --small a -> b -> c chains submitted at once (workflows/s), and the store "
                    "writes per step member, counted in the processes (store calls) and in the store (per table).",
        epilog="Servers (--backend cassandra): SCHEDULER_CASSANDRA_HOSTS, SCHEDULER_CASSANDRA_PORT, "
               "SCHEDULER_KAFKA_BOOTSTRAP, SCHEDULER_ZOOKEEPER_HOSTS (default: the local cluster). Exit status: 0 "
               "ran, 1 a workflow did not succeed or a process failed, 2 a server unreachable, 130 interrupted.")
    parser.add_argument("--backend", choices=("cassandra", "embedded"), default="cassandra",
                        help="cassandra: the real Cassandra, Kafka and ZooKeeper (default); embedded: the SQLite "
                             "backend in the work directory")
    parser.add_argument("--width", type=int, default=1000,
                        help="members of the fan-out step, joined by one step after it (default 1,000; 0: no "
                             "fan-out phase)")
    parser.add_argument("--small", type=int, default=2000,
                        help="a -> b -> c workflows submitted at once (default 2,000; 0: no chains phase)")
    parser.add_argument("--workers", type=int, default=3, help="worker processes (1-16, default 3)")
    parser.add_argument("--concurrency", type=int, default=16, help="--concurrency of each worker (default 16)")
    parser.add_argument("--submitters", type=int, default=8,
                        help="threads submitting the chains, on one client (default 8)")
    parser.add_argument("--idle-s", type=float, default=5.0,
                        help="seconds with nothing to do before the phases, for the background writes' rate "
                             "(default 5; 0: no background subtracted)")
    parser.add_argument("--timeout-s", type=float,
                        help="give up a phase after this long (default 120 s plus 0.1 s a fan-out member, "
                             "0.2 s a chain)")
    parser.add_argument("--out", type=Path, help="write the JSON document to this file")
    parser.add_argument("--json", action="store_true", help="print the JSON document on stdout (summary on stderr)")
    parser.add_argument("--keep", action="store_true",
                        help="keep the keyspace, topics and ZooKeeper root (or the SQLite files) and the work "
                             "directory")
    parser.add_argument("--work-dir", type=Path,
                        help="logs, stats files, call counts (and the embedded backend's files); default: a "
                             "temporary directory, removed at the end unless --keep or something failed")
    args = parser.parse_args(argv)
    if args.width < 0 or args.small < 0 or args.width + args.small < 1:
        parser.error("--width and --small must not be negative, and one of them positive")
    if args.width > 10_000:
        parser.error("--width is at most 10,000 (a workflow step's limit)")
    if not 1 <= args.workers <= 16 or not 1 <= args.concurrency <= 1024 or not 1 <= args.submitters <= 256:
        parser.error("--workers 1 to 16, --concurrency 1 to 1024, --submitters 1 to 256")
    if args.idle_s < 0 or (args.timeout_s is not None and args.timeout_s <= 0):
        parser.error("--idle-s must not be negative, --timeout-s must be positive")
    return args, Options(args.backend, args.width, args.small, args.workers, args.concurrency, args.submitters,
                         args.idle_s, args.timeout_s, args.keep, args.work_dir)


# Counting what the store wrote: per table, from the store itself.


Counts = dict[str, dict[str, int]]
"""Table -> metric -> count."""


class WriteCounter(Protocol):
    how: str
    headline: str
    """The metric the per-member write figure is of."""

    def snapshot(self) -> Counts: ...

    def close(self) -> None: ...


class SqliteWriteCounter:
    """Rows inserted, updated and deleted in each table of the given SQLite files,
    counted by triggers the bench adds to them (`install`, once every table exists)."""

    how = ("SQLite: AFTER INSERT/UPDATE/DELETE triggers the bench adds to every table of its own tasks.db and "
           "counts.db count rows changed (an upsert that updates counts as an update, an ignored insert as "
           "nothing); queue.db and coordinator.db are not counted")
    headline = "rows_written"

    def __init__(self, files: Mapping[str, Path]) -> None:
        self.files = dict(files)
        self._connections: dict[str, sqlite3.Connection] = {}
        self.tables: dict[str, list[str]] = {}

    def install(self) -> None:
        for label, path in self.files.items():
            db = sqlite3.connect(str(path), timeout=60, isolation_level=None, check_same_thread=False)
            self._connections[label] = db
            db.execute("BEGIN IMMEDIATE")
            try:
                db.execute(f"CREATE TABLE IF NOT EXISTS {COUNTER_TABLE} (tbl TEXT NOT NULL, op TEXT NOT NULL, "
                           "n INTEGER NOT NULL, PRIMARY KEY (tbl, op)) WITHOUT ROWID")
                tables = [row[0] for row in db.execute(
                    "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' "
                    "AND name != ? ORDER BY name", (COUNTER_TABLE,))]
                for table in tables:
                    for op in OPS:
                        db.execute(f"INSERT OR IGNORE INTO {COUNTER_TABLE} VALUES (?, ?, 0)", (table, op))
                        db.execute(f'CREATE TRIGGER IF NOT EXISTS "bench_count_{table}_{op}" AFTER {op.upper()} '
                                   f'ON "{table}" BEGIN UPDATE {COUNTER_TABLE} SET n = n + 1 '
                                   f"WHERE tbl = '{table}' AND op = '{op}'; END")
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
            self.tables[label] = tables

    def snapshot(self) -> Counts:
        counts: Counts = {}
        for label, db in self._connections.items():
            for table, op, n in db.execute(f"SELECT tbl, op, n FROM {COUNTER_TABLE}"):
                row = counts.setdefault(f"{label}:{table}", {"rows_written": 0})
                row[f"rows_{op}d" if op != "insert" else "rows_inserted"] = n
                row["rows_written"] += n
        return counts

    def untracked(self) -> list[str]:
        """Tables made after the triggers were installed (their writes are not counted)."""
        found = []
        for label, db in self._connections.items():
            names = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table' "
                                                   "AND name NOT LIKE 'sqlite_%' AND name != ?", (COUNTER_TABLE,))}
            found += [f"{label}:{name}" for name in sorted(names - set(self.tables[label]))]
        return found

    def close(self) -> None:
        for db in self._connections.values():
            db.close()
        self._connections.clear()


CASSANDRA_VIEWS = (("coordinator_write_latency", "write_requests"), ("local_write_latency", "partition_writes"),
                   ("coordinator_read_latency", "read_requests"))
PAXOS = "system.paxos (whole cluster)"


class CassandraWriteCounter:
    """Each table's request and mutation counts from the virtual tables of every host."""

    how = ("Cassandra: per table, the counts of the system_views virtual tables coordinator_write_latency "
           "(write_requests: plain writes and batches coordinated, a batch is one; conditional writes not "
           "counted), local_write_latency (partition_writes: partition mutations applied, each of a batch's "
           "partitions and each applied conditional write) and coordinator_read_latency (read_requests, a "
           "conditional write's read included), summed over every host; system.paxos partition_writes are the "
           "whole cluster's Paxos mutations (3 per applied conditional write, 2 per refused one, on one node), "
           "other clients' included")
    headline = "partition_writes"

    def __init__(self, session: Any, keyspace: str) -> None:
        from cassandra import ConsistencyLevel
        from cassandra.query import SimpleStatement

        self._session = session
        self._keyspace = keyspace
        one = ConsistencyLevel.ONE  # the virtual tables are each node's own
        self._statements = [(metric, SimpleStatement(f"SELECT table_name, count FROM system_views.{view} "
                                                     "WHERE keyspace_name = %s", consistency_level=one))
                            for view, metric in CASSANDRA_VIEWS]
        self._paxos = SimpleStatement("SELECT count FROM system_views.local_write_latency WHERE keyspace_name = "
                                      "'system' AND table_name = 'paxos'", consistency_level=one)

    def snapshot(self) -> Counts:
        counts: Counts = {}
        for host in self._session.cluster.metadata.all_hosts():
            for metric, statement in self._statements:
                for table, count in self._session.execute(statement, (self._keyspace,), host=host):
                    row = counts.setdefault(table, {})
                    row[metric] = row.get(metric, 0) + int(count)
            for (count,) in self._session.execute(self._paxos, host=host):
                row = counts.setdefault(PAXOS, {})
                row["partition_writes"] = row.get("partition_writes", 0) + int(count)
        return counts

    def close(self) -> None:
        """Nothing: the session is the deployment's connection's."""


def subtract(after: Counts, before: Counts) -> Counts:
    return {table: {metric: value - before.get(table, {}).get(metric, 0) for metric, value in row.items()}
            for table, row in after.items()}


def rates(delta: Counts, seconds: float) -> dict[str, dict[str, float]]:
    if seconds <= 0:
        return {}
    return {table: {metric: round(value / seconds, 3) for metric, value in row.items() if value}
            for table, row in delta.items() if any(row.values())}


def server_figures(delta: Counts, background: Mapping[str, Mapping[str, float]], seconds: float, members: int,
                   headline: str) -> dict[str, Any]:
    """Per table: raw, background estimate and net of each metric; totals and per member
    (the cluster-wide Paxos apart)."""
    tables: dict[str, Any] = {}
    totals: dict[str, float] = {}
    for table, row in sorted(delta.items()):
        if not any(row.values()):
            continue
        entry: dict[str, Any] = {}
        for metric, raw in sorted(row.items()):
            if not raw:
                continue
            expected = background.get(table, {}).get(metric, 0.0) * seconds
            net = max(0.0, raw - expected)
            entry[metric] = {"raw": raw, "background": round(expected, 1), "net": round(net, 1)}
            if table != PAXOS:
                totals[metric] = totals.get(metric, 0.0) + net
        if "write_requests" in entry and "partition_writes" in entry:
            # Every plain write of the schema touches one partition (a batch is grouped by
            # partition), so the mutations beyond the requests are applied conditional writes.
            conditional = max(0.0, entry["partition_writes"]["net"] - entry["write_requests"]["net"])
            entry["conditional_applied"] = {"net": round(conditional, 1)}
            totals["conditional_applied"] = totals.get("conditional_applied", 0.0) + conditional
        tables[table] = entry
    result: dict[str, Any] = {
        "tables": tables,
        "net_totals": {metric: round(value, 1) for metric, value in sorted(totals.items())},
        "net_per_member": {metric: round(value / members, 3) for metric, value in sorted(totals.items())},
        "headline_metric": headline,
    }
    if PAXOS in tables:
        paxos = tables[PAXOS]["partition_writes"]["net"]
        result["paxos_net_per_member"] = round(paxos / members, 3)
    return result


# Counting what the processes asked of the store: per method (bench/workflow_app.py).


CallCounts = dict[str, dict[str, Any]]


def calls_delta(after: Mapping[str, Mapping[str, Any]], before: Mapping[str, Mapping[str, Any]]) -> CallCounts:
    found: CallCounts = {}
    for name, row in after.items():
        held = before.get(name, {})
        calls = int(row["calls"]) - int(held.get("calls", 0))
        items = int(row["items"]) - int(held.get("items", 0))
        if calls:
            found[name] = {"kind": row["kind"], "calls": calls, "items": items}
    return found


def merge_calls(parts: Sequence[CallCounts]) -> CallCounts:
    merged: CallCounts = {}
    for part in parts:
        for name, row in part.items():
            held = merged.setdefault(name, {"kind": row["kind"], "calls": 0, "items": 0})
            held["calls"] += row["calls"]
            held["items"] += row["items"]
    return dict(sorted(merged.items()))


def worker_calls(directory: Path, pids: Sequence[int]) -> dict[int, CallCounts]:
    found = read_calls(directory)
    return {pid: found.get(pid, {}) for pid in pids}


def call_rates(delta: CallCounts, seconds: float) -> dict[str, dict[str, float]]:
    if seconds <= 0:
        return {}
    return {name: {"calls": round(row["calls"] / seconds, 3), "items": round(row["items"] / seconds, 3)}
            for name, row in delta.items()}


def client_figures(workers: CallCounts, submitter: CallCounts, members: int,
                   background: Mapping[str, Mapping[str, float]], seconds: float) -> dict[str, Any]:
    """By method: raw calls and items, the workers' background (their rate when idle x
    `seconds`), and net per member; totals of writes and reads. The submitter's calls
    are counted over its submits only, so nothing of them is background."""
    by_method: dict[str, dict[str, Any]] = {}
    totals = {"write_workers": 0.0, "write_submitter": 0.0, "write_items": 0.0, "read": 0.0, "read_items": 0.0}
    for name in sorted(set(workers) | set(submitter)):
        worker, submit = workers.get(name), submitter.get(name)
        kind = (worker or submit or {"kind": "?"})["kind"]
        rate = background.get(name, {})
        background_calls = rate.get("calls", 0.0) * seconds
        background_items = rate.get("items", 0.0) * seconds
        worker_calls = max(0.0, (worker["calls"] if worker else 0) - background_calls)
        worker_items = max(0.0, (worker["items"] if worker else 0) - background_items)
        submit_calls = submit["calls"] if submit else 0
        submit_items = submit["items"] if submit else 0
        net_calls, net_items = worker_calls + submit_calls, worker_items + submit_items
        by_method[name] = {
            "kind": kind,
            "calls": (worker["calls"] if worker else 0) + submit_calls,
            "items": (worker["items"] if worker else 0) + submit_items,
            "background_calls": round(background_calls, 1),
            "net_calls": round(net_calls, 1),
            "net_items": round(net_items, 1),
            "calls_per_member": round(net_calls / members, 3),
            "items_per_member": round(net_items / members, 3),
        }
        if kind == "write":
            totals["write_workers"] += worker_calls
            totals["write_submitter"] += submit_calls
            totals["write_items"] += net_items
        else:
            totals["read"] += net_calls
            totals["read_items"] += net_items
    return {
        "by_method": by_method,
        "workers_raw": workers,
        "submitter_raw": submitter,
        "write_calls_per_member": round((totals["write_workers"] + totals["write_submitter"]) / members, 3),
        "write_calls_per_member_workers": round(totals["write_workers"] / members, 3),
        "write_calls_per_member_submitter": round(totals["write_submitter"] / members, 3),
        "write_items_per_member": round(totals["write_items"] / members, 3),
        "read_calls_per_member": round(totals["read"] / members, 3),
        "read_items_per_member": round(totals["read_items"] / members, 3),
    }


# The deployment.


class Backend(Protocol):
    name: str

    def create(self, cleanup: list[Callable[[], None]], keep: bool) -> dict[str, str]:
        """Make the deployment (removed by `cleanup` unless `keep`); the variables that name it."""
        ...

    def arguments(self) -> list[str]: ...

    def counter(self) -> WriteCounter:
        """The store's per-table counts, once the processes have made every table."""
        ...

    def describe(self) -> dict[str, Any]: ...


class CassandraBackend:
    name = "cassandra"

    def __init__(self) -> None:
        self.deployment = Deployment.fresh("workflow_bench")
        self.session: Any = None

    def create(self, cleanup: list[Callable[[], None]], keep: bool) -> dict[str, str]:
        from scheduler.adapters.cassandra.connection import connect

        connection = connect(self.deployment.cassandra)
        cleanup.append(connection.close)
        self.session = connection.session
        self.deployment.create(connection, cleanup, keep, log_append_time=False)
        return self.deployment.env()

    def arguments(self) -> list[str]:
        return ["--backend", "cassandra"]

    def counter(self) -> WriteCounter:
        return CassandraWriteCounter(self.session, self.deployment.cassandra.keyspace)

    def describe(self) -> dict[str, Any]:
        d = self.deployment
        return {"backend": self.name, "keyspace": d.cassandra.keyspace, "topic_prefix": d.kafka.topic_prefix,
                "zookeeper_root": d.zookeeper.root}


class EmbeddedBackend:
    name = "embedded"

    def __init__(self, directory: Path) -> None:
        self.directory = directory.resolve()
        self.db = self.directory / "tasks.db"

    def create(self, cleanup: list[Callable[[], None]], keep: bool) -> dict[str, str]:
        from scheduler.adapters.embedded.queue import SqliteQueue
        from scheduler.adapters.embedded.store import SqliteTaskStore

        self.directory.mkdir(parents=True, exist_ok=True)
        if any(self.directory.iterdir()):
            raise BenchFailure(f"{self.directory} is not empty: the embedded run needs a fresh directory")
        if not keep:
            cleanup.append(lambda: shutil.rmtree(self.directory, ignore_errors=True))
        SqliteTaskStore(self.db, shard_count=SHARDS).close()  # the tables, before the processes race to make them
        SqliteQueue(self.db.with_name("queue.db")).close()
        return {"SCHEDULER_BACKEND": "embedded", "SCHEDULER_DB": str(self.db), "SCHEDULER_SHARDS_TOTAL": str(SHARDS),
                "SCHEDULER_TOPIC_PREFIX": EMBEDDED_TOPIC_PREFIX, "SCHEDULER_LEASE_TIMEOUT_S": str(LEASE_TIMEOUT_S)}

    def arguments(self) -> list[str]:
        return ["--backend", "embedded", "--db", str(self.db)]

    def counter(self) -> WriteCounter:
        from scheduler.adapters.embedded.counts import counts_path

        counter = SqliteWriteCounter({"tasks.db": self.db, "counts.db": counts_path(self.db)})
        counter.install()
        return counter

    def describe(self) -> dict[str, Any]:
        return {"backend": self.name, "db": str(self.db), "topic_prefix": EMBEDDED_TOPIC_PREFIX}


# One run.


@dataclass
class Rig:
    """What the phases share: the processes, the submitting client, the counters."""

    options: Options
    client: Client
    dispatchers: Fleet
    workers: WorkerFleet
    counter: WriteCounter
    calls_dir: Path
    cpu_pids: dict[str, int]
    background: dict[str, dict[str, float]]
    """Table -> metric -> writes a second when idle."""
    background_calls: dict[str, dict[str, float]]
    """The workers' store method -> calls and items a second when idle."""
    tasks_so_far: int = 0

    def check_alive(self) -> None:
        self.dispatchers.check_alive()
        self.workers.check_alive()

    def worker_pids(self) -> list[int]:
        return [member.process.pid for member in self.workers.members]

    def done_steps(self) -> int:
        self.workers.poll()
        return self.workers.totals()["done"]

    def state(self, workflow_id: str) -> WorkflowRecord | None:
        return self.client.workflows.store.read(TENANT, workflow_id)

    def wait_settled(self, tasks: int, deadline: float, label: str) -> int:
        """Until the workers' stats show `tasks` more steps done and every status durable;
        the wall-clock ms when that was seen."""
        self.tasks_so_far += tasks
        last = time.monotonic()
        while True:
            self.check_alive()
            self.workers.poll()
            totals = self.workers.totals()
            if all_settled(totals, self.tasks_so_far):
                return now_ms()
            if time.monotonic() > deadline:
                raise BenchFailure(f"{label}: the workers did not settle {self.tasks_so_far:,} steps in time: {totals}")
            if time.monotonic() - last >= PROGRESS_S:
                last = time.monotonic()
                echo(f"  {label}: waiting for the last statuses ({totals['done']:,} of {self.tasks_so_far:,} "
                     "steps done in all)")
            time.sleep(POLL_S)


@dataclass
class Window:
    """Counts at a phase's start, to subtract at its end."""

    started_ms: int
    monotonic: float
    server: Counts
    workers: dict[int, CallCounts]
    submitter: CallCounts
    cpu: dict[str, float]

    @classmethod
    def open(cls, rig: Rig) -> Window:
        return cls(now_ms(), time.monotonic(), rig.counter.snapshot(), worker_calls(rig.calls_dir, rig.worker_pids()),
                   CALLS.snapshot(), cpu_snapshot(rig.cpu_pids))

    def close(self, rig: Rig, submitter_after: CallCounts, members: int) -> dict[str, Any]:
        """The writes and CPU of the phase, from its start until now (settled)."""
        time.sleep(CALLS_SETTLE_S)
        seconds = time.monotonic() - self.monotonic
        server = subtract(rig.counter.snapshot(), self.server)
        after = worker_calls(rig.calls_dir, rig.worker_pids())
        workers = merge_calls([calls_delta(after[pid], self.workers.get(pid, {})) for pid in after])
        return {
            "members": members,
            "seconds": round(seconds, 2),
            "client": client_figures(workers, calls_delta(submitter_after, self.submitter), members,
                                     rig.background_calls, seconds),
            "server": server_figures(server, rig.background, seconds, members, rig.counter.headline),
            "cpu": cpu_window(self.cpu, cpu_snapshot(rig.cpu_pids), seconds),
        }


def fan_out(rig: Rig, width: int, deadline: float) -> dict[str, Any]:
    flows = rig.client.workflows
    workflow_id = f"fan-out-{secrets.token_hex(4)}"
    members = width + 1
    echo(f"(a) fan-out/fan-in: part[{width:,}] -> join ({members:,} step members)")
    window = Window.open(rig)
    base_done = rig.done_steps()
    started = now_ms()
    flows.submit(Workflow(TENANT, [Step("part", STEP, count=width), Step("join", STEP, after=["part"])],
                          workflow_id=workflow_id))
    submitted = now_ms()
    submitter = CALLS.snapshot()
    echo(f"  submitted in {submitted - started:,} ms")
    last = time.monotonic()
    while True:
        rig.check_alive()
        record = rig.state(workflow_id)
        state = None if record is None else record.state
        if state is WorkflowState.SUCCEEDED:
            break
        if state is not None and state is not WorkflowState.RUNNING:
            raise BenchFailure(f"fan-out workflow {workflow_id} ended {state.value}")
        if time.monotonic() > deadline:
            raise BenchFailure(f"fan-out workflow {workflow_id} did not succeed in time (it is {state})")
        if time.monotonic() - last >= PROGRESS_S:
            last = time.monotonic()
            echo(f"  {(now_ms() - started) / 1000:.1f} s: {rig.done_steps() - base_done:,} of {members:,} steps done, "
                 f"workflow {state.value if state else 'not found'}")
        time.sleep(POLL_S)
    seen = now_ms()
    assert record is not None and record.ended_ms is not None
    echo(f"  succeeded {record.ended_ms - started:,} ms after the submit began (seen at {seen - started:,} ms)")
    rig.wait_settled(members, deadline, "(a)")
    writes = window.close(rig, submitter, members)
    store = flows.store
    ended = store.members(TENANT, workflow_id)
    claims = {claim.step: claim for claim in store.claims(TENANT, workflow_id)}
    parts = sorted(m.finished_ms for m in ended if m.step == "part")
    joins = [m.finished_ms for m in ended if m.step == "join"]
    if len(parts) != width or len(joins) != 1 or any(m.outcome.value != "done" for m in ended):
        raise BenchFailure(f"fan-out workflow {workflow_id}: {len(parts)} parts and {len(joins)} joins recorded, "
                           f"outcomes {sorted({m.outcome.value for m in ended})}")

    def after(ms: int) -> int:
        return ms - started

    return {
        "workflow_id": workflow_id,
        "width": width,
        "members": members,
        "timeline_ms": {
            "submit_returned": after(submitted),
            "first_part_ended": after(parts[0]),
            "last_part_ended": after(parts[-1]),
            "join_created": after(claims["join"].run_at_ms) if "join" in claims else None,
            "join_ended": after(joins[0]),
            "succeeded": after(record.ended_ms),
            "seen_by_bench": after(seen),
        },
        "end_to_end_ms": after(record.ended_ms),
        "parts_per_s": round(width / ((parts[-1] - started) / 1000), 1) if parts[-1] > started else None,
        "writes": writes,
    }


def chains(rig: Rig, count: int, deadline: float) -> dict[str, Any]:
    flows = rig.client.workflows
    tag = secrets.token_hex(4)
    ids = [f"chain-{tag}-{n}" for n in range(count)]
    members = 3 * count
    echo(f"(b) chains: {count:,} x (a -> b -> c), submitted from {rig.options.submitters} threads")
    window = Window.open(rig)
    base_done = rig.done_steps()
    starts: dict[str, int] = {}

    def submit(workflow_id: str) -> None:
        starts[workflow_id] = now_ms()
        flows.submit(Workflow(TENANT, [Step("a", STEP), Step("b", STEP, after=["a"]), Step("c", STEP, after=["b"])],
                              workflow_id=workflow_id))

    started = now_ms()
    submitted = 0
    last = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(rig.options.submitters, thread_name_prefix="submit") as pool:
        pending = {pool.submit(submit, workflow_id) for workflow_id in ids}
        while pending:
            finished, pending = concurrent.futures.wait(pending, timeout=PROGRESS_S)
            for future in finished:
                future.result()
            submitted += len(finished)
            rig.check_alive()
            if pending and time.monotonic() - last >= PROGRESS_S:
                last = time.monotonic()
                echo(f"  {(now_ms() - started) / 1000:.1f} s: {submitted:,} of {count:,} submitted, "
                     f"{rig.done_steps() - base_done:,} of {members:,} steps done")
    all_submitted = now_ms()
    submitter = CALLS.snapshot()
    echo(f"  {count:,} submitted in {(all_submitted - started) / 1000:.1f} s")
    last = time.monotonic()
    while (done := rig.done_steps() - base_done) < members:
        rig.check_alive()
        if time.monotonic() > deadline:
            raise BenchFailure(f"(b): {done:,} of {members:,} steps done when time ran out")
        if time.monotonic() - last >= PROGRESS_S:
            last = time.monotonic()
            echo(f"  {(now_ms() - started) / 1000:.1f} s: {done:,} of {members:,} steps done")
        time.sleep(POLL_S)
    rig.wait_settled(members, deadline, "(b)")
    writes = window.close(rig, submitter, members)
    records = read_records(rig, ids, deadline)
    ended = [record.ended_ms for record in records.values() if record.ended_ms is not None]
    latency = sorted(record.ended_ms - record.created_ms for record in records.values()
                     if record.ended_ms is not None)
    first_start = min(starts.values())
    window_ms = max(ended) - first_start
    return {
        "workflows": count,
        "members": members,
        "submitters": rig.options.submitters,
        "submit_s": round((all_submitted - started) / 1000, 2),
        "submits_per_s": round(count / ((all_submitted - started) / 1000), 1) if all_submitted > started else None,
        "window_ms": window_ms,
        "workflows_per_s": round(count / (window_ms / 1000), 1) if window_ms > 0 else None,
        "steps_per_s": round(members / (window_ms / 1000), 1) if window_ms > 0 else None,
        "latency_ms": {"p50": percentile(latency, 0.5), "p90": percentile(latency, 0.9),
                       "p99": percentile(latency, 0.99), "max": latency[-1] if latency else None},
        "writes": writes,
    }


def read_records(rig: Rig, ids: Sequence[str], deadline: float) -> dict[str, WorkflowRecord]:
    """Every workflow's record, once each has succeeded (a `BenchFailure` if one ends
    otherwise or time runs out)."""
    found: dict[str, WorkflowRecord] = {}
    pending = list(ids)
    with concurrent.futures.ThreadPoolExecutor(8, thread_name_prefix="read") as pool:
        while pending:
            for workflow_id, record in zip(pending, pool.map(rig.state, pending), strict=True):
                if record is None:
                    continue
                if record.state is WorkflowState.SUCCEEDED:
                    found[workflow_id] = record
                elif record.state is not WorkflowState.RUNNING:
                    raise BenchFailure(f"workflow {workflow_id} ended {record.state.value}")
            pending = [workflow_id for workflow_id in pending if workflow_id not in found]
            if pending:
                if time.monotonic() > deadline:
                    raise BenchFailure(f"{len(pending):,} workflows had not succeeded in time, e.g. {pending[0]}")
                echo(f"  {len(pending):,} workflows not succeeded yet")
                time.sleep(1.0)
    return found


def wait_for(what: str, ready: Callable[[], bool], rig_check: Callable[[], None], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        rig_check()
        if time.monotonic() > deadline:
            raise BenchFailure(f"{what} within {timeout_s:.0f} s")
        time.sleep(0.2)


def run(options: Options, work_dir: Path, cleanup: list[Callable[[], None]], document: dict[str, Any]) -> None:
    backend: Backend = CassandraBackend() if options.backend == "cassandra" else EmbeddedBackend(work_dir / "db")
    env = backend.create(cleanup, options.keep)
    document["deployment"] = backend.describe()
    calls_dir = (work_dir / "calls").resolve()
    calls_dir.mkdir(parents=True, exist_ok=True)
    process_env = {**os.environ, **env, CALLS_ENV: str(calls_dir)}
    install()  # this process's submits are counted too
    client = scheduler.connect(env=process_env, tenant=TENANT)
    cleanup.append(client.close)
    _ = client.workflows  # the workflow store, opened (and its tables made) before the processes start

    echo(f"{options.backend}: starting 1 dispatcher and {options.workers} workers (concurrency "
         f"{options.concurrency}); logs in {work_dir}")
    dispatchers = Fleet(process_env, backend.arguments(), work_dir)
    workers = WorkerFleet(process_env, work_dir, backend.arguments())

    def stop_processes() -> None:
        workers.stop()
        dispatchers.stop()

    cleanup.append(stop_processes)
    dispatchers.start(1)
    workers.start(options.workers, options.concurrency, app=APP)
    dispatchers.wait_for_shards(START_TIMEOUT_S)
    wait_for("the workers did not start", lambda: all(m.stats() for m in workers.members), workers.check_alive,
             START_TIMEOUT_S)

    pids = {m.name: m.process.pid for m in [*dispatchers.members, *workers.members]}
    pids.update({"bench": os.getpid(), **(server_pids() if options.backend == "cassandra" else {})})
    rig = Rig(options, client, dispatchers, workers, SqliteWriteCounter({}), calls_dir, pids, {}, {})

    echo("warm-up: one one-step workflow")
    warm_id = f"warm-up-{secrets.token_hex(4)}"
    client.workflows.submit(Workflow(TENANT, [Step("only", STEP)], workflow_id=warm_id))

    def warm() -> bool:
        record = rig.state(warm_id)
        return record is not None and record.state is WorkflowState.SUCCEEDED

    wait_for("the warm-up workflow did not succeed", warm, rig.check_alive, START_TIMEOUT_S)
    rig.wait_settled(1, time.monotonic() + START_TIMEOUT_S, "warm-up")

    rig.counter = backend.counter()
    cleanup.append(rig.counter.close)
    document["counting"] = {
        "server": rig.counter.how,
        "client": "calls of the task store's and workflow store's methods in the worker processes and the bench's "
                  "submitting process (bench/workflow_app.py wraps both backends' store classes), by method: calls "
                  "and items (a batch's tasks or reports, a read's rows); the dispatcher's calls are not counted",
        "background": f"each table's and each worker store method's rate over {options.idle_s:g} s with nothing "
                      "to do, times the phase's length, subtracted (net, floored at 0); per member figures are net",
    }
    if options.idle_s > 0:
        echo(f"idle {options.idle_s:g} s: the background writes' rate")
        window = Window.open(rig)
        time.sleep(options.idle_s)
        seconds = time.monotonic() - window.monotonic
        rig.background = rates(subtract(rig.counter.snapshot(), window.server), seconds)
        after = worker_calls(rig.calls_dir, rig.worker_pids())
        rig.background_calls = call_rates(
            merge_calls([calls_delta(after[pid], window.workers.get(pid, {})) for pid in after]), seconds)
    document["background_per_s"] = {"server": rig.background, "worker_calls": rig.background_calls}

    if options.width:
        timeout_s = options.timeout_s or 120 + 0.1 * options.width
        document["fan_out"] = fan_out(rig, options.width, time.monotonic() + timeout_s)
    if options.small:
        timeout_s = options.timeout_s or 120 + 0.2 * options.small
        document["chains"] = chains(rig, options.small, time.monotonic() + timeout_s)

    workers.stop()
    dispatchers.stop()
    done = workers.totals()["done"]
    document["steps_done"] = {"expected": rig.tasks_so_far, "done": done,
                              "by_worker": {m.name: m.latest()["done"] for m in workers.members}}
    document["workers"] = workers.describe()
    document["dispatchers"] = [{"name": m.name, "exit_code": m.process.returncode, "log": str(m.log_path),
                                "log_warnings": m.log_warnings()} for m in dispatchers.members]
    failures, warnings = workers.exit_problems()
    failures += [f"{m.name} exited with status {m.process.returncode}" for m in dispatchers.members
                 if m.process.returncode not in (0, None)]
    if done > rig.tasks_so_far:
        warnings.append(f"{done - rig.tasks_so_far:,} more steps done than created: repeats (a message delivered "
                        "again ran its step again)")
    if isinstance(rig.counter, SqliteWriteCounter) and (untracked := rig.counter.untracked()):
        warnings.append(f"tables made after the write counting began, not counted: {untracked}")
    warnings += [f"{w['name']} logged {w['log_warnings']['count']} warnings or errors, first: "
                 f"{w['log_warnings']['first'][0]}" for w in document["workers"] if w["log_warnings"]["count"]]
    document["warnings"] = warnings
    document["failures"] = failures


# Output.


def by_method(client: Mapping[str, Any], kind: str, items: str) -> str:
    """"insert 1 (1.01 items), claim 0.03, ...": net calls a member of each method of
    `kind`, and its items when they differ from its calls."""
    shown = []
    for name, row in client["by_method"].items():
        if row["kind"] != kind or row["calls_per_member"] < 0.005:
            continue
        text = f"{name.split('.', 1)[1]} {row['calls_per_member']:g}"
        if row["net_items"] != row["net_calls"]:
            text += f" ({row['items_per_member']:g} {items})"
        shown.append(text)
    return ", ".join(shown) or "none"


def summary(document: dict[str, Any]) -> list[str]:
    settings = document["settings"]
    lines = [f"workflows bench ({settings['backend']}): 1 dispatcher, {settings['workers']} workers x concurrency "
             f"{settings['concurrency']}, no-op steps"]

    def writes_lines(writes: Mapping[str, Any]) -> list[str]:
        client, server = writes["client"], writes["server"]
        methods, reads = by_method(client, "write", "items"), by_method(client, "read", "rows")
        per_member = server["net_per_member"]
        headline = server["headline_metric"]
        shown = ", ".join(f"{metric} {value:g}" for metric, value in per_member.items()
                          if metric == headline or not metric.startswith("rows_"))
        tables = ", ".join(f"{table} {entry[headline]['net'] / writes['members']:.2f}"
                           for table, entry in server["tables"].items()
                           if headline in entry and entry[headline]["net"] >= 0.5 and table != PAXOS)
        found = [
            f"  store write calls/member {client['write_calls_per_member']:g} (workers "
            f"{client['write_calls_per_member_workers']:g}, submit {client['write_calls_per_member_submitter']:g}): "
            f"{methods}",
            f"  store reads/member      {client['read_calls_per_member']:g} calls: {reads}",
            f"  in the store/member     {shown} (net of background; {headline} by table: {tables or 'none'})",
        ]
        if "paxos_net_per_member" in server:
            paxos = server["tables"][PAXOS]["partition_writes"]
            found.append(f"  Paxos mutations/member  {server['paxos_net_per_member']:g} (system.paxos, the whole "
                         f"cluster: raw {paxos['raw']:,}, background {paxos['background']:,.0f})")
        cores = writes["cpu"].get("cores", {})
        found.append("  cores over the phase    " + ", ".join(f"{k} {v}" for k, v in cores.items()))
        return found

    if "fan_out" in document:
        fan = document["fan_out"]
        t = fan["timeline_ms"]
        lines += [
            f"(a) fan-out/fan-in: part[{fan['width']:,}] -> join, {fan['members']:,} members",
            f"  end to end              {fan['end_to_end_ms']:,} ms from submit to succeeded (seen by the bench at "
            f"{t['seen_by_bench']:,} ms)",
            f"  timeline (ms)           submit returned {t['submit_returned']:,}, parts ended {t['first_part_ended']:,}"
            f"..{t['last_part_ended']:,}, join created {t['join_created']:,}, join ended {t['join_ended']:,}, "
            f"succeeded {t['succeeded']:,}",
            *writes_lines(fan["writes"]),
        ]
    if "chains" in document:
        ch = document["chains"]
        lat = ch["latency_ms"]
        lines += [
            f"(b) chains: {ch['workflows']:,} x (a -> b -> c) from {ch['submitters']} submitting threads",
            f"  workflows/s             {ch['workflows_per_s']} ({ch['steps_per_s']} steps/s) over "
            f"{ch['window_ms']:,} ms from the first submit to the last succeeded",
            f"  submits                 {ch['submit_s']} s ({ch['submits_per_s']}/s)",
            f"  latency submit->succeeded p50 {lat['p50']:,} / p90 {lat['p90']:,} / p99 {lat['p99']:,} / "
            f"max {lat['max']:,} ms",
            *writes_lines(ch["writes"]),
        ]
    if "steps_done" in document:
        steps = document["steps_done"]
        lines.append(f"steps done by worker: {', '.join(f'{k} {v:,}' for k, v in steps['by_worker'].items())} "
                     f"({steps['done']:,} of {steps['expected']:,} created, the warm-up's included)")
    lines += [f"  WARNING: {warning}" for warning in document.get("warnings", [])]
    lines += [f"  FAILED: {failure}" for failure in document.get("failures", [])]
    return lines


def interrupted(*_: Any) -> None:
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args, options = parse_args(argv)
    signal.signal(signal.SIGTERM, interrupted)  # so SIGTERM, too, stops the processes and cleans up
    work_dir = (options.work_dir or Path(tempfile.mkdtemp(prefix="workflows-bench-"))).resolve()
    work_dir.mkdir(parents=True, exist_ok=True)
    document: dict[str, Any] = {
        "command": [sys.executable, sys.argv[0], *argv],
        "timestamp": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": {"cpu_count": os.cpu_count(), "python": platform.python_version(),
                    "platform": platform.platform(), "loadavg": os.getloadavg()},
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(options).items()},
        "work_dir": str(work_dir),
    }
    cleanup: list[Callable[[], None]] = []
    code = 0
    try:
        run(options, work_dir, cleanup, document)
    except (StoreUnavailable, QueueUnavailable, CoordinatorUnavailable) as exc:
        echo(f"error: {exc}")
        code = 2
    except (SchedulerError, BenchFailure, KafkaException) as exc:
        echo(f"error: {exc}")
        code = 1
    except KeyboardInterrupt:
        echo("interrupted")
        code = 130
    finally:
        for step in reversed(cleanup):
            try:
                step()
            except Exception as exc:  # the rest of the cleanup goes on
                echo(f"warning: cleanup step failed: {exc}")
    if code == 0 and document.get("failures"):
        code = 1
    if not options.keep and options.work_dir is None and code == 0:
        shutil.rmtree(work_dir, ignore_errors=True)
        document["work_dir"] = None
    elif document["work_dir"]:
        echo(f"logs, stats files and call counts kept in {work_dir}")
    if "fan_out" not in document and "chains" not in document:
        return code
    for line in summary(document):
        print(line, file=sys.stderr if args.json else sys.stdout)
    text = json.dumps(document, indent=2)
    if args.out:
        args.out.write_text(text + "\n", encoding="utf-8")
    if args.json:
        print(text)
    return code


if __name__ == "__main__":
    sys.exit(main())
