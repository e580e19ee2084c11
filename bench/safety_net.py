"""What the dispatcher's safety net behind its cursor costs: store requests per shard per
second and the CPU of Cassandra and the dispatcher, at idle and around a burst.

One `scheduler dispatcher` holds the 64 shards of a fresh deployment on the real
servers. Three windows are measured from the dispatcher's stats file (its counters of
slices counted before firing, second looks, sweeps, and re-reads) and from /proc (CPU
seconds of Cassandra and of the dispatcher):

- **idle**: `--idle-s` seconds with nothing stored;
- **burst minute**: `--tasks` tasks (stored beforehand through the SDK) due over the
  first 10 s of a minute M, from M - 5 s to M + 60 s;
- **after**: M + 60 s to M + 60 s + `--after-s`: the burst is behind the cursor, where
  sweeps count it (recent ones for 90 s, full ones every two minutes).

Run it against another checkout with `--scheduler-python PATH` (that checkout's venv
python, run from its own root) to compare before and after a change in the same
session; a counter that checkout does not keep reads 0.

    .venv/bin/python deploy/local/cluster.py start
    .venv/bin/python bench/safety_net.py --out /tmp/safety-net.json
    .venv/bin/python bench/safety_net.py --scheduler-python ../other/.venv/bin/python --out /tmp/safety-net-old.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.nine.common import now_ms  # noqa: E402
from bench.nine.deployment import Deployment, DispatcherProcess  # noqa: E402
from bench.nine.proc import cpu_seconds, server_pids  # noqa: E402
from bench.nine.settings import SHARDS  # noqa: E402
from bench.nine.workload import Burst, ingest, text_length_for  # noqa: E402
from scheduler.adapters.cassandra.connection import connect  # noqa: E402
from scheduler.model import BUCKET_MS  # noqa: E402

COUNTERS = ("slices_counted", "slices_looked", "sweeps", "slices_reread", "looks_reread", "buckets_reread",
            "rows_found_late", "rows_swept", "fired")


def snapshot(dispatcher: DispatcherProcess, cassandra_pid: int) -> dict[str, Any]:
    counters = dispatcher.stats().get("stats", {})
    return {"at_ms": now_ms(), "cassandra_cpu_s": cpu_seconds(cassandra_pid) or 0.0,
            "dispatcher_cpu_s": cpu_seconds(dispatcher.process.pid) or 0.0,
            **{name: counters.get(name, 0) or 0 for name in COUNTERS}}


def window(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    seconds = (after["at_ms"] - before["at_ms"]) / 1000
    delta = {name: after[name] - before[name] for name in COUNTERS}
    per_shard_s = {name: round(delta[name] / seconds / SHARDS, 3)
                   for name in ("slices_counted", "slices_looked", "sweeps", "slices_reread", "looks_reread",
                                "buckets_reread")}
    return {
        "seconds": round(seconds, 1),
        "requests_per_shard_s": round(sum(per_shard_s.values()), 3),
        "by_kind_per_shard_s": per_shard_s,
        "cassandra_cores": round((after["cassandra_cpu_s"] - before["cassandra_cpu_s"]) / seconds, 3),
        "dispatcher_cores": round((after["dispatcher_cpu_s"] - before["dispatcher_cpu_s"]) / seconds, 3),
        "fired": delta["fired"], "rows_found_late": delta["rows_found_late"], "rows_swept": delta["rows_swept"],
    }


def wait_until(moment_ms: int, check: Callable[[], None]) -> None:
    while now_ms() < moment_ms:
        check()
        time.sleep(min(0.5, max(0.0, (moment_ms - now_ms()) / 1000)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--tasks", type=int, default=300_000, help="tasks due in the burst (default 300,000)")
    parser.add_argument("--idle-s", type=float, default=60.0, help="seconds of the idle window (default 60)")
    parser.add_argument("--after-s", type=float, default=180.0, help="seconds of the window after the burst "
                        "minute (default 180)")
    parser.add_argument("--scheduler-python", type=Path, default=Path(sys.executable),
                        help="the python that runs `-m scheduler dispatcher` (another checkout's venv: its root is "
                             "the directory two levels above it)")
    parser.add_argument("--out", type=Path, help="write the JSON document here")
    options = parser.parse_args(argv)

    deployment = Deployment.fresh("safety_net")
    cleanup: list[Callable[[], None]] = []
    document: dict[str, Any] = {"command": " ".join(sys.argv), "tasks": options.tasks,
                                "scheduler_python": str(options.scheduler_python)}
    dispatcher: DispatcherProcess | None = None
    try:
        connection = connect(deployment.cassandra)
        try:
            deployment.create(connection, cleanup, keep=False)
        finally:
            connection.close()
        cassandra_pid = server_pids()["cassandra"]
        work = Path(tempfile.mkdtemp(prefix="safety-net-"))
        env = {**os.environ, **deployment.env()}
        root = options.scheduler_python.resolve().parents[2]
        log_path, stats_path = work / "dispatcher.log", work / "dispatcher.json"
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                [str(options.scheduler_python), "-m", "scheduler", "dispatcher", "--backend", "cassandra",
                 "--shards", "auto", "--member", "d1", "--stats-file", str(stats_path)],
                stdout=subprocess.DEVNULL, stderr=log, env=env, cwd=root, start_new_session=True)
        dispatcher = DispatcherProcess("dispatcher", process, log_path, stats_path)

        def alive() -> None:
            if not dispatcher or not dispatcher.alive():
                raise SystemExit(f"the dispatcher exited; see {log_path}")

        deadline = now_ms() + 60_000
        while len(dispatcher.stats().get("shards", [])) < SHARDS:
            alive()
            if now_ms() > deadline:
                raise SystemExit("the dispatcher did not take the 64 shards within 60 s")
            time.sleep(0.2)
        wait_until(now_ms() + 20_000, alive)  # settled: first reads and full sweeps done
        start = snapshot(dispatcher, cassandra_pid)
        wait_until(now_ms() + int(options.idle_s * 1000), alive)
        document["idle"] = window(start, snapshot(dispatcher, cassandra_pid))
        print(f"idle: {document['idle']}", file=sys.stderr)

        minute = (now_ms() // BUCKET_MS + 2) * BUCKET_MS  # far enough ahead to store the burst first
        burst = Burst(minute, options.tasks, 10_000, text_length_for(100), 5000)
        ingest(deployment.cassandra, burst.submissions(seed=7))
        wait_until(minute - 5_000, alive)
        before_burst = snapshot(dispatcher, cassandra_pid)
        wait_until(minute + BUCKET_MS, alive)
        after_minute = snapshot(dispatcher, cassandra_pid)
        document["burst_minute"] = window(before_burst, after_minute)
        print(f"burst minute: {document['burst_minute']}", file=sys.stderr)
        wait_until(minute + BUCKET_MS + int(options.after_s * 1000), alive)
        document["after_burst"] = window(after_minute, snapshot(dispatcher, cassandra_pid))
        print(f"after the burst: {document['after_burst']}", file=sys.stderr)
        if document["burst_minute"]["fired"] < options.tasks:
            raise SystemExit(f"only {document['burst_minute']['fired']} of {options.tasks} tasks fired")
    finally:
        if dispatcher is not None:
            dispatcher.stop(30)
        for step in reversed(cleanup):
            step()
    text = json.dumps(document, indent=2)
    if options.out:
        options.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
