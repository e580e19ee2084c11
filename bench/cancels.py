"""Cancels of retrying tasks, made at random moments from many threads: once a cancel
answered `cancelled`, no attempt of its task starts.

    python bench/cancels.py [--backend embedded|cassandra] [--tasks 100] [--threads 20]
                            [--spread-s 4] [--retry-ms 300] [--workers 2] [--out FILE] [--json]

A real `scheduler dispatcher --shards auto` and `--workers` `scheduler worker --app
bench.cancel_app:app` run on a deployment of the run's own (a SQLite directory, or a
keyspace, topics and ZooKeeper root on the local servers). `--tasks` tasks due in a
second are submitted through a client *without* a hand-off (as an SDK of another
language would be: the dispatchers hear of nothing but the store), every attempt of
each fails and is retried `--retry-ms` later, and `--threads` threads cancel them, each
task once, at moments spread uniformly over `--spread-s` seconds from the first due
moment, so cancels meet attempts starting, running, failing, their reports in flight
and their retries queued. Every handler start is written to disk as it happens
(`bench.cancel_app`). After the last cancel the run goes on `--after-s` seconds, then
stops every process and counts, per task, the starts later than its cancel's answer.

The document (stdout with `--json`, a file with `--out`): the answers, the cancels'
latency, every start, the starts after an answer (`late_starts`, must be 0) and the
tasks they belong to, the tasks' final statuses (must all be `cancelled`), and each
process's exit code. Exit 0 when nothing started late and every task ended cancelled,
1 otherwise, 2 for a bad option.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `bench` and `scheduler` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.cancel_app import RETRY_MS_ENV, STARTS_ENV, read_starts  # noqa: E402
from bench.nine.common import BenchFailure, echo  # noqa: E402
from bench.nine.deployment import BenchProcess, Deployment, Fleet, stop_all  # noqa: E402
from bench.nine.settings import STOP_TIMEOUT_S  # noqa: E402
from scheduler import backends  # noqa: E402
from scheduler.adapters.cassandra.connection import connect  # noqa: E402
from scheduler.connecting import backend_settings  # noqa: E402
from scheduler.model import TaskId  # noqa: E402
from scheduler.ports import CancelOutcome, TaskStatus  # noqa: E402
from scheduler.producer import Client, Submission  # noqa: E402

TENANT = "exam-fees"
DEFINITE = (CancelOutcome.CANCELLED, CancelOutcome.ALREADY_CANCELLED)
"""Answers after which no attempt may start."""


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=("embedded", "cassandra"), default="embedded",
                        help="embedded (SQLite files) or cassandra (the local Cassandra, Kafka and ZooKeeper)")
    parser.add_argument("--tasks", type=int, default=100, help="tasks, each cancelled once (default 100)")
    parser.add_argument("--threads", type=int, default=20, help="threads making the cancels (default 20)")
    parser.add_argument("--spread-s", type=float, default=4.0,
                        help="the cancels' moments spread over this many seconds (default 4)")
    parser.add_argument("--retry-ms", type=int, default=300, help="each failed attempt's retry delay (default 300)")
    parser.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    parser.add_argument("--after-s", type=float, default=5.0,
                        help="how long the processes run on after the last cancel (default 5)")
    parser.add_argument("--seed", type=int, help="seed of the cancels' moments (default: random)")
    parser.add_argument("--out", type=Path, help="write the JSON document to this file")
    parser.add_argument("--json", action="store_true", help="print the JSON document on stdout")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (and keyspace, topics)")
    args = parser.parse_args(argv)
    for name in ("tasks", "threads", "workers"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.spread_s <= 0 or args.after_s < 0 or args.retry_ms < 0:
        parser.error("--spread-s must be positive, --after-s and --retry-ms not negative")
    return args


def cancel_all(client: Client, ids: list[TaskId], moments_ns: list[int], threads: int
               ) -> list[dict[str, Any]]:
    """Cancel each id at its moment, from `threads` threads; per cancel its answer, and
    when it was asked and answered (wall-clock ns)."""
    order = sorted(range(len(ids)), key=moments_ns.__getitem__)

    def one(n: int) -> dict[str, Any]:
        delay = (moments_ns[n] - time.time_ns()) / 1e9
        if delay > 0:
            time.sleep(delay)
        asked = time.time_ns()
        try:
            answer = client.cancel(ids[n]).value
        except Exception as exc:  # a failed cancel is reported, and the run goes on
            answer = f"error: {exc}"
        return {"task": str(ids[n]), "asked_ns": asked, "answered_ns": time.time_ns(), "answer": answer}

    with ThreadPoolExecutor(threads, thread_name_prefix="canceller") as pool:
        return list(pool.map(one, order))


def tally(cancels: list[dict[str, Any]], starts: list[tuple[str, int, int]]) -> dict[str, Any]:
    by_task: dict[str, list[tuple[int, int]]] = {}
    for task_id, attempt, at_ns in starts:
        by_task.setdefault(task_id, []).append((attempt, at_ns))
    late = []
    before = []
    for cancel in cancels:
        runs = by_task.get(cancel["task"], [])
        before.append(sum(at <= cancel["asked_ns"] for _, at in runs))
        if cancel["answer"] in {outcome.value for outcome in DEFINITE}:
            late += [{"task": cancel["task"], "attempt": attempt, "after_answer_ms": (at - cancel["answered_ns"]) / 1e6}
                     for attempt, at in runs if at > cancel["answered_ns"]]
    latency_ms = sorted((c["answered_ns"] - c["asked_ns"]) / 1e6 for c in cancels)
    before.sort()
    return {
        "answers": dict(Counter(cancel["answer"] for cancel in cancels)),
        "latency_ms": {"p50": round(latency_ms[len(latency_ms) // 2], 1),
                       "p99": round(latency_ms[min(len(latency_ms) - 1, int(len(latency_ms) * 0.99))], 1),
                       "max": round(latency_ms[-1], 1)},
        "starts": len(starts),
        "starts_before_cancel": {"p50": before[len(before) // 2], "max": before[-1],
                                 "tasks_started": sum(n > 0 for n in before)},
        "late_starts": len(late),
        "tasks_with_late_starts": len({start["task"] for start in late}),
        "late": late[:50],
    }


def run(args: argparse.Namespace, work: Path, cleanup: list[Callable[[], None]]) -> dict[str, Any]:
    starts_dir = work / "starts"
    starts_dir.mkdir()
    if args.backend == "embedded":
        env = {"SCHEDULER_BACKEND": "embedded", "SCHEDULER_DB": str(work / "tasks.db")}
    else:
        deployment = Deployment.fresh("cancels")
        connection = connect(deployment.cassandra)
        try:
            deployment.create(connection, cleanup, args.keep, log_append_time=False)
        finally:
            connection.close()
        env = deployment.env()
    settings = backend_settings(env=env)
    fleet = Fleet(env, [], work)
    processes: list[BenchProcess] = []
    with backends.open_store(settings) as store:  # made here first: the processes find it made
        client = Client(store, tenant=TENANT)  # no hand-off: the dispatcher learns of nothing but the store

        def stop_processes() -> None:  # on any way out; a process stopped already is left alone
            fleet.stop()
            stop_all(processes, STOP_TIMEOUT_S)

        cleanup.append(stop_processes)
        fleet.start(1)
        worker_env = {**os.environ, **env, STARTS_ENV: str(starts_dir), RETRY_MS_ENV: str(args.retry_ms)}
        processes.extend(BenchProcess.start(f"worker-{n}", ["worker", "--app", "bench.cancel_app:app",
                                                            "--member", f"worker-{n}"], work, worker_env)
                         for n in range(1, args.workers + 1))
        fleet.wait_for_shards(90)
        deadline = time.monotonic() + 90
        while not all(process.stats() for process in processes):
            for process in processes:
                if not process.alive():
                    raise process.died()
            if time.monotonic() > deadline:
                raise BenchFailure("the workers wrote no stats within 90 s")
            time.sleep(0.2)
        due = datetime.now(UTC) + timedelta(seconds=1)
        report = client.submit_many([Submission("flaky", {"n": n}, run_at=due, max_attempts=100)
                                     for n in range(args.tasks)], on_invalid="stop")
        ids = [task_id for task_id in report.ids or () if task_id is not None]
        if len(ids) != args.tasks:
            raise BenchFailure(f"only {len(ids)} of {args.tasks} tasks were stored: {report}")
        echo(f"{len(ids)} tasks due at {due:%H:%M:%S.%f}; cancelling them over {args.spread_s} s "
             f"from {args.threads} threads")
        due_ns = int(due.timestamp() * 1e9)
        rng = random.Random(args.seed)
        moments = [due_ns + int(rng.uniform(0, args.spread_s) * 1e9) for _ in ids]
        cancels = cancel_all(client, ids, moments, args.threads)
        time.sleep(args.after_s)
        exits = {"dispatchers": fleet.stop(), "workers": stop_all(processes, STOP_TIMEOUT_S)}
        final = store.get_many(ids)
        statuses = dict(Counter(stored.status.value for stored in final.values()))
    figures = tally(cancels, read_starts(starts_dir))
    cancelled = statuses.get(TaskStatus.CANCELLED.value, 0)
    return {"command": [sys.executable, *sys.argv], "backend": args.backend, "tasks": args.tasks,
            "threads": args.threads, "spread_s": args.spread_s, "retry_ms": args.retry_ms, "workers": args.workers,
            **figures, "final_statuses": statuses, "exits": exits,
            "ok": figures["late_starts"] == 0 and cancelled == len(ids)}


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # so the cleanup below runs
    work = Path(tempfile.mkdtemp(prefix="cancels-"))
    cleanup: list[Callable[[], None]] = []
    try:
        document = run(args, work, cleanup)
    except BenchFailure as failure:
        echo(f"error: {failure}")
        return 1
    finally:
        for step in reversed(cleanup):
            try:
                step()
            except Exception as exc:  # one failed step must not keep the others from running
                echo(f"warning: cleanup: {exc}")
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    text = json.dumps(document, indent=2)
    if args.out:
        args.out.write_text(text + "\n")
    if args.json:
        print(text)
    echo(f"{document['tasks']} cancels ({document['answers']}), p50 {document['latency_ms']['p50']} ms, max "
         f"{document['latency_ms']['max']} ms; {document['starts']} starts, {document['late_starts']} after their "
         f"cancel answered ({document['tasks_with_late_starts']} tasks); final {document['final_statuses']}")
    return 0 if document["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
