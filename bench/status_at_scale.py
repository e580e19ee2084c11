"""`scheduler status` with millions of tasks stored: how long it takes, as a user runs it.

What it measures
----------------
A keyspace, topics and ZooKeeper root of the bench's own, with one `scheduler
dispatcher` holding every shard (so the counts are folded and the shards owned, as in a
deployment). First, on the empty store, `scheduler status --json` is run `--runs` times,
each in a new process as a user runs it (interpreter start, imports, connecting,
reading, printing): the wall time of each, and the read time it reports (`read_ms`: from
opening the store to the answer). Then `--tasks` tasks (default 10,000,000) are
submitted through the producer SDK (`scheduler.connect`, so each is counted as
submitted, as an application's are) from `--processes` processes, for `--tenants`
tenants (80% to one board, the rest over colleges) and `--types` task types, due in
time order over the day after tomorrow (the dispatcher has nothing to fire meanwhile),
and the same runs are timed again. The status must show every task waiting.

What a status reads does not grow with the tasks: it grows with the (writer, tenant,
type) rows of the hours since the last fold, so `--tenants`, `--types` and
`--processes` are the figures that matter beside `--tasks`.

How to run
----------
    .venv/bin/python bench/status_at_scale.py --out /tmp/status.json     # 10,000,000 tasks, ~5 min
    .venv/bin/python bench/status_at_scale.py --tasks 200000 --runs 3     # a quick check

Servers: as the other benches (the local cluster, or SCHEDULER_* variables). Exit 0
ran, 1 the status did not show the tasks submitted, 2 a server unreachable.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from scheduler.adapters.cassandra.connection import connect as connect_cassandra
from scheduler.errors import StoreUnavailable
from scheduler.producer import Submission

ROOT = str(Path(__file__).resolve().parents[1])
if ROOT not in sys.path:
    sys.path.append(ROOT)

from bench.nine.deployment import REPOSITORY, Deployment, Fleet  # noqa: E402  (after the path is set)

DAY_MS = 86_400_000
TYPES = ("sms", "email", "reminder", "report")


def submissions(first: int, count: int, total: int, tenants: int, types: int, start_ms: int,
                days: int) -> Iterator[Submission]:
    """Tasks `first` .. `first + count - 1` of `total`, in time order over `days` days
    from `start_ms`: neighbours share a minute, so the SDK's batches fill partitions as
    an application's do (tasks scattered over a week would make every batch touch
    hundreds of partitions, and the fill would measure that instead)."""
    step = days * DAY_MS / total
    moments: dict[int, datetime] = {}
    for n in range(first, first + count):
        tenant = "board" if n % 5 else f"college-{(n // 5) % max(tenants - 1, 1):05d}"
        run_at = start_ms + int(n * step)
        moment = moments.get(run_at) or moments.setdefault(run_at, datetime.fromtimestamp(run_at / 1000, UTC))
        if len(moments) > 10_000:
            moments.clear()
        yield Submission(TYPES[n % types], {"to": f"+9198{n % 10**8:08d}", "text": "Your result is out."},
                         tenant=tenant, run_at=moment)


def fill_share(env: dict[str, str], first: int, count: int, total: int, tenants: int, types: int, start_ms: int,
               days: int, done: Any) -> None:
    os.environ.update(env)
    import scheduler

    with scheduler.connect() as client:
        last = 0

        def progress(report: Any) -> None:
            nonlocal last
            with done.get_lock():
                done.value += report.stored - last
            last = report.stored

        report = client.submit_many(submissions(first, count, total, tenants, types, start_ms, days), keep_ids=False,
                                    progress=progress)
        if report.stored != count:
            raise SystemExit(f"stored {report.stored} of {count}: {report.failed[:1] or report.rejected[:1]}")


def fill(env: dict[str, str], tasks: int, processes: int, tenants: int, types: int) -> float:
    context = multiprocessing.get_context("spawn")
    done = context.Value("q", 0)
    start_ms = (time.time_ns() // 1_000_000 // DAY_MS + 2) * DAY_MS
    shares = [tasks // processes + (1 if n < tasks % processes else 0) for n in range(processes)]
    firsts = [sum(shares[:n]) for n in range(processes)]
    workers = [context.Process(target=fill_share, args=(env, first, count, tasks, tenants, types, start_ms, 1, done))
               for first, count in zip(firsts, shares, strict=True)]
    began = time.monotonic()
    for worker in workers:
        worker.start()
    try:
        while any(worker.is_alive() for worker in workers):
            time.sleep(5)
            elapsed = time.monotonic() - began
            print(f"  filled {done.value:,} of {tasks:,} in {elapsed:.0f} s ({done.value / elapsed:,.0f}/s)",
                  file=sys.stderr)
    finally:
        for worker in workers:  # interrupted: no fill process outlives the bench
            if worker.is_alive():
                worker.terminate()
                worker.join(10)
    if any(worker.exitcode for worker in workers):
        raise SystemExit("a fill process failed")
    return time.monotonic() - began


def status_runs(env: dict[str, str], runs: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """Times `scheduler status --json` `runs` times; the figures and the last document."""
    walls, reads = [], []
    document: dict[str, Any] = {}
    for _ in range(runs):
        began = time.monotonic()
        result = subprocess.run([sys.executable, "-m", "scheduler", "status", "--json"], env={**os.environ, **env},
                                capture_output=True, text=True, timeout=120, check=True, cwd=REPOSITORY)
        walls.append((time.monotonic() - began) * 1000)
        document = json.loads(result.stdout)
        reads.append(document["read_ms"])

    def figures(values: list[float]) -> dict[str, float]:
        return {"min": round(min(values)), "p50": round(statistics.median(values)), "max": round(max(values))}

    return {"runs": runs, "wall_ms": figures(walls), "read_ms": figures(reads)}, document


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=10_000_000, help="tasks to store (default 10,000,000)")
    parser.add_argument("--processes", type=int, default=2, help="producer processes filling (default 2)")
    parser.add_argument("--tenants", type=int, default=5_000, help="tenants (default 5,000)")
    parser.add_argument("--types", type=int, choices=range(1, len(TYPES) + 1), default=2,
                        help="task types (default 2)")
    parser.add_argument("--runs", type=int, default=10, help="status runs timed, empty and full (default 10)")
    parser.add_argument("--out", type=Path, help="write the JSON document here")
    parser.add_argument("--keep", action="store_true", help="keep the keyspace, topics and ZooKeeper root")
    options = parser.parse_args(argv)
    # SIGTERM ends the bench through its cleanup (the dispatcher stopped, the keyspace dropped).
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))

    deployment = Deployment.fresh("status_at_scale")
    env = deployment.env()
    cleanup: list[Any] = []
    work = Path(tempfile.mkdtemp(prefix="status-at-scale-"))
    fleet = Fleet(env, ["--backend", "cassandra"], work)
    try:
        with connect_cassandra(deployment.cassandra) as connection:
            deployment.create(connection, cleanup, options.keep)
        fleet.start(1)
        fleet.wait_for_shards(120)
        time.sleep(3)  # the dispatcher's first count report and fold
        empty, _ = status_runs(env, options.runs)
        print(f"empty store: {json.dumps(empty)}", file=sys.stderr)
        fill_s = fill(env, options.tasks, options.processes, options.tenants, options.types)
        time.sleep(3)
        full, document = status_runs(env, options.runs)
        print(f"{options.tasks:,} stored: {json.dumps(full)}", file=sys.stderr)
    except StoreUnavailable as exc:
        print(f"a server is unreachable: {exc}", file=sys.stderr)
        return 2
    finally:
        for member in fleet.members:
            member.stop(30)
        for step in reversed(cleanup):
            step()
    waiting = document["total"]["waiting"]
    result = {
        "tasks": options.tasks, "tenants": options.tenants, "types": options.types, "processes": options.processes,
        "fill_s": round(fill_s, 1), "fill_per_s": round(options.tasks / fill_s),
        "count_rows": len(document["counts"]), "status_empty": empty, "status_full": full,
        "waiting_shown": waiting,
    }
    print(json.dumps(result, indent=2))
    if options.out:
        options.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0 if waiting == options.tasks else 1


if __name__ == "__main__":
    sys.exit(main())
