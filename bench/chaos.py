"""Chaos bench: one server fault at a time, on the three-node local cluster, during a
nine o'clock burst with two dispatchers, two workers and an application still
submitting; every acknowledged task reconciled afterwards.

What it does
------------
For each fault of `--faults` (default: `none`, the baseline, then all six, see
`bench/faults/catalog.py`), one run on a keyspace (RF 3, LOCAL_QUORUM), topics (RF 3,
min.insync.replicas 2) and ZooKeeper root of its own (`bench/faults/run.py`):
`--tasks` tasks due evenly over `--spread-s` seconds from M are stored with the SDK;
two `scheduler dispatcher --shards auto` and `--workers` `scheduler worker` processes
start (the no-op `bench.worker_app`, which records each handler start); a producer
process submits `--producer-rate` tasks a second (due 2-30 s after) until the burst's
last second, retrying a failed submit with its idempotency key; at M + `--fault-at-s`
the fault happens, and is undone after its hold time.

Then every task the burst stored or the producer saw acknowledged is looked for in the
ready topics (every message, with Kafka's timestamp) and in the handler starts, and
each shard's cursor, read twice a second all along, is checked never to have moved
backwards (`bench/faults/reconcile.py`, `cursors.py`).

Figures per fault: acknowledged, lost (never published; never handled), early,
duplicates (published more than once: after an owner change, or by the same owner;
handled more than once), lateness p50/p99/max overall and while faulted, the time
from the fault to the last publish more than 1 s late, the producer's acknowledged and
failed submits while faulted and its longest wait, the node's restart time.

How to run
----------
    .venv/bin/python deploy/local/cluster.py start --nodes 3       # or --start-cluster
    .venv/bin/python bench/chaos.py --out bench/results/chaos.json
    .venv/bin/python bench/chaos.py --faults cassandra-kill --tasks 3000 --spread-s 40

`make chaos` runs all of it, starting and stopping the three-node cluster. The cut
faults need root, iptables and cgroup2 (`bench/faults/netcut.py`). Exit status: 0
every run kept every promise, 1 a task was lost or early, a cursor went backwards or a
process died, 2 the cluster could not be reached or started, 130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: the repository root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.faults import catalog, netcut  # noqa: E402
from bench.faults.nodes import Nodes  # noqa: E402
from bench.faults.run import Shape, run_fault  # noqa: E402
from bench.nine.common import BenchFailure, echo  # noqa: E402

CHOICES = ("none", *catalog.FAULTS)


def fault_list(text: str) -> list[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in CHOICES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown fault(s) {', '.join(unknown) or repr(text)}; "
                                         f"choose from {', '.join(CHOICES)}")
    return names


def build_parser() -> argparse.ArgumentParser:
    defaults = Shape()
    parser = argparse.ArgumentParser(prog="bench/chaos.py", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--faults", type=fault_list, default=list(CHOICES), metavar="LIST",
                        help=f"comma-separated, run in this order (default: {','.join(CHOICES)})")
    parser.add_argument("--tasks", type=int, default=defaults.tasks, help="burst tasks (default %(default)s)")
    parser.add_argument("--spread-s", type=int, default=defaults.spread_s,
                        help="seconds the burst is due over (default %(default)s)")
    parser.add_argument("--fault-at-s", type=float, default=defaults.fault_at_s,
                        help="when the fault happens, seconds after M (default %(default)s)")
    parser.add_argument("--workers", type=int, default=defaults.workers, help="(default %(default)s)")
    parser.add_argument("--producer-rate", type=float, default=defaults.producer_rate,
                        help="tasks a second the application submits during the run (default %(default)s)")
    parser.add_argument("--start-cluster", action="store_true",
                        help="start the three-node cluster if it is not up, and stop it at the end if it was started")
    parser.add_argument("--cluster-dir", type=Path, default=None,
                        help="the local cluster's directory (default: deploy/local's, SCHEDULER_CLUSTER_DIR)")
    parser.add_argument("--work-dir", type=Path, default=None, help="logs and records (default: a temporary dir)")
    parser.add_argument("--keep", action="store_true", help="keep keyspaces, topics and ZooKeeper roots")
    parser.add_argument("--out", type=Path, default=None, help="write the JSON document here")
    return parser


def table(runs: list[dict[str, Any]]) -> list[str]:
    header = (f"{'fault':<26} {'acked':>6} {'lost':>5} {'early':>5} {'dup pub':>9} {'dup run':>7} "
              f"{'p99 ms':>7} {'max ms':>7} {'recover s':>9} {'submits ok/failed':>17} {'restart s':>9} "
              f"{'cursor back':>11}")
    lines = [header, "-" * len(header)]
    for run in runs:
        if "result" not in run:
            lines.append(f"{run['fault'] if isinstance(run['fault'], str) else run['fault']['fault']:<26} "
                         f"did not finish: {run.get('error', '?')}")
            continue
        result, producer, fault = run["result"], run["producer"], run["fault"]
        dup = result["duplicates"]
        window = result["lateness_ms_while_faulted"] if fault["fault"] != "none" else result["lateness_ms"]
        submits = (f"{producer.get('acknowledged_while_faulted', producer['acknowledged'])}/"
                   f"{producer.get('failed_while_faulted', producer['failed_submits'])}")
        lines.append(
            f"{fault['fault']:<26} {result['acknowledged']:>6} "
            f"{result['lost_unpublished'] + result['lost_unhandled']:>5} "
            f"{result['early_published'] + result['early_handled']:>5} "
            f"{dup['after_an_owner_change']:>4}+{dup['by_the_same_owner']:<4} {dup['handled_more_than_once']:>7} "
            f"{window['p99'] if window['p99'] is not None else '-':>7} {window['max'] if window['max'] is not None else '-':>7} "
            f"{result['recovery_s'] if result['recovery_s'] is not None else '-':>9} {submits:>17} "
            f"{fault.get('restart_s') or '-':>9} {run['cursors']['backwards']:>11}")
    return lines


def interrupted(_signum: int, _frame: object) -> None:
    """SIGTERM ends the bench as Ctrl-C does: every run's cleanup goes on (processes
    stopped, a stopped node continued, a cut restored), then the cluster if it started it."""
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    signal.signal(signal.SIGTERM, interrupted)
    nodes = Nodes(3, args.cluster_dir)
    started_cluster = False
    try:
        if not nodes.all_up():
            if not args.start_cluster:
                echo("the three-node cluster is not up: run `.venv/bin/python deploy/local/cluster.py start "
                     "--nodes 3`, or pass --start-cluster")
                return 2
            began = time.monotonic()
            nodes.run("start")
            started_cluster = True
            echo(f"three-node cluster started in {time.monotonic() - began:.1f} s")
    except BenchFailure as error:
        echo(f"error: {error}")
        return 2
    os.environ.update(nodes.env())
    missing = netcut.available()
    faults = [name for name in args.faults if not (missing and name in ("dispatcher-zookeeper-cut",
                                                                       "dispatcher-cassandra-cut"))]
    if len(faults) < len(args.faults):
        echo(f"skipping the cut faults: {missing}")
    shape = Shape(tasks=args.tasks, spread_s=args.spread_s, fault_at_s=args.fault_at_s, workers=args.workers,
                  producer_rate=args.producer_rate)
    work_root = args.work_dir or Path(tempfile.mkdtemp(prefix="chaos-"))
    work_root.mkdir(parents=True, exist_ok=True)
    runs: list[dict[str, Any]] = []
    document: dict[str, Any] = {"shape": shape.__dict__, "runs": runs, "work_dir": str(work_root),
                                "skipped": [name for name in args.faults if name not in faults]}
    try:
        for name in faults:
            cleanup: list[Callable[[], None]] = []
            try:
                if not nodes.all_up():  # a run that failed may have left one down: start it again
                    echo(f"a node is down before {name}: starting it")
                    nodes.run("start")
                runs.append(run_fault(None if name == "none" else catalog.make(name), shape, nodes, work_root,
                                      args.keep, cleanup))
            except Exception as error:  # noqa: BLE001 - one run failing must not hide the others' figures
                text = str(error) if isinstance(error, BenchFailure) else traceback.format_exc()
                echo(f"[{name}] failed: {text}")
                runs.append({"fault": name, "error": text[-3000:], "failures": [str(error)[:300]]})
            finally:
                for step in reversed(cleanup):
                    try:
                        step()
                    except Exception as error:  # noqa: BLE001 - the cleanup goes on
                        echo(f"warning: cleanup step failed: {error}")
    except KeyboardInterrupt:
        return 130
    finally:
        if started_cluster:
            nodes.run("stop", check=False)
        text = json.dumps(document, indent=2)
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(text + "\n")
    for line in table(runs):
        print(line)
    failures = [f"{run['fault'] if isinstance(run['fault'], str) else run['fault']['fault']}: {failure}"
                for run in runs for failure in run.get("failures", [])]
    for failure in failures:
        print(f"FAILED {failure}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
