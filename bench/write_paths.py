"""Write-paths bench: every way a task reaches the store, due from a minute ago to
seconds ahead, fired by a real `scheduler dispatcher` and run by a real `scheduler
worker`; and cancels of tasks in the dispatcher's wheel and in the ready topics.

What it measures
----------------
On a deployment of its own (`--backend cassandra`: a keyspace, topics and ZooKeeper root
on the real servers; `--backend embedded`: the SQLite files in a directory), with one
dispatcher (`--sweep-interval`, default 2 s) and one worker (`--worker-concurrency`)
running the test application `tests.worker.apps:app`, whose handlers record each start
in a SQLite sink:

1. Writes (`bench/writes/scenario.py`): `--tasks` tasks per SDK path (scheduler.connect,
   a Client(store) without hand-off, a straight store.insert of a Task) and due offset
   (-60, -30, -5, -1, 0, +0.5, +2, +5 s from the moment each is written), `--cli-tasks`
   `scheduler submit` processes per offset, and `--schedules` schedules of every minute
   added with `scheduler schedule add` (the run of each one's next slot). For each task:
   did it run, was it ever started or published before its run_at, and its lateness,
   first handler start - max(run_at, acknowledged), against the bound the design states
   plus the worker's pickup and a load margin (`bench/writes/figures.py`).
2. Cancels (`bench/writes/cancelling.py`), with a second worker of concurrency 1 and
   `--check never` in place of the first: `--cancel-tasks` tasks per group (in the wheel,
   or already published while the worker is held by a blocking task), written through
   connect and Client(store), cancelled through connect, Client(store) and `scheduler
   cancel`, some kept. For each: the answer, whether it was published, whether it
   started, and whether it started after the cancel answered (the promise: never).

It prints the table "write path x due offset -> acknowledged / ran / lateness p50, p99,
max" and the cancel table, and writes everything to `--out`: the figures, every task
that missed (never ran, early, over its bound), and every task and cancel with its
timings (`tasks`, `cancels.cases`).

How to run
----------
    .venv/bin/python bench/write_paths.py --backend embedded --out /tmp/write-paths-embedded.json
    .venv/bin/python bench/write_paths.py --backend cassandra --out /tmp/write-paths-cassandra.json
    .venv/bin/python bench/write_paths.py --help

Exit status: 0 every acknowledged task ran, none early, no cancelled task started (tasks
over their bound are listed, not fatal: the bound is a statement about a loaded machine),
1 otherwise or when a process or a write failed, 2 a server could not be reached, 130
interrupted (the processes are stopped and the deployment removed all the same).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import secrets
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

# Run as a script, only bench/ itself is on the path: the parts are imported as the
# package `bench`, from the repository root.
ROOT = str(Path(__file__).resolve().parents[1])
if ROOT not in sys.path:
    sys.path.append(ROOT)

from bench.nine.common import BenchFailure, echo, now_ms
from bench.nine.deployment import BenchProcess, Deployment, stop_all
from bench.writes.cancelling import ScenarioFailure, run_cancels
from bench.writes.figures import cancel_figures, cancel_table, describe_case, write_figures, write_table
from bench.writes.scenario import PATHS, SINK_ENV, WORKER_APP, Plan, producers, run_writes
from scheduler.adapters.cassandra.connection import connect
from scheduler.errors import CoordinatorUnavailable, QueueUnavailable, SchedulerError, StoreUnavailable
from tests.worker.apps import Sink

START_TIMEOUT_S = 60
STOP_TIMEOUT_S = 30
GRACE_MS = 30_000
"""How long past its bound a task that has not started is waited for."""


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Every write path (scheduler.connect, Client(store) without hand-off, store.insert, "
                    "scheduler submit, scheduler schedule add) at due offsets from -60 s to +5 s, fired by a real "
                    "dispatcher and run by a real worker: acknowledged, ran, early, lateness against the stated "
                    "bound; and cancels in the wheel and in the ready topics: started after the cancel answered.",
        epilog="Servers (--backend cassandra): SCHEDULER_CASSANDRA_HOSTS, SCHEDULER_CASSANDRA_PORT, "
               "SCHEDULER_KAFKA_BOOTSTRAP, SCHEDULER_ZOOKEEPER_HOSTS (default: the local cluster). Exit status: 0 "
               "nothing lost, early or started after its cancel; 1 otherwise; 2 a server unreachable; 130 interrupted.")
    parser.add_argument("--backend", choices=("cassandra", "embedded"), default="cassandra",
                        help="cassandra: the real Cassandra, Kafka and ZooKeeper (default); embedded: the SQLite "
                             "backend in the work directory")
    parser.add_argument("--tasks", type=int, default=20,
                        help="tasks per SDK path and due offset (default 20)")
    parser.add_argument("--cli-tasks", type=int, default=3,
                        help="`scheduler submit` processes per due offset (default 3: each costs a core for a "
                             "second or two)")
    parser.add_argument("--schedules", type=int, default=5,
                        help="schedules of every minute added with `scheduler schedule add` (default 5)")
    parser.add_argument("--cancel-tasks", type=int, default=5,
                        help="cancel scenario: tasks per group, write path and cancel path (default 5; 0: no "
                             "cancels)")
    parser.add_argument("--sweep-interval", type=float, default=2.0,
                        help="the dispatcher's --sweep-interval in seconds (default 2; the scheduler's own default "
                             "is 20)")
    parser.add_argument("--worker-concurrency", type=int, default=8,
                        help="--concurrency of the worker of the writes (default 8; the cancels' worker has 1)")
    parser.add_argument("--cli-parallel", type=int, default=2,
                        help="`scheduler` processes at once (default 2)")
    parser.add_argument("--out", type=Path, help="write the JSON document to this file")
    parser.add_argument("--json", action="store_true", help="print the JSON document on stdout (tables on stderr)")
    parser.add_argument("--keep", action="store_true", help="keep the deployment and the work directory")
    parser.add_argument("--work-dir", type=Path,
                        help="logs, stats files, the sink (and the embedded backend's files); default: a temporary "
                             "directory, removed at the end unless --keep or something failed")
    args = parser.parse_args(argv)
    if min(args.tasks, args.cli_tasks, args.schedules, args.cancel_tasks) < 0 or args.tasks + args.cli_tasks < 1:
        parser.error("--tasks, --cli-tasks, --schedules, --cancel-tasks must not be negative, and some tasks written")
    if not 1 <= args.sweep_interval <= 600 or not 1 <= args.worker_concurrency <= 1024 or args.cli_parallel < 1:
        parser.error("--sweep-interval 1 to 600, --worker-concurrency 1 to 1024, --cli-parallel at least 1")
    return args


class Backend:
    """Where the run's tasks are, and the variables that tell the processes."""

    def __init__(self, name: str, directory: Path) -> None:
        self.name = name
        self.directory = directory
        self.deployment = Deployment.fresh("write_paths") if name == "cassandra" else None

    def create(self, cleanup: list[Callable[[], None]], keep: bool) -> dict[str, str]:
        if self.deployment is None:
            from scheduler.adapters.embedded.queue import SqliteQueue
            from scheduler.adapters.embedded.store import SqliteTaskStore

            db = self.directory / "db" / "tasks.db"
            db.parent.mkdir(parents=True)
            SqliteTaskStore(db).close()  # the tables, before the processes race to make them
            SqliteQueue(db.with_name("queue.db")).close()
            return {"SCHEDULER_BACKEND": "embedded", "SCHEDULER_DB": str(db)}
        connection = connect(self.deployment.cassandra)
        cleanup.append(connection.close)
        self.deployment.create(connection, cleanup, keep, log_append_time=False)
        return self.deployment.env()

    def describe(self) -> dict[str, Any]:
        d = self.deployment
        if d is None:
            return {"backend": self.name, "directory": str(self.directory / "db")}
        return {"backend": self.name, "keyspace": d.cassandra.keyspace, "topic_prefix": d.kafka.topic_prefix,
                "zookeeper_root": d.zookeeper.root, "ready_timestamps": "CreateTime (the dispatcher's publish)"}


class Processes:
    """The dispatcher and the workers of a run, stopped on every way out."""

    def __init__(self, env: dict[str, str], directory: Path) -> None:
        self.env = {**os.environ, **env, SINK_ENV: str(directory / "sink.db")}
        self.directory = directory
        self.started: list[BenchProcess] = []

    def start(self, name: str, *arguments: str) -> BenchProcess:
        process = BenchProcess.start(name, [*arguments, "--member", name], self.directory, self.env)
        self.started.append(process)
        return process

    def wait(self, process: BenchProcess, ready: Callable[[dict[str, Any]], bool]) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not ready(process.stats()):
            if not process.alive():
                raise process.died()
            if time.monotonic() > deadline:
                raise BenchFailure(f"{process.name} was not ready within {START_TIMEOUT_S} s:\n{process.log_tail()}")
            time.sleep(0.2)

    def dispatcher(self, sweep_interval_s: float) -> BenchProcess:
        process = self.start("dispatcher", "dispatcher", "--shards", "auto", "--sweep-interval", f"{sweep_interval_s:g}")
        self.wait(process, lambda stats: len(stats.get("shards", [])) == 64)
        return process

    def worker(self, name: str, concurrency: int, *arguments: str) -> BenchProcess:
        process = self.start(name, "worker", "--app", WORKER_APP, "--concurrency", str(concurrency), *arguments)
        self.wait(process, bool)
        return process

    def stop(self, processes: Sequence[BenchProcess] | None = None) -> list[int | None]:
        chosen = list(self.started if processes is None else processes)
        return stop_all([p for p in chosen if p.alive()], STOP_TIMEOUT_S)

    def describe(self) -> list[dict[str, Any]]:
        return [{"name": p.name, "pid": p.process.pid, "exit_code": p.process.returncode, "log": str(p.log_path),
                 "warnings": p.log_warnings()} for p in self.started]


def run(args: argparse.Namespace, directory: Path, cleanup: list[Callable[[], None]],
        document: dict[str, Any]) -> None:
    backend = Backend(args.backend, directory)
    env = backend.create(cleanup, args.keep)
    document["deployment"] = backend.describe()
    processes = Processes(env, directory)

    def stop_processes() -> None:
        processes.stop()

    cleanup.append(stop_processes)
    sink = Sink(directory / "sink.db")
    cleanup.append(sink.close)
    sweep_ms = round(args.sweep_interval * 1000)
    plan = Plan(per_cell=args.tasks, cli_per_offset=args.cli_tasks, schedules=args.schedules,
                cli_parallel=args.cli_parallel)
    document["plan"] = {"per_cell": plan.per_cell, "cli_per_offset": plan.cli_per_offset,
                        "schedules": plan.schedules, "offsets_ms": list(plan.offsets_ms),
                        "cancel_tasks": args.cancel_tasks, "sweep_interval_ms": sweep_ms,
                        "worker_concurrency": args.worker_concurrency}

    echo(f"{args.backend}: starting a dispatcher (--sweep-interval {args.sweep_interval:g}) and a worker")
    processes.dispatcher(args.sweep_interval)
    writes_worker = processes.worker("worker-writes", args.worker_concurrency)
    with producers(env) as made:
        echo("writing through every path")
        last = [0.0]

        def progress(done: int, total: int) -> None:
            if time.monotonic() - last[0] > 5:
                last[0] = time.monotonic()
                echo(f"  {done} of {total} tasks started")

        writes = run_writes(made, plan, sink, sweep_ms, GRACE_MS, progress)
        document["writes"] = write_figures(writes.results, writes.not_written, sweep_ms, PATHS)
        document["tasks"] = [result.describe() for result in writes.results]
        processes.stop([writes_worker])
        if args.cancel_tasks:
            echo("cancels: a worker of concurrency 1 (--check never), held by a blocking task")
            cancels_worker = processes.worker("worker-cancels", 1, "--check", "never")
            try:
                cancels = run_cancels(made, sink, lambda: [cancels_worker.stats()], directory / "hold",
                                      args.cancel_tasks, args.cli_parallel)
            except ScenarioFailure as exc:
                raise BenchFailure(str(exc)) from exc
            document["cancels"] = {**cancel_figures(cancels.cases, cancels.starts, cancels.published),
                                   "settled": cancels.settled,
                                   "cases": [describe_case(case, cancels.starts.get(case.task_id, []))
                                             for case in cancels.cases]}
    processes.stop()
    document["processes"] = processes.describe()


def failures(document: dict[str, Any]) -> list[str]:
    found = []
    writes = document.get("writes", {})
    total = writes.get("total", {})
    for key, what in (("never_ran", "acknowledged tasks never ran"), ("early", "tasks started or published early"),
                      ("not_acknowledged", "writes not acknowledged")):
        if writes.get(key):
            found.append(f"{len(writes[key])} {what}")
    if total.get("over_bound"):
        found.append(f"{total['over_bound']} tasks started later than their bound (listed, not fatal)")
    cancels = document.get("cancels", {})
    if cancels.get("problems"):
        found.append(f"{len(cancels['problems'])} cancel problems: {sorted({p['problem'] for p in cancels['problems']})}")
    if cancels and not cancels.get("settled"):
        found.append("the cancel scenario did not settle in time")
    return found


def emit(document: dict[str, Any], out: Path | None, as_json: bool) -> None:
    stream = sys.stderr if as_json else sys.stdout
    lines = [f"write paths ({document['deployment']['backend']}), dispatcher --sweep-interval "
             f"{document['plan']['sweep_interval_ms'] / 1000:g} s; lateness = first handler start - "
             "max(run_at, acknowledged)"]
    if "writes" in document:
        lines += write_table(document["writes"])
    if "cancels" in document:
        lines += ["", "cancels (worker --concurrency 1 --check never; 'published': in the ready topic behind a "
                      "blocking task when cancelled)"]
        lines += cancel_table(document["cancels"])
    lines += [f"problem: {text}" for text in document["problems"]]
    for line in lines:
        print(line, file=stream)
    text = json.dumps(document, indent=2)
    if out is not None:
        out.write_text(text + "\n", encoding="utf-8")
    if as_json:
        print(text)


def interrupted(*_: Any) -> None:
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, interrupted)  # so SIGTERM, too, stops the processes and cleans up
    directory = (args.work_dir or Path(tempfile.mkdtemp(prefix=f"write-paths-{secrets.token_hex(2)}-"))).resolve()
    directory.mkdir(parents=True, exist_ok=True)
    document: dict[str, Any] = {
        "command": [sys.executable, sys.argv[0], *argv],
        "timestamp": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": {"cpu_count": os.cpu_count(), "python": platform.python_version(),
                    "platform": platform.platform(), "loadavg": os.getloadavg()},
        "work_dir": str(directory),
    }
    cleanup: list[Callable[[], None]] = []
    code = 0
    started = now_ms()
    try:
        run(args, directory, cleanup, document)
    except (StoreUnavailable, QueueUnavailable, CoordinatorUnavailable) as exc:
        echo(f"error: {exc}")
        code = 2
    except (SchedulerError, BenchFailure) as exc:
        echo(f"error: {exc}")
        code = 1
    except KeyboardInterrupt:
        echo("interrupted")
        code = 130
    finally:
        for step in reversed(cleanup):
            step()
    document["seconds"] = round((now_ms() - started) / 1000, 1)
    document["problems"] = failures(document)
    if code == 0 and any("not fatal" not in text for text in document["problems"]):
        code = 1
    if code == 0 and not args.keep and args.work_dir is None:
        shutil.rmtree(directory, ignore_errors=True)
        document["work_dir"] = None
    elif document["work_dir"]:
        echo(f"logs, stats files and the sink kept in {directory}")
    if "deployment" in document and "plan" in document:
        emit(document, args.out, args.json)
    return code


if __name__ == "__main__":
    sys.exit(main())
