"""Worker throughput bench: no-op tasks a second through one `scheduler worker` process,
status reports on.

What it measures
----------------
`--tasks` SMS tasks (default 100,000; ~`--payload-bytes` msgpack payloads, 80% for the
"board" tenant, the rest over `--tenants` colleges, as in the nine o'clock bench) are
stored in a fresh keyspace (or SQLite file) and their messages published straight to
the `normal` ready topic, as a dispatcher would (`encode_message`, `KafkaPublisher`):
all of it untimed. Then `--processes` (1) `scheduler worker --app bench.worker_app:app
--concurrency C` processes start and work through them: poll, check each batch against
the home rows (`statuses`), run the no-op `sms` handler, write `running` and `done`
statuses (the settler), commit. The bench follows the workers' stats files until they
show every task done and every status report durable, stops the workers (SIGTERM),
reads every handler start they recorded, and reads every task's home row back.

Figures:
- **tasks/s**: tasks / (moment every status was durable - first handler start), so the
  workers' start-up (imports, connections, joining the group) is left out. The stats
  file is written once a second, so the end is known to within a second: `tasks_per_s`
  takes its late end (a floor), `tasks_per_s_upper` its early end. With N processes the
  window starts once every one has started a handler, and counts the tasks started
  from then on. `handler_starts_per_s`: the same tasks over first to last handler start.
  `steady_per_s`: the `done` counter's rate from 10% to 90% of the tasks.
- **ceilings**, measured in the same run before the workers start: the consume ceiling
  (a bare confluent-kafka consumer reading the same N messages; embedded: plain sqlite3
  SELECTs of the queue) and the status-write ceiling (`store.record_status` from one
  thread in 5,000-report calls, on as many other stored tasks); the worker's rate as a
  share of each.
- **CPU**: the worker processes' CPU seconds in the window and per task, and the cores
  Cassandra, Kafka and the whole machine used meanwhile.
- **delivery**: handled = distinct tasks whose handler started (lost = tasks - handled,
  repeats counted); every task's home row must read `done`.

How to run
----------
    .venv/bin/python bench/worker_throughput.py --out /tmp/worker.json        # 100,000 tasks, real cluster
    .venv/bin/python bench/worker_throughput.py --backend embedded --tasks 20000
    .venv/bin/python bench/worker_throughput.py --processes 2 --concurrency 16
    .venv/bin/python bench/worker_throughput.py --tasks 2000 --json           # a quick check

Servers are found as the scheduler finds them (`SCHEDULER_CASSANDRA_HOSTS`, ...). The
keyspace and topics (or SQLite files) are removed at the end unless `--keep`; workers
are always stopped. Exit status: 0 ran (missed targets are listed), 1 a task lost or not
`done`, a worker failed, 2 a server unreachable, 130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaException

from scheduler.errors import CoordinatorUnavailable, QueueUnavailable, SchedulerError, StoreUnavailable

ROOT = str(Path(__file__).resolve().parents[1])
if ROOT not in sys.path:
    sys.path.append(ROOT)

from bench.nine.ceiling import (
    home_check_ceiling,
    kafka_consume_ceiling,
    sqlite_read_ceiling,
    status_write_ceiling,
)
from bench.nine.common import BenchFailure, echo, now_ms
from bench.nine.deployment import Deployment, Profiler
from bench.nine.proc import cpu_snapshot, cpu_window, server_pids
from bench.nine.report import percentile
from bench.nine.settings import SHARDS, TASK_TYPE
from bench.nine.workers import Handled, WorkerFleet, all_settled, read_records, tally
from bench.nine.workload import Burst, text_length_for
from bench.scraper import Scraper
from bench.scraper import summary as scraper_summary
from bench.worker_app import HANDLER_MS_ENV
from scheduler.model import BUCKET_MS, DEFAULT_MAX_ATTEMPTS, Priority, Task, TaskId, encode_message, encode_payload
from scheduler.ports import Publisher, TaskStore
from scheduler.settings import KafkaSettings

TARGET_TASKS_PER_S = 20_000
"""Per worker process, no-op handler, status reports on."""
READY = "normal"
"""The ready topic the tasks go to (they are all of normal priority, as the SMS burst is)."""
FENCE = 1
POLL_S = 0.1
GET_MANY_IDS = 5000


@dataclass(frozen=True)
class Options:
    backend: str
    tasks: int
    concurrency: int
    processes: int
    payload_bytes: int
    tenants: int
    ceiling_tasks: int
    timeout_s: float
    keep: bool
    work_dir: Path | None
    py_spy: Path | None
    metrics: bool = False
    handler_ms: int = 0


def parse_args(argv: Sequence[str]) -> tuple[argparse.Namespace, Options]:
    parser = argparse.ArgumentParser(
        description="No-op tasks a second through `scheduler worker` processes, status reports on: tasks stored "
                    "and published beforehand, then timed from the first handler start until every status is "
                    "durable; next to the consume and status-write ceilings measured in the same run.",
        epilog="Servers: SCHEDULER_CASSANDRA_HOSTS, SCHEDULER_CASSANDRA_PORT, SCHEDULER_KAFKA_BOOTSTRAP (default: "
               "the local cluster). Exit status: 0 ran (see 'missed'), 1 a task lost or not done or a worker "
               "failed, 2 a server unreachable, 130 interrupted.")
    parser.add_argument("--backend", choices=("cassandra", "embedded"), default="cassandra",
                        help="cassandra: the real Cassandra and Kafka (default); embedded: SQLite files")
    parser.add_argument("--tasks", type=int, default=100_000, help="tasks to work through (default 100,000)")
    parser.add_argument("--concurrency", type=int, default=8,
                        help="--concurrency of each worker: handlers at once (default 8, the worker's default)")
    parser.add_argument("--processes", type=int, default=1, help="worker processes (1-8, default 1)")
    parser.add_argument("--payload-bytes", type=int, default=100, help="encoded payload size, about (default 100)")
    parser.add_argument("--tenants", type=int, default=1000, help="colleges beside the board (default 1,000)")
    parser.add_argument("--ceiling-tasks", type=int, default=50_000,
                        help="tasks of the status-write ceiling, at most --tasks (default 50,000)")
    parser.add_argument("--timeout-s", type=float,
                        help="give up when the workers have not finished after this long (default 120 s plus "
                             "1 s per 500 tasks)")
    parser.add_argument("--out", type=Path, help="write the JSON document to this file")
    parser.add_argument("--json", action="store_true", help="print the JSON document on stdout (summary on stderr)")
    parser.add_argument("--keep", action="store_true", help="keep the keyspace, topics, files and work directory")
    parser.add_argument("--work-dir", type=Path,
                        help="worker logs, stats and records (default: a temporary directory, removed at the end "
                             "unless --keep or something failed)")
    parser.add_argument("--py-spy", type=Path, metavar="DIR",
                        help="record each worker with py-spy (raw collapsed stacks, by thread) into DIR")
    parser.add_argument("--handler-ms", type=int, default=0,
                        help="each task's handler waits this long (async, like a provider call; use a --concurrency "
                             "of hundreds); default 0, a no-op")
    parser.add_argument("--metrics", action="store_true",
                        help="start every worker with --metrics-port 0 and scrape it every second, as Prometheus "
                             "would: measures what the metrics cost (run with and without it, alternately)")
    args = parser.parse_args(argv)
    if args.tasks < 1 or not 1 <= args.processes <= 8 or not 1 <= args.concurrency <= 1024:
        parser.error("--tasks must be positive, --processes 1 to 8, --concurrency 1 to 1024")
    if args.payload_bytes < 0 or args.tenants < 1 or args.ceiling_tasks < 0 or args.handler_ms < 0:
        parser.error("--payload-bytes >= 0, --tenants >= 1, --ceiling-tasks >= 0, --handler-ms >= 0")
    timeout_s = args.timeout_s if args.timeout_s is not None else 120 + args.tasks / 500
    return args, Options(args.backend, args.tasks, args.concurrency, args.processes, args.payload_bytes,
                         args.tenants, min(args.ceiling_tasks, args.tasks), timeout_s, args.keep, args.work_dir,
                         args.py_spy, args.metrics, args.handler_ms)


# The backends: where the tasks are stored and published, and how the workers find them.


@dataclass
class Backend:
    store: TaskStore
    publisher: Publisher
    topic: str
    worker_args: list[str]
    env: dict[str, str]
    consume_ceiling: Callable[[int], dict[str, Any]]
    describe: dict[str, Any]


def cassandra_backend(options: Options, cleanup: list[Callable[[], None]]) -> Backend:
    from scheduler.adapters.cassandra.connection import connect
    from scheduler.adapters.cassandra.store import CassandraTaskStore
    from scheduler.adapters.kafka.publisher import KafkaPublisher

    deployment = Deployment.fresh("worker_throughput")
    connection = connect(deployment.cassandra)
    cleanup.append(connection.close)
    deployment.create(connection, cleanup, options.keep)
    store = CassandraTaskStore.open(deployment.cassandra)
    cleanup.append(store.close)
    publisher = KafkaPublisher(deployment.kafka, client_id="worker-bench")
    cleanup.append(publisher.close)
    topic = deployment.kafka.ready_topic(READY)
    return Backend(
        store, publisher, topic, ["--backend", "cassandra"], {**os.environ, **deployment.env()},
        lambda expected: kafka_consume_ceiling(deployment.kafka, topic, expected),
        {"backend": "cassandra", "keyspace": deployment.cassandra.keyspace,
         "topic_prefix": deployment.kafka.topic_prefix, "kept": options.keep},
    )


def embedded_backend(options: Options, work_dir: Path, cleanup: list[Callable[[], None]]) -> Backend:
    from scheduler.adapters.embedded.queue import SqliteQueue
    from scheduler.adapters.embedded.store import SqliteTaskStore

    kafka = KafkaSettings()  # the default topic names: the files are the run's own
    db = (work_dir / "data" / "tasks.db").resolve()
    store = SqliteTaskStore(db, shard_count=SHARDS)
    cleanup.append(store.close)
    queue = SqliteQueue(db.with_name("queue.db"), handoff_topic=kafka.handoff_topic)
    cleanup.append(queue.close)
    topic = kafka.ready_topic(READY)
    env = {**os.environ, "SCHEDULER_TOPIC_PREFIX": kafka.topic_prefix, "SCHEDULER_SHARDS_TOTAL": str(SHARDS)}
    return Backend(
        store, queue.publisher(), topic, ["--backend", "embedded", "--db", str(db)], env,
        lambda expected: sqlite_read_ceiling(db.with_name("queue.db"), topic, expected, batch=500),
        {"backend": "embedded", "db": str(db), "kept": options.keep},
    )


# One run.


def make_tasks(burst: Burst, seed: int, count: int) -> list[Task]:
    return [Task.unchecked(TaskId.new(run_at_ms), tenant, TASK_TYPE, encode_payload(payload), run_at_ms,
                           Priority.NORMAL, 1, DEFAULT_MAX_ATTEMPTS, None)
            for run_at_ms, tenant, payload in burst.records(seed, count)]


def store_tasks(store: TaskStore, tasks: Sequence[Task]) -> float:
    started = time.monotonic()
    failures = store.insert(tasks)
    if failures:
        raise BenchFailure(f"{sum(len(f.tasks) for f in failures):,} tasks were not stored: {failures[0].reason}")
    return time.monotonic() - started


def publish(publisher: Publisher, topic: str, tasks: Sequence[Task]) -> float:
    started = time.monotonic()
    for start in range(0, len(tasks), 10_000):
        publisher.publish(topic, [encode_message(task, FENCE) for task in tasks[start:start + 10_000]])
    publisher.flush(120)
    return time.monotonic() - started


def home_statuses(store: TaskStore, ids: Sequence[TaskId]) -> dict[str, int]:
    """How many of `ids` have each status on their home row (`missing`: no row)."""
    statuses: Counter[str] = Counter()
    for start in range(0, len(ids), GET_MANY_IDS):
        chunk = ids[start:start + GET_MANY_IDS]
        found = store.get_many(chunk)
        statuses["missing"] += len(chunk) - len(found)
        statuses.update(stored.status.value for stored in found.values())
    return {status: count for status, count in sorted(statuses.items()) if count}


def measured(servers: dict[str, int], ceiling: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """A ceiling's figures, with the CPU seconds the bench and the servers spent on it."""
    pids = {**servers, "bench": os.getpid()}
    before, started = cpu_snapshot(pids), time.monotonic()
    figures = ceiling()
    cpu = cpu_window(before, cpu_snapshot(pids), time.monotonic() - started)
    per_op = {name: round(seconds / figures["operations"] * 1e6, 1) for name, seconds in cpu["cpu_s"].items()
              if name != "machine" and figures.get("operations")}
    return {**figures, "cpu": cpu, "cpu_us_per_operation": per_op}


def run(options: Options, cleanup: list[Callable[[], None]], document: dict[str, Any]) -> None:
    work_dir = options.work_dir or Path(tempfile.mkdtemp(prefix="worker-throughput-"))
    work_dir.mkdir(parents=True, exist_ok=True)
    document["work_dir"] = str(work_dir)
    servers = server_pids() if options.backend == "cassandra" else {}
    if options.backend == "cassandra":
        backend = cassandra_backend(options, cleanup)
    else:
        backend = embedded_backend(options, work_dir, cleanup)
    document["deployment"] = backend.describe
    echo(f"deployment: {backend.describe}; logs in {work_dir}")

    minute_ms = now_ms() // BUCKET_MS * BUCKET_MS
    burst = Burst(minute_ms, options.tasks, 10_000, text_length_for(options.payload_bytes), options.tenants)
    tasks = make_tasks(burst, 1, options.tasks)
    others = make_tasks(burst, 2, options.ceiling_tasks)
    echo(f"storing {len(tasks):,} tasks (+{len(others):,} for the check and status-write ceilings) ...")
    setup: dict[str, Any] = {"store_s": round(store_tasks(backend.store, tasks), 2)}
    if others:
        store_tasks(backend.store, others)
    setup["publish_s"] = round(publish(backend.publisher, backend.topic, tasks), 2)
    setup["message_bytes_mean"] = round(sum(len(encode_message(t, FENCE)) for t in tasks[:2000])
                                        / min(2000, len(tasks)), 1)
    document["setup"] = setup
    echo(f"stored in {setup['store_s']} s, published to {backend.topic} in {setup['publish_s']} s; ceilings ...")
    ceilings: dict[str, Any] = {"consume": measured(servers, lambda: backend.consume_ceiling(len(tasks)))}
    if others:
        ids = [task.id for task in others]
        ceilings["home_check"] = measured(servers, lambda: home_check_ceiling(backend.store, ids))
        ceilings["status_write"] = measured(servers, lambda: status_write_ceiling(backend.store, ids))
    del others
    document["ceilings"] = ceilings
    echo(f"consume ceiling {ceilings['consume']['msgs_per_s'] or 'n/a'} msgs/s"
         + (f", status-write ceiling {ceilings['status_write']['reports_per_s']} reports/s"
            if "status_write" in ceilings else ""))

    fleet = WorkerFleet({**backend.env, HANDLER_MS_ENV: str(options.handler_ms)}, work_dir, backend.worker_args)
    profiler = Profiler(options.py_spy, fleet)

    def stop_workers() -> None:
        fleet.stop()

    cleanup.append(stop_workers)
    pids: dict[str, int] = dict(servers)
    cpu_timeline: list[tuple[int, dict[str, float]]] = []
    started_ms = now_ms()
    fleet.start(options.processes, options.concurrency, extra=["--metrics-port", "0"] if options.metrics else [])
    scraper = Scraper([(m.name, m.log_path.read_text) for m in fleet.members]).start() if options.metrics else None
    pids.update({member.name: member.process.pid for member in fleet.members})
    profiler.start("run")
    echo(f"workers: {options.processes} x concurrency {options.concurrency} started")
    deadline = time.monotonic() + options.timeout_s
    last_echo = 0.0
    try:
        while True:
            fleet.check_alive()
            fleet.poll()
            cpu_timeline.append((now_ms(), cpu_snapshot(pids)))
            totals = fleet.totals()
            if all_settled(totals, options.tasks):
                break
            if time.monotonic() > deadline:
                raise BenchFailure(f"the workers did not finish {options.tasks:,} tasks in {options.timeout_s:.0f} "
                                   f"s: {totals}")
            if time.monotonic() - last_echo >= 5:
                last_echo = time.monotonic()
                echo(f"  {totals['done']:,} done, {totals['received']:,} received")
            time.sleep(POLL_S)
    finally:
        profiler.stop()
        if scraper is not None:
            scraper.stop()
            document["metrics"] = scraper.figures()
            echo(scraper_summary(document["metrics"]))
    cpu_end = cpu_timeline[-1]
    fleet.stop()
    records = read_records(fleet.records_dir)
    echo("workers stopped; reading every home row back ...")
    statuses = home_statuses(backend.store, [task.id for task in tasks])

    result = figures(options, fleet, records, [task.id.bytes for task in tasks], cpu_timeline, cpu_end, started_ms)
    result["home_rows"] = statuses
    written = fleet.totals()["reports_written"]
    result["status_writes"] = {"reports_written": written, "per_task": round(written / options.tasks, 3)}
    result["ceilings"] = ceilings
    throughput = result["throughput"]
    for name, key, ceiling_key in (("consume", "vs_consume_ceiling", "msgs_per_s"),
                                   ("home_check", "vs_home_check_ceiling", "ids_per_s"),
                                   ("status_write", "vs_status_write_ceiling", "reports_per_s")):
        if name in ceilings and throughput.get("tasks_per_s") and ceilings[name].get(ceiling_key):
            throughput[key] = round(throughput["tasks_per_s"] / ceilings[name][ceiling_key], 3)
    document.update(result)
    document["workers"] = fleet.describe()
    if profiler.files:
        document["py_spy"] = profiler.files
    servers_now = server_pids() if servers else {}
    document["warnings"] = [f"{name} restarted during the run (pid {pid} -> {servers_now.get(name)}): figures "
                            "are suspect" for name, pid in servers.items() if servers_now.get(name) != pid]
    document["warnings"] += [f"{w['name']} logged {w['log_warnings']['count']} warnings or errors, first: "
                             f"{w['log_warnings']['first'][0]}" for w in document["workers"]
                             if w["log_warnings"]["count"]]
    shares = result["delivery"]["by_process"]
    if options.processes > 1 and (len(shares) < options.processes
                                  or min(shares.values()) < 0.5 * options.tasks / options.processes):
        document["warnings"].append(
            f"uneven work: handler starts by process {shares} (the group assigns partitions, not tasks: a process "
            "given no partition of the topic that holds the tasks gets nothing)")
    per_process = throughput.get("tasks_per_s_per_process")
    document["targets"] = [
        {"figure": "tasks/s per worker process", "value": per_process, "target": f">= {TARGET_TASKS_PER_S:,}",
         "met": None if per_process is None else per_process >= TARGET_TASKS_PER_S},
        {"figure": "lost", "value": result["delivery"]["lost"], "target": "0", "met": result["delivery"]["lost"] == 0},
        {"figure": "home rows not done", "value": options.tasks - statuses.get("done", 0), "target": "0",
         "met": statuses.get("done", 0) == options.tasks},
    ]
    document["missed"] = [check["figure"] for check in document["targets"] if check["met"] is False]
    failures, exit_warnings = fleet.exit_problems()
    document["warnings"] += exit_warnings
    if result["delivery"]["lost"]:
        failures.append(f"{result['delivery']['lost']:,} tasks were never handled")
    if statuses.get("done", 0) != options.tasks:
        failures.append(f"home rows: {statuses} (every one of the {options.tasks:,} should be done)")
    document["failures"] = failures


def figures(options: Options, fleet: WorkerFleet, records: list[Handled], expected: list[bytes],
            cpu_timeline: list[tuple[int, dict[str, float]]], cpu_end: tuple[int, dict[str, float]],
            started_ms: int) -> dict[str, Any]:
    """Throughput, CPU and delivery from the records, the stats files and the CPU samples."""
    counted = tally(records, expected)
    starts = sorted(counted.first_start.values())
    by_process: dict[int, int] = {}
    for record in records:
        by_process[record.pid] = min(by_process.get(record.pid, record.start_ms), record.start_ms)
    result: dict[str, Any] = {"delivery": counted.figures()}
    bounds = fleet.settled_between(options.tasks)
    if not starts or bounds is None:
        result["throughput"] = {}
        return result
    window_start = max(by_process.values()) if options.processes > 1 else starts[0]
    in_window = len(starts) - sum(1 for start in starts if start < window_start)
    settled_after, settled_at = bounds
    early_end = max(settled_after, starts[-1])
    throughput: dict[str, Any] = {
        "tasks": in_window,
        "startup_ms": starts[0] - started_ms,
        "first_start_by_process_ms": {str(pid): ms - started_ms for pid, ms in sorted(by_process.items())},
        "window_ms": settled_at - window_start,
        "settled_within_ms": [early_end - window_start, settled_at - window_start],
        "tasks_per_s": rate(in_window, settled_at - window_start),
        "tasks_per_s_upper": rate(in_window, early_end - window_start),
        "handler_starts_per_s": rate(in_window, starts[-1] - window_start),
        "steady_per_s": steady_rate(fleet, options.tasks, starts[0]),
    }
    if throughput["tasks_per_s"] is not None:
        throughput["tasks_per_s_per_process"] = round(throughput["tasks_per_s"] / options.processes)
    before = [snapshot for at_ms, snapshot in cpu_timeline if at_ms <= window_start] or [cpu_timeline[0][1]]
    window = cpu_window(before[-1], cpu_end[1], (settled_at - window_start) / 1000)
    workers_cpu = sum(window["cpu_s"].get(member.name, 0.0) for member in fleet.members)
    throughput["cpu"] = {
        **window,
        "workers_cpu_s": round(workers_cpu, 2),
        "workers_cpu_us_per_task": round(workers_cpu / in_window * 1e6, 1) if in_window else None,
        "workers_cpu_s_total": round(sum(cpu_end[1].get(member.name, 0.0) for member in fleet.members), 2),
    }
    result["throughput"] = throughput
    result["timeline"] = [{"after_start_ms": point["at_ms"] - started_ms, "worker": member.name,
                           **{k: v for k, v in point.items() if k != "at_ms"}}
                          for member in fleet.members for point in member.timeline]
    gaps = [b - a for a, b in zip(starts, starts[1:], strict=False)]
    result["handler_start_gaps_ms"] = {"p50": percentile(sorted(gaps), 0.5), "p99": percentile(sorted(gaps), 0.99),
                                       "max": max(gaps) if gaps else None}
    return result


def rate(count: int, span_ms: int) -> int | None:
    return round(count / (span_ms / 1000)) if span_ms > 0 else None


def steady_rate(fleet: WorkerFleet, tasks: int, first_start_ms: int) -> int | None:
    """`done` a second from 10% to 90% of the tasks, interpolated on the merged stats
    timelines (from 0 done at the first handler start); None when that stretch is under
    1.5 s, too short for stats written once a second."""
    events = sorted((point["at_ms"], n, point["done"]) for n, m in enumerate(fleet.members) for point in m.timeline
                    if point["at_ms"] > first_start_ms)
    latest: dict[int, int] = {}
    curve: list[tuple[int, int]] = [(first_start_ms, 0)]
    for at_ms, n, done in events:
        latest[n] = done
        curve.append((at_ms, sum(latest.values())))

    def crossing(level: float) -> float | None:
        for (t0, d0), (t1, d1) in zip(curve, curve[1:], strict=False):
            if d0 < level <= d1:
                return t0 + (t1 - t0) * (level - d0) / (d1 - d0)
        return None

    low, high = crossing(0.1 * tasks), crossing(0.9 * tasks)
    if low is None or high is None or high - low < 1500:
        return None
    return round(0.8 * tasks / ((high - low) / 1000))


# Output.


def summary(document: dict[str, Any]) -> list[str]:
    settings, through = document["settings"], document.get("throughput", {})
    delivery, ceilings = document["delivery"], document["ceilings"]

    def number(value: Any, unit: str = "") -> str:
        if value is None:
            return "n/a"
        return f"{value:,}{unit}" if isinstance(value, int) else f"{value:,.2f}{unit}"

    def share(value: float | None) -> str:
        return "n/a" if value is None else f"{value * 100:.1f}%"

    cpu = through.get("cpu", {})
    cores = cpu.get("cores", {})
    server_s = cpu.get("cpu_s", {}).get("cassandra")
    server_per_task = (f"; Cassandra {server_s / through['tasks'] * 1e6:,.0f} us a task"
                       if server_s is not None and through.get("tasks") else "")
    lines = [
        f"worker throughput: {settings['tasks']:,} "
        + (f"{settings['handler_ms']} ms" if settings.get("handler_ms") else "no-op")
        + f" tasks, {settings['processes']} worker process(es) x "
        f"concurrency {settings['concurrency']}, backend {settings['backend']}",
        f"  tasks/s                 {number(through.get('tasks_per_s'))} (up to {number(through.get('tasks_per_s_upper'))}"
        f"; stats once a second), per process {number(through.get('tasks_per_s_per_process'))}",
        f"  handler starts/s        {number(through.get('handler_starts_per_s'))}; steady (10-90%) "
        f"{number(through.get('steady_per_s'))}",
        f"  window                  {number(through.get('window_ms'), ' ms')} from the first handler start "
        f"({number(through.get('startup_ms'), ' ms')} of start-up left out)",
        f"  consume ceiling         {number(ceilings['consume']['msgs_per_s'])} msgs/s "
        f"({', '.join(f'{r / 1000:.0f}k' for r in ceilings['consume']['runs'])}); worker at "
        f"{share(through.get('vs_consume_ceiling'))} of it",
    ]
    for name, label, unit, ratio in (("home_check", "home-row check ceiling", "ids/s", "vs_home_check_ceiling"),
                                     ("status_write", "status-write ceiling  ", "reports/s",
                                      "vs_status_write_ceiling")):
        if name in ceilings:
            ceiling = ceilings[name]
            rate_key = "ids_per_s" if name == "home_check" else "reports_per_s"
            server = ceiling["cpu_us_per_operation"].get("cassandra")
            lines.append(f"  {label}  {number(ceiling[rate_key])} {unit} "
                         f"({', '.join(f'{r / 1000:.0f}k' for r in ceiling['runs'])}); worker at "
                         f"{share(through.get(ratio))} of it"
                         + (f"; Cassandra {server} us CPU each" if server is not None else ""))
    lines += [
        f"  worker CPU              {number(cpu.get('workers_cpu_s'), ' s')} in the window, "
        f"{number(cpu.get('workers_cpu_us_per_task'), ' us')} a task; {number(cpu.get('workers_cpu_s_total'), ' s')} "
        f"with start-up{server_per_task}",
        "  cores in the window     " + (", ".join(f"{k} {v}" for k, v in cores.items()) or "n/a"),
        f"  status writes           {number(document['status_writes']['reports_written'])} reports, "
        f"{document['status_writes']['per_task']} a task",
        f"  delivery                handled {delivery['handled']:,} of {delivery['expected']:,}, lost "
        f"{delivery['lost']:,}, repeated {delivery['duplicated_tasks']:,}; home rows {document['home_rows']}",
        "  targets missed:         " + (", ".join(
            f"{c['figure']} ({number(c['value'])}; target {c['target']})" for c in document["targets"]
            if c["met"] is False) or "none"),
    ]
    lines += [f"  WARNING: {warning}" for warning in document["warnings"]]
    lines += [f"  FAILED: {failure}" for failure in document["failures"]]
    return lines


def interrupted(*_: Any) -> None:
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args, options = parse_args(argv)
    signal.signal(signal.SIGTERM, interrupted)
    document: dict[str, Any] = {
        "command": [sys.executable, sys.argv[0], *argv],
        "timestamp": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": {"cpu_count": os.cpu_count(), "python": platform.python_version(),
                    "platform": platform.platform(), "loadavg": os.getloadavg()},
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(options).items()},
    }
    cleanup: list[Callable[[], None]] = []
    code = 0
    try:
        run(options, cleanup, document)
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
            step()
    if code == 0 and document.get("failures"):
        code = 1
    work_dir = document.get("work_dir")
    if work_dir and not options.keep and options.work_dir is None:
        if code == 0:
            shutil.rmtree(work_dir, ignore_errors=True)
            document["work_dir"] = None
        else:
            echo(f"worker logs, stats and records kept in {work_dir}")
    if "targets" not in document:
        return code
    text = json.dumps(document, indent=2)
    for line in summary(document):
        print(line, file=sys.stderr if args.json else sys.stdout)
    if args.out:
        args.out.write_text(text + "\n", encoding="utf-8")
    if args.json:
        print(text)
    return code


if __name__ == "__main__":
    sys.exit(main())
