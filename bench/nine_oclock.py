"""Nine o'clock bench: a burst of tasks due in the first seconds of one minute, fired by
real dispatcher processes on the real Cassandra, Kafka and ZooKeeper (or, with
`--backend embedded`, on the embedded backend's SQLite files).

What it measures
----------------
`--tasks` SMS tasks (default 300,000) due evenly over the first `--spread-s` seconds
(default 10) of one minute M, so N/S fall due each second: about 80% for one "board"
tenant, the rest over `--tenants` colleges (default 5,000) with Zipf-like sizes (the
n-th college has 1/n of the first one's), each with a ~`--payload-bytes` msgpack
payload. In one run, on a fresh keyspace, topic prefix and ZooKeeper root:

1. Kafka ceiling: `--ceiling-messages` messages of the bench's own kind and size,
   produced as fast as one process can with the dispatcher's producer settings
   (`acks=all`, idempotent, lz4, linger 5 ms) to a topic of its own; messages/s.
2. Ingest: every task written with the producer SDK (`Client(store, handoff=None)`,
   `submit_many`), rows/s. M is the first minute boundary at least the estimated
   ingest time plus `--lead-s` (default 75 s) ahead, so the tasks are stored before
   the dispatchers, started next, read minute M (at M - 60 s).
3. `--dispatchers` processes (`scheduler dispatcher --shards auto --lease-timeout 10`)
   start and take the 64 shards between them. Their stats file and RSS are sampled at
   baseline (M - 62 s, wheels empty) and just before M (the minute loaded).
With `--fill N`, before the ceiling, N other tasks are written into the keyspace (half
done in past minutes, half due in future ones, all hours from M; `bench/nine/fill.py`),
the memtable is flushed and the bench waits until the table's compactions have settled;
the fill's rows/s, the settle time and the table's bytes on disk (a task, a partition)
are reported, and the burst's figures can be set against a run without it.

4. A reader (a thread or a process, `--reader`) takes every message of the four ready
   topics from offset 0, with the broker's timestamp (the bench sets the ready topics
   to `LogAppendTime`, so the timestamp is when Kafka stored the message). It stops
   when every task was seen or at M + S + 60 s, after the dispatchers are stopped
   (SIGTERM) and the topics are read to their end.

With `--workers N`, N `scheduler worker` processes (app `bench.worker_app:app`, a no-op
`sms` handler that notes its start) run from the dispatchers' start on; the bench waits
until their stats show every task done and every status stored, stops them (SIGTERM:
each drains and writes its handler starts), and reports handler-start lateness (first
start - run_at: p50 ... max, share over 1 s) and tasks handled, lost (submitted - handled)
and repeated, next to the fire figures, which are kept as they are.

Scenarios (`--scenario`): `burst` (the default) is the above. `failover` kills the first
of `--dispatchers` (default 2) with SIGKILL at M + `--event-at-s` (default half the
spread); `pause` stops it with SIGSTOP there and continues it (SIGCONT) `--pause-s`
later (default the lease timeout + 5 s). Both default to a longer, lighter burst
(150,000 tasks over 30 s) and report the event, the time until the others' stats files
hold every shard again, the first message under a new owner's lease token, and
messages published under a stale token. The killed dispatcher's -9 is not a failure,
and repeats after a takeover are reported, not failed on.

`fairness` is results day under the provider's limit (`bench/nine/fairness.py`): before
the dispatchers start (default 2), `scheduler limits set` gives a global rate of
`--global-rate` cost units/s (default 2,000) and the weights board 1, college 1, gold 3,
free 1. At M the board's `--board-tasks` (400) tasks of cost `--board-cost` (75: 30,000
SMS) and `--weight-tasks` (12,000) tasks of cost 1 each for gold and free fall due; at
M + `--college-at-s` (5) the college's `--college-tasks` (50) of cost 1, priority high.
`--tasks` is their sum. From the Kafka timestamps (the moment the gate released each
message): per tenant tasks, units, release lateness p50/p90/p99/max and first/last
release; the most units in any 1-s window against the global rate (more is a failure);
the board's drain rate over the middle 10 s of its releases; gold/free units while both
were backlogged (M + 1 s until the first ran dry, less 1 s) against 3. The fire-rate
target does not apply (the rate is the limit's); college p99 <= 2 s, drain >= 90% of the
rate and the ratio within 10% of 3 are its targets.

`--backend embedded` runs the same on the SQLite store, log and coordinator in the work
directory: no Kafka, so the ceiling is the SQLite queue's insert rate, and the ready
topics are read from `queue.db` on a thread (`TopicScanner`, with each message's
stamp: the time it was written, or for a task the gate let out, its release).

Figures: fire rate = tasks published / (last first-publish - M), and the most first
publishes within any one second; lateness = first publish - run_at of every task
(p50, p90, p99, p99.9, max, share over 1 s, early = before run_at); lost (never
published) and duplicated (published more than once) tasks; memory per loaded task =
(wheel bytes, and RSS) growth from baseline to loaded over the tasks loaded, also less
the mean payload size; CPU seconds of each process in the load and burst windows. Each
is checked against its target and the misses are listed. `--plot` (default: `--out`
with `.png`) draws lateness by due second and the fire rate per second, the event
marked. On a terminal, a progress bar on stderr follows each phase.

How to run
----------
    .venv/bin/python deploy/local/cluster.py start          # the local servers, if not running
    .venv/bin/python bench/nine_oclock.py --out bench/results/nine_oclock.json
    .venv/bin/python bench/nine_oclock.py --dispatchers 2 --out /tmp/nine-2.json
    .venv/bin/python bench/nine_oclock.py --tasks 2000 --spread-s 2 --lead-s 10   # a quick check
    .venv/bin/python bench/nine_oclock.py --workers 2 --worker-concurrency 64 --out /tmp/nine-w.json
    .venv/bin/python bench/nine_oclock.py --scenario failover --out /tmp/nine-failover.json
    .venv/bin/python bench/nine_oclock.py --scenario pause --backend embedded --out /tmp/nine-pause-e.json
    .venv/bin/python bench/nine_oclock.py --scenario fairness --out /tmp/nine-fair.json
    .venv/bin/python bench/nine_oclock.py --fill 10000000 --out /tmp/nine-fill.json   # a full table

The servers are found as the scheduler finds them (`SCHEDULER_CASSANDRA_HOSTS`,
`SCHEDULER_CASSANDRA_PORT`, `SCHEDULER_KAFKA_BOOTSTRAP`, `SCHEDULER_ZOOKEEPER_HOSTS`;
the local cluster by default). The keyspace, topics and ZooKeeper root are removed at
the end unless `--keep`; dispatchers are always stopped, also on Ctrl-C or SIGTERM.
Their logs and stats files go to `--work-dir` (a temporary directory, removed unless
`--keep` or something went wrong). Exit status: 0 the bench ran (targets may have been
missed: see "missed"), 1 a task was lost or fired early, a dispatcher failed, or a
write failed, 2 a server could not be reached, 130 interrupted.

Where the parts are
-------------------
This file is the command line and the exit status; the rest is in `bench/nine/`:

    settings.py    the fixed settings, the targets, the reference ceilings, the scenarios, `Options`
    common.py      `BenchFailure`, the millisecond clock, progress lines on stderr
    progress.py    the progress bar on stderr (a terminal only)
    workload.py    the burst's tasks (`Burst`) and their ingest through the SDK
    fill.py        `--fill`: other tasks in the table before the burst, its settling and bytes on disk
    backends.py    the two backends: deployment, ceiling, ingest and reader of each
    deployment.py  the keyspace, topics and ZooKeeper root; the dispatcher processes
    disruption.py  the kill or pause of a failover or pause run, and the re-owning of shards
    takeover.py    what the messages' lease tokens say about the takeover
    fairness.py    the fairness scenario: its limits, its tasks, its figures per tenant and overall
    workers.py     the worker processes (`--workers`) and the handler starts they record
    ceiling.py     the raw Kafka ceiling (and the worker bench's ceilings)
    reader.py      reading back the ready topics, on a thread or in a process
    proc.py        CPU and memory of processes, from /proc
    report.py      the figures (percentiles, fire rate, handling, memory, targets), table and JSON
    plot.py        the PNG
    run.py         one run, phase by phase
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import signal
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaException

from scheduler.errors import CoordinatorUnavailable, QueueUnavailable, SchedulerError, StoreUnavailable

# Run as a script, only bench/ itself is on the path: the parts are imported as the
# package `bench.nine`, from the repository root.
ROOT = str(Path(__file__).resolve().parents[1])
if ROOT not in sys.path:
    sys.path.append(ROOT)

from bench.nine.common import BenchFailure, echo
from bench.nine.plot import plot
from bench.nine.progress import Phases
from bench.nine.report import emit
from bench.nine.run import run
from bench.nine.settings import (
    BOARD_SHARE,
    LEASE_TIMEOUT_S,
    PAUSE_DEFAULT_S,
    READ_AHEAD_S,
    READY_PARTITIONS,
    REFERENCE_CEILINGS,
    SCENARIO_DEFAULTS,
    SCENARIOS,
    SHARDS,
    WORKER_CONCURRENCY,
    FairnessMix,
    Options,
)


def parse_args(argv: Sequence[str]) -> tuple[argparse.Namespace, Options]:
    parser = argparse.ArgumentParser(
        description="The 9:00 burst on the real cluster: tasks due in the first seconds of one minute, fired by "
                    "real dispatcher processes; fire rate, lateness of every task, lost and duplicated tasks, "
                    "memory per loaded task, next to the Kafka ceiling measured in the same run.",
        epilog="Servers: SCHEDULER_CASSANDRA_HOSTS, SCHEDULER_CASSANDRA_PORT, SCHEDULER_KAFKA_BOOTSTRAP, "
               "SCHEDULER_ZOOKEEPER_HOSTS (default: the local cluster). Exit status: 0 ran (see 'missed'), "
               "1 lost or early tasks or a failed dispatcher, 2 a server unreachable, 130 interrupted.")
    parser.add_argument("--scenario", choices=SCENARIOS, default="burst",
                        help="burst: the dispatchers alone (default); failover: the first dispatcher is killed "
                             "(SIGKILL) mid-burst and the others take its shards once its lease expires; pause: it "
                             "is stopped (SIGSTOP) mid-burst for --pause-s, then continued (SIGCONT); fairness: "
                             "tenants of different weights and sizes under a global rate (--global-rate); "
                             "--tasks is then the sum of --board-tasks, 2 x --weight-tasks and --college-tasks")
    parser.add_argument("--backend", choices=("cassandra", "embedded"), default="cassandra",
                        help="cassandra: Cassandra, Kafka and ZooKeeper (default); embedded: the embedded "
                             "single-machine backend, SQLite files in the work directory (no Kafka: the ceiling "
                             "is the SQLite queue's, and the queue is read on a thread)")
    parser.add_argument("--tasks", type=int,
                        help="tasks in the burst (default " + defaults("tasks", "{:,}") + ")")
    parser.add_argument("--spread-s", type=int,
                        help="tasks fall due evenly over the first S seconds of the minute, N/S a second "
                             "(1-60, default " + defaults("spread_s", "{}") + ")")
    parser.add_argument("--dispatchers", type=int,
                        help="dispatcher processes (1-64; failover and pause need 2 or more; default "
                             + defaults("dispatchers", "{}") + ")")
    parser.add_argument("--event-at-s", type=float,
                        help="failover and pause: when the dispatcher is killed or stopped, in seconds after M "
                             "(0 to --spread-s; default --spread-s / 2)")
    parser.add_argument("--pause-s", type=float, default=PAUSE_DEFAULT_S,
                        help=f"pause: how long the dispatcher stays stopped (default {PAUSE_DEFAULT_S}: the "
                             f"lease timeout {LEASE_TIMEOUT_S} s + 5)")
    parser.add_argument("--payload-bytes", type=int, default=100,
                        help="encoded payload size, about (default 100)")
    parser.add_argument("--tenants", type=int, default=5000,
                        help=f"colleges beside the board, which has {BOARD_SHARE * 100:.0f}%% of the tasks; college n has "
                             "a share of the rest proportional to 1/n (default 5,000)")
    parser.add_argument("--lead-s", type=int, default=75,
                        help="M is the first minute boundary at least the estimated ingest time plus this ahead "
                             f"(default 75). Below {READ_AHEAD_S + 2} the dispatchers read M as they start, so the "
                             "baseline may hold tasks already and the memory figures mean little: for quick checks")
    parser.add_argument("--reader", choices=("process", "thread"), default="process",
                        help="read the ready topics in a process of its own or on a thread of the bench "
                             "(default process; --backend embedded: always a thread)")
    parser.add_argument("--ceiling-messages", type=int, default=200_000,
                        help="messages of the Kafka ceiling run (default 200,000)")
    parser.add_argument("--out", type=Path, help="write the JSON document to this file")
    parser.add_argument("--plot", type=Path, metavar="F.png",
                        help="draw lateness and fire rate over the burst into this PNG (default: --out with the "
                             "suffix .png; neither: no plot)")
    parser.add_argument("--json", action="store_true", help="print the JSON document on stdout (table on stderr)")
    parser.add_argument("--keep", action="store_true",
                        help="keep the keyspace, topics, ZooKeeper root and the work directory")
    parser.add_argument("--work-dir", type=Path,
                        help="dispatcher logs and stats files (default: a temporary directory, removed at the "
                             "end unless --keep or something failed)")
    parser.add_argument("--py-spy", type=Path, metavar="DIR",
                        help="record each dispatcher (and worker) with py-spy (raw collapsed stacks, by thread) "
                             "during the load and the burst into DIR")
    parser.add_argument("--workers", type=int, default=0,
                        help="also run N `scheduler worker` processes (app bench.worker_app:app, a no-op handler "
                             "that records its start) and report handler-start lateness and tasks handled "
                             "(0-16, default 0: the dispatchers alone)")
    parser.add_argument("--worker-concurrency", type=int, default=WORKER_CONCURRENCY,
                        help=f"--concurrency of each worker (default {WORKER_CONCURRENCY})")
    fair = FairnessMix()
    parser.add_argument("--global-rate", type=float, default=fair.global_rate,
                        help=f"fairness: the global rate, cost units a second (default {fair.global_rate:,.0f})")
    parser.add_argument("--board-tasks", type=int, default=fair.board_tasks,
                        help=f"fairness: the board's tasks, due at M (default {fair.board_tasks})")
    parser.add_argument("--board-cost", type=int, default=fair.board_cost,
                        help=f"fairness: the cost of each of the board's tasks (default {fair.board_cost})")
    parser.add_argument("--weight-tasks", type=int, default=fair.weight_tasks,
                        help=f"fairness: tasks of cost 1 for each of gold (weight 3) and free (weight 1), due at M "
                             f"(default {fair.weight_tasks:,})")
    parser.add_argument("--college-tasks", type=int, default=fair.college_tasks,
                        help=f"fairness: the college's tasks of cost 1, priority high (default {fair.college_tasks})")
    parser.add_argument("--college-at-s", type=float, default=fair.college_at_s,
                        help=f"fairness: the college's tasks fall due this long after M (default "
                             f"{fair.college_at_s:g})")
    parser.add_argument("--metrics", action="store_true",
                        help="start every dispatcher (and worker) with --metrics-port 0 and scrape each endpoint "
                             "every second for the whole run, as Prometheus would: measures what the metrics cost "
                             "(run with and without it, alternately); the document's `metrics` says how the "
                             "scrapes went and what the endpoints counted")
    parser.add_argument("--fill", type=int, default=0, metavar="N",
                        help="before the burst, write N other tasks into the keyspace (half done in past minutes, "
                             "half due in future ones, all hours from the burst), let the table's compactions "
                             "settle, and report the fill's rate and the table's bytes on disk (default 0: none; "
                             "--backend cassandra only)")
    parser.add_argument("--fill-processes", type=int, default=2,
                        help="processes writing the fill (1-16, default 2)")
    parser.add_argument("--no-align", dest="align", action="store_false",
                        help="start the burst at the first whole second at least the lead ahead instead of a "
                             "minute boundary (quick checks: no wait for the next minute; the burst may straddle "
                             "two minutes)")
    args = parser.parse_args(argv)
    for name, value in SCENARIO_DEFAULTS[args.scenario].items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    mix: FairnessMix | None = None
    if args.scenario == "fairness":
        if (min(args.board_tasks, args.weight_tasks, args.college_tasks) < 1 or not 1 <= args.board_cost <= 10_000
                or not 0 < args.global_rate <= 10_000_000 or not 0 <= args.college_at_s <= 59):
            parser.error("--board-tasks, --weight-tasks, --college-tasks >= 1, --board-cost 1 to 10,000, "
                         "--global-rate above 0, --college-at-s 0 to 59")
        mix = FairnessMix(args.board_tasks, args.board_cost, args.weight_tasks, args.college_tasks,
                          args.college_at_s, args.global_rate)
        args.tasks = mix.tasks
        args.spread_s = max(args.spread_s, int(args.college_at_s) + 1)
    if args.event_at_s is None:
        args.event_at_s = args.spread_s / 2
    if args.tasks < 1 or not 1 <= args.spread_s <= 60 or not 1 <= args.dispatchers <= SHARDS:
        parser.error("--tasks must be positive, --spread-s 1 to 60, --dispatchers 1 to 64")
    if args.payload_bytes < 0 or args.tenants < 1 or args.lead_s < 5 or args.ceiling_messages < 100:
        parser.error("--payload-bytes >= 0, --tenants >= 1, --lead-s >= 5, --ceiling-messages >= 100")
    if not 0 <= args.workers <= 16 or not 1 <= args.worker_concurrency <= 1024:
        parser.error("--workers 0 to 16, --worker-concurrency 1 to 1024")
    if args.scenario in ("failover", "pause"):
        if args.dispatchers < 2:
            parser.error(f"--scenario {args.scenario} needs --dispatchers 2 or more: one to lose, one to take over")
        if not 0 <= args.event_at_s <= args.spread_s or args.pause_s <= 0:
            parser.error("--event-at-s 0 to --spread-s, --pause-s above 0")
    if args.fill < 0 or not 1 <= args.fill_processes <= 16:
        parser.error("--fill >= 0, --fill-processes 1 to 16")
    if args.fill and args.backend != "cassandra":
        parser.error("--fill needs --backend cassandra")
    if args.backend == "embedded":
        args.reader = "thread"  # the SQLite queue is followed on a thread; --reader is for Kafka
    if args.plot is None and args.out is not None:
        args.plot = args.out.with_suffix(".png")
    return args, Options(args.tasks, args.spread_s, args.dispatchers, args.payload_bytes, args.tenants,
                         args.lead_s, args.reader, args.ceiling_messages, args.keep, args.work_dir, args.py_spy,
                         args.workers, args.worker_concurrency, args.align, args.scenario,
                         args.event_at_s if args.scenario in ("failover", "pause") else None, args.pause_s,
                         args.backend, mix, args.metrics, args.fill, args.fill_processes)


def defaults(name: str, form: str) -> str:
    """A flag's default in each scenario, for --help: "300,000 (burst), 150,000 (failover, pause)"."""
    by_value: dict[int, list[str]] = {}
    for scenario, values in SCENARIO_DEFAULTS.items():
        by_value.setdefault(values[name], []).append(scenario)
    return ", ".join(f"{form.format(value)} ({', '.join(names)})" for value, names in by_value.items())


def interrupted(*_: Any) -> None:
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args, options = parse_args(argv)
    signal.signal(signal.SIGTERM, interrupted)  # so SIGTERM, too, stops the dispatchers and cleans up
    document: dict[str, Any] = {
        "scenario": options.scenario,
        "command": [sys.executable, sys.argv[0], *argv],
        "timestamp": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": {"cpu_count": os.cpu_count(), "python": platform.python_version(),
                    "platform": platform.platform(), "loadavg": os.getloadavg()},
        "settings": {**{k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(options).items()},
                     "board_share": BOARD_SHARE, "lease_timeout_s": LEASE_TIMEOUT_S, "shards": SHARDS,
                     "ready_partitions": READY_PARTITIONS},
        "reference_ceilings": REFERENCE_CEILINGS,
    }
    cleanup: list[Callable[[], None]] = []
    code = 0
    try:
        with Phases() as phases:
            run(options, cleanup, document, phases)
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
    work_dir = document.get("work_dir")
    if code == 0 and document.get("failures"):
        code = 1
    if work_dir and not options.keep and options.work_dir is None:
        if code == 0:
            shutil.rmtree(work_dir, ignore_errors=True)
            document["work_dir"] = None
        else:
            echo(f"dispatcher logs and stats kept in {work_dir}")
    if "targets" not in document:
        return code
    if args.plot is not None:
        try:
            document["plot"] = str(plot(document, args.plot))
        except (OSError, ValueError, KeyError) as exc:
            echo(f"warning: could not draw {args.plot}: {exc}")
            document["plot"] = None
    emit(document, args.out, args.json)
    return code


if __name__ == "__main__":
    sys.exit(main())
