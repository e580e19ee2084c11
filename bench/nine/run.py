"""One run of the bench, phase by phase: deploy (on the servers or the embedded
backend's files, `backends.py`), measure the raw ceiling (Kafka's, or the SQLite
queue's), ingest the
burst, start the dispatchers (and with `--workers` the workers) and sample them at
baseline, follow the load of minute M, follow the burst (and the workers until they
have handled every task and stored every status), then work out the figures. It fills
the JSON document as it goes and registers each removal in `cleanup`, which the caller
runs whatever happens; the dispatchers, the workers and the reader are stopped on every
way out. A write that fails, a dispatcher that dies, or an ingest that ends too close
to M raises; lost or early tasks, tasks no worker handled, and failed dispatchers or
workers are listed in the document's `failures`.

In a failover or pause scenario, the first dispatcher is killed or paused at the set
moment of the burst (`disruption.py`), the run goes on until the others hold every
shard again (and a pause is over), and the messages are set against the lease tokens
(`takeover.py`). The killed dispatcher's SIGKILL is not a failure; repeats after the
takeover are reported, not failed on.

In the fairness scenario the limits are set before the dispatchers start (`scheduler
limits set`), the workload is `fairness.submissions`, the wait for the releases is
longer by the time the global rate takes to let every unit out, and the figures of
`fairness.py` are added (`fairness`) with their targets in place of the fire rate's; on
Kafka the ready topics keep the dispatcher's stamps (`CreateTime`, the moment of
release; the embedded log keeps the same stamps), and a second with more units than the
global rate is a failure."""

from __future__ import annotations

import math
import os
import signal
import tempfile
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from bench.scraper import Scraper, summary
from scheduler.model import BUCKET_MS

from .backends import Backend, EmbeddedBackend, ServerBackend
from .common import BenchFailure, clock, echo, now_ms
from .deployment import Fleet, Profiler
from .disruption import Disruption
from .fairness import apply_limits, fairness_checks, fairness_figures, submissions
from .fill import FillPlan, fill
from .proc import cpu_snapshot, cpu_window, server_pids
from .progress import Phases
from .report import analyse, handling_figures, judge, memory_figures, relative
from .settings import (
    AFTER_BURST_S,
    ASSUMED_INGEST_ROWS_PER_S,
    DUPLICATE_WATCH_S,
    READ_AHEAD_S,
    SETTLE_TIMEOUT_S,
    SHARDS,
    WORKER_RATE_FLOOR,
    Options,
)
from .takeover import takeover_figures
from .workers import WorkerFleet, all_settled
from .workload import Burst, text_length_for


def wait_for_minute(until_ms: int, minute_ms: int, phases: Phases) -> None:
    """Sleep until `until_ms`, counting down to M on the progress bar."""
    total_s = max(1.0, (minute_ms - now_ms()) / 1000)
    while (left := until_ms - now_ms()) > 0:
        phases.countdown("waiting for M", (minute_ms - now_ms()) / 1000, total_s)
        time.sleep(min(left / 1000, 0.5))


def run(options: Options, cleanup: list[Callable[[], None]], document: dict[str, Any],
        phases: Phases | None = None) -> dict[str, Any]:
    phases = phases or Phases(enabled=False)

    def make_work_dir() -> Path:
        path = options.work_dir or Path(tempfile.mkdtemp(prefix="nine-oclock-"))
        path.mkdir(parents=True, exist_ok=True)
        document["work_dir"] = str(path)
        return path

    backend: Backend
    if options.backend == "embedded":  # its files live in the work directory
        work_dir = make_work_dir()
        backend = EmbeddedBackend(work_dir / "embedded")
        servers: dict[str, int] = {}
    else:  # the servers first: one that cannot be reached leaves no work directory behind
        backend = ServerBackend(log_append_time=options.fairness is None)
        servers = server_pids()
    document["deployment"] = {**backend.describe(), "kept": options.keep}
    backend.create(cleanup, options.keep)
    if options.backend != "embedded":
        work_dir = make_work_dir()
    echo(f"deployment: {backend.summary()}, logs in {work_dir}")
    mix = options.fairness
    if mix is not None:
        document["limits"] = apply_limits(mix, backend.env(), backend.arguments())
        echo(f"limits: global rate {mix.global_rate:,.0f} units/s, weights "
             + ", ".join(f"{name} {row['weight']}" for name, row in document["limits"]["tenants"].items()))

    text_len = text_length_for(options.payload_bytes)
    fill_plan: FillPlan | None = None
    if options.fill:
        if not isinstance(backend, ServerBackend):
            raise BenchFailure("--fill needs --backend cassandra")
        document["fill"], fill_plan = fill(backend.deployment.cassandra, options.fill, options.fill_processes,
                                           text_len, lambda stored: phases.update("fill", stored, options.fill))
    like = Burst(now_ms(), options.tasks, options.spread_s * 1000, text_len, options.tenants)
    label = "kafka ceiling" if backend.name == "cassandra" else "sqlite queue ceiling"
    echo(f"{label}: producing {options.ceiling_messages:,} messages ...")
    ceiling = backend.ceiling(like.messages(options.ceiling_messages, seed=7))
    document["ceiling"] = ceiling
    document["kafka_ceiling"] = ceiling if ceiling["kind"] == "kafka_produce" else None
    echo(f"{label}: {ceiling['msgs_per_s']:,} msgs/s ({ceiling['message_bytes_mean']} B messages)")

    estimate_s = options.tasks / ASSUMED_INGEST_ROWS_PER_S + 2
    align_ms = BUCKET_MS if options.align else 1000
    minute_ms = math.ceil((now_ms() + (estimate_s + options.lead_s) * 1000) / align_ms) * align_ms
    if fill_plan is not None and minute_ms + BUCKET_MS >= fill_plan.future_first_ms:
        raise BenchFailure("the burst's minute reaches the fill's future minutes")
    burst = Burst(minute_ms, options.tasks, options.spread_s * 1000, text_len, options.tenants)
    document["burst"] = {"minute": datetime.fromtimestamp(minute_ms / 1000, timezone.utc).isoformat(),
                         "minute_ms": minute_ms, "due_per_s": round(options.tasks / options.spread_s)}
    echo(f"burst minute M = {clock(minute_ms)} UTC; ingesting {options.tasks:,} tasks ...")
    items = burst.submissions(seed=1) if mix is None else submissions(mix, minute_ms, text_len, seed=1)
    document["ingest"], expected = backend.ingest(items, lambda stored: phases.update("ingest", stored, options.tasks))
    del items
    ingested_ms = now_ms()
    document["ingest"]["done_before_minute_s"] = round((minute_ms - ingested_ms) / 1000, 1)
    echo(f"ingest: {document['ingest']['rows_per_s']:,} rows/s; {(minute_ms - ingested_ms) / 1000:.1f} s before M")
    if ingested_ms >= minute_ms - 1000:
        raise BenchFailure("ingest ended less than a second before the burst minute: raise --lead-s")

    metrics_args = ["--metrics-port", "0"] if options.metrics else []
    fleet = Fleet(backend.env(), backend.arguments(), work_dir, metrics_args)
    workers = (WorkerFleet({**os.environ, **backend.env()}, work_dir, backend.arguments())
               if options.workers else None)
    profilers = [Profiler(options.py_spy, fleet)] + ([Profiler(options.py_spy, workers)] if workers else [])
    reader = backend.reader(options.reader)
    completed = False
    handled_ms: int | None = None
    disruption: Disruption | None = None
    scraper: Scraper | None = None
    try:
        fleet.start(options.dispatchers)
        if options.scenario in ("failover", "pause"):
            event_at_ms = minute_ms + round((options.event_at_s or 0) * 1000)
            disruption = Disruption.plan(options.scenario, fleet.members, event_at_ms, options.pause_s)
        if workers is not None:
            workers.start(options.workers, options.worker_concurrency, extra=metrics_args)
        if options.metrics:
            processes = [*fleet.members, *(workers.members if workers is not None else [])]
            scraper = Scraper([(m.name, m.log_path.read_text) for m in processes]).start()
        started_ms = now_ms()
        settle_s = fleet.wait_for_shards(SETTLE_TIMEOUT_S)
        echo(f"dispatchers: {options.dispatchers} hold the {SHARDS} shards after {settle_s:.1f} s")
        load_ms = minute_ms - READ_AHEAD_S * 1000
        wait_for_minute(load_ms - 2000, minute_ms, phases)
        pids = {**servers, **{m.name: m.process.pid for m in fleet.members}, "reader": reader.pid or 0}
        if workers is not None:
            workers.check_alive()
            pids.update({m.name: m.process.pid for m in workers.members})
        if options.reader == "process":
            pids["bench"] = os.getpid()
        baseline = fleet.sample("baseline")
        document.setdefault("machine", {})["loadavg_before_load"] = os.getloadavg()  # others' load while M is read
        baseline_ms, cpu_before_load = now_ms(), cpu_snapshot(pids)
        baseline_clean = baseline["waiting"] == 0 and baseline_ms < load_ms
        for profiler in profilers:
            profiler.start("load")
        echo(f"baseline: RSS {baseline['rss_bytes'] / 2**20:.1f} MiB, {baseline['waiting']:,} waiting; "
             f"the dispatchers read M at {clock(max(load_ms, started_ms))}")
        loaded_ms = cpu_loaded = None
        load_timeline: list[dict[str, Any]] = []
        while now_ms() < minute_ms - 1500:
            fleet.check_alive()
            if workers is not None:
                workers.check_alive()
            totals = fleet.totals()
            if not load_timeline or now_ms() - load_timeline[-1]["at_ms"] >= 1000:
                load_timeline.append({"at_ms": now_ms(), **totals})
            if loaded_ms is None and totals["loaded"] >= options.tasks:
                loaded_ms, cpu_loaded = now_ms(), cpu_snapshot(pids)
                echo(f"loaded: all {options.tasks:,} tasks in the wheels "
                     f"{(loaded_ms - max(load_ms, started_ms)) / 1000:.1f} s after the read began")
            phases.countdown("waiting for M", (minute_ms - now_ms()) / 1000, READ_AHEAD_S)
            time.sleep(0.25)
        loaded = fleet.sample("loaded")
        for profiler in profilers:
            profiler.stop()
        document["load"] = {
            "loaded": loaded["loaded"], "waiting": loaded["waiting"],
            "complete_before_minute": loaded["waiting"] >= options.tasks,
            "seconds": round((loaded_ms - max(load_ms, started_ms)) / 1000, 1) if loaded_ms else None,
            "cpu": cpu_window(cpu_before_load, cpu_loaded or cpu_snapshot(pids),
                              ((loaded_ms or now_ms()) - baseline_ms) / 1000),
            "peak_rss_bytes": max(point["rss_bytes"] for point in [*load_timeline, loaded]),
            "timeline": relative(load_timeline, minute_ms),
        }
        echo(f"before M: RSS {loaded['rss_bytes'] / 2**20:.1f} MiB, {loaded['waiting']:,} waiting, "
             f"wheels {loaded['wheel_bytes'] / 2**20:.1f} MiB")

        wait_for_minute(minute_ms - 500, minute_ms, phases)
        for profiler in profilers:
            profiler.start("burst")
        cpu_burst = cpu_snapshot(pids)
        deadline_ms = minute_ms + (options.spread_s + AFTER_BURST_S) * 1000
        if mix is not None:  # the global rate lets the units out over this long, at the least
            deadline_ms += math.ceil(mix.drain_s * 1000)
        # Workers may lag the burst: they get as long again as at least WORKER_RATE_FLOOR tasks/s needs.
        limit_ms = deadline_ms + (options.tasks * 1000 // WORKER_RATE_FLOOR if workers is not None else 0)
        timeline: list[dict[str, Any]] = []
        all_seen_ms = None
        cpu_burst_end = cpu_handled = None
        while now_ms() < limit_ms:
            if disruption is not None:
                disruption.step(now_ms())
            phases.update("burst", reader.seen, options.tasks)
            if all_seen_ms is None and reader.seen < options.tasks and now_ms() >= deadline_ms:
                break
            if all_seen_ms is None and reader.seen >= options.tasks:
                all_seen_ms, cpu_burst_end = now_ms(), cpu_snapshot(pids)
            if workers is not None and handled_ms is None:
                workers.poll()
                phases.update("handled by workers", workers.totals()["done"], options.tasks)
                if all_settled(workers.totals(), options.tasks):
                    handled_ms, cpu_handled = now_ms(), cpu_snapshot(pids)
            if (all_seen_ms is not None and (workers is None or handled_ms is not None)
                    and (disruption is None or disruption.done)):
                break
            if all_seen_ms is None and not any(member.alive() for member in fleet.members):
                break
            if workers is not None and not any(member.alive() for member in workers.members):
                break
            if not timeline or now_ms() - timeline[-1]["at_ms"] >= 1000:
                point = {"at_ms": now_ms(), "seen": reader.seen, **fleet.totals()}
                if workers is not None:
                    totals = workers.totals()
                    point.update({"handler_starts": totals["started"], "handled_done": totals["done"]})
                timeline.append(point)
            time.sleep(0.1)
        end_ms = all_seen_ms or now_ms()
        cpu_burst_end = cpu_burst_end or cpu_snapshot(pids)
        echo(f"burst: {reader.seen:,} of {options.tasks:,} seen "
             + (f"{(end_ms - minute_ms) / 1000:.1f} s after M" if all_seen_ms else "when the bench stopped waiting"))
        if workers is not None:
            totals = workers.totals()
            echo(f"workers: {totals['done']:,} of {options.tasks:,} done "
                 + (f"and settled {(handled_ms - minute_ms) / 1000:.1f} s after M" if handled_ms
                    else "when the bench stopped waiting"))
        time.sleep(DUPLICATE_WATCH_S)
        for profiler in profilers:
            profiler.stop()
        fleet.sample("fired")
        document["timeline"] = relative(timeline, minute_ms)
        document["cpu_burst"] = cpu_window(cpu_burst, cpu_burst_end, (end_ms - minute_ms + 500) / 1000)
        if workers is not None:
            handling_end_ms = handled_ms or now_ms()
            document["cpu_handling"] = cpu_window(cpu_burst, cpu_handled or cpu_snapshot(pids),
                                                  (handling_end_ms - minute_ms + 500) / 1000)
        completed = True
    finally:
        phases.stop()
        if scraper is not None:
            scraper.stop()
            document["metrics"] = scraper.figures()
            echo(summary(document["metrics"]))
        for profiler in profilers:
            profiler.stop()
        if disruption is not None:
            disruption.release()
        codes = fleet.stop()
        if workers is not None:
            workers.stop()
        if not completed:
            reader.abort()
    records, reader_cpu = reader.finish()
    document["dispatchers"] = [
        {"name": m.name, "pid": m.process.pid, "exit_code": code, "log": str(m.log_path),
         "log_warnings": m.log_warnings(), "samples": m.samples, "final": m.stats()}
        for m, code in zip(fleet.members, codes, strict=True)
    ]
    servers_now = server_pids()
    document["warnings"] = [f"{name} restarted during the run (pid {pid} -> {servers_now.get(name)}): figures "
                            "are suspect" for name, pid in servers.items() if servers_now.get(name) != pid]
    document["warnings"] += [f"{d['name']} logged {d['log_warnings']['count']} warnings or errors, first: "
                             f"{d['log_warnings']['first'][0]}" for d in document["dispatchers"]
                             if d["log_warnings"]["count"]]
    if workers is not None:
        document["workers"] = workers.describe()
        document["warnings"] += [f"{w['name']} logged {w['log_warnings']['count']} warnings or errors, first: "
                                 f"{w['log_warnings']['first'][0]}" for w in document["workers"]
                                 if w["log_warnings"]["count"]]
    py_spy = [path for profiler in profilers for path in profiler.files]
    if py_spy:
        document["py_spy"] = py_spy
    document["reader"] = {"mode": options.reader, "messages": len(records), "cpu_s": round(reader_cpu, 2)}
    result = analyse(records, expected, burst)
    result["event"] = result["takeover"] = None  # a plain burst: no event
    if disruption is not None:
        result["event"] = disruption.figures(minute_ms)
        result["takeover"] = takeover_figures(records, expected, result["event"], minute_ms)
    fire = result["fire"]
    if fire.get("tasks_per_s") and ceiling.get("msgs_per_s"):
        fire["vs_ceiling"] = round(fire["tasks_per_s"] / ceiling["msgs_per_s"], 3)
        if document["kafka_ceiling"] is not None:
            fire["vs_kafka_ceiling"] = fire["vs_ceiling"]
    result["memory"] = memory_figures(fleet, burst.mean_payload_bytes(), baseline_clean)
    if workers is not None:
        settled = workers.settled_between(options.tasks)  # when the stats files showed it, not when polled
        result["handling"] = handling_figures(workers.records(), expected, burst, settled[1] if settled else None)
    document.update(result)
    document["targets"] = judge(result)
    if mix is not None:
        result["fairness"] = fairness_figures(records, expected, minute_ms, mix, ceiling.get("msgs_per_s"))
        document["fairness"] = result["fairness"]
        # The global rate sets the pace and the backlogged tenants wait by design: the burst's
        # fire-rate and overall lateness targets give way to the college's and the rate's.
        replaced = {"fire rate", "lateness p99", "lateness max"}
        document["targets"] = ([check for check in document["targets"] if check["figure"] not in replaced]
                               + fairness_checks(result["fairness"], mix))
    document["missed"] = [check["figure"] for check in document["targets"] if check["met"] is False]
    killed = disruption.victim if disruption is not None and disruption.kind == "kill" else None
    failures = [f"{m.name} exited with status {code}" for m, code in zip(fleet.members, codes, strict=True)
                if code not in (0, -signal.SIGTERM) and not (m is killed and code == -signal.SIGKILL)]
    if disruption is not None and disruption.fired_ms is None:
        failures.append(f"the {disruption.kind} of {disruption.victim.name} never happened (the burst ended first)")
    if result["delivery"]["lost"]:
        failures.append(f"{result['delivery']['lost']:,} tasks were never published")
    if result["lateness_ms"]["early"]:
        failures.append(f"{result['lateness_ms']['early']:,} tasks were published before their time")
    if mix is not None and not result["fairness"]["global_rate"]["within"]:
        failures.append(f"{result['fairness']['global_rate']['max_units_in_1s']:,} units were released within one "
                        f"second, over the global rate of {mix.global_rate:,.0f}")
    if workers is not None:
        worker_failures, worker_warnings = workers.exit_problems((0, -signal.SIGTERM))
        failures += worker_failures
        document["warnings"] += worker_warnings
        if result["handling"]["delivery"]["lost"]:
            failures.append(f"{result['handling']['delivery']['lost']:,} tasks were not handled by a worker before "
                            "the bench stopped waiting")
    document["failures"] = failures
    return document
