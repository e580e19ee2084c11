"""One run of the chaos bench: one fault during one burst, on a deployment of its own.

Phase by phase: a keyspace (replicated as `SCHEDULER_REPLICATION` says: 3 times on the
three-node cluster), topics (the brokers' default: 3 replicas, 2 in sync) and a
ZooKeeper root of the run's own; the burst stored with the SDK (`--tasks` due evenly
over `--spread-s` from M); two dispatchers (the victim of a cut started in a cgroup of
its own), `--workers` workers, the ready-topic reader, the cursor watch and the
producer, which keeps submitting until the burst's last second. At M + `--fault-at-s`
the fault is injected, and undone after its hold time. The run then waits until every
acknowledged task was published and every worker settled (or gives up at the
deadline), stops everything with SIGTERM (workers drain and write their handler
starts), and reconciles.

Failures (listed in the document, exit 1 from `bench/chaos.py`): an acknowledged task
not published or not handled, a task published or handled before its time, a cursor
that moved backwards, a scheduler process that died."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.nine.common import BenchFailure, clock, echo, now_ms
from bench.nine.deployment import REPOSITORY, Deployment, Fleet
from bench.nine.reader import Reader
from bench.nine.settings import SETTLE_TIMEOUT_S
from bench.nine.workers import Handled, WorkerFleet, all_settled
from bench.nine.workload import Burst, ingest, text_length_for

from . import producer
from .catalog import Fault, Scene
from .cursors import CursorWatch
from .netcut import CutGroup
from .nodes import Nodes
from .reconcile import lost_sample, reconcile
from .replica import rows_on_node

DISPATCHERS = 2
SETTLE_AFTER_S = 150
"""How long after the burst's end (or the fault's undoing, if later) the run waits for
every acknowledged task to be published and handled."""
HINTS_WAIT_S = 60
"""How long after the run the restarted node may take to hold what it missed."""
INGEST_ROWS_PER_S = 3_000
"""For choosing M on the three-node cluster (RF 3: every row written three times)."""


@dataclass(frozen=True)
class Shape:
    tasks: int = 6_000
    spread_s: int = 60
    lead_s: int = 20
    fault_at_s: float = 10.0
    workers: int = 2
    worker_concurrency: int = 16
    producer_rate: float = 10.0
    producer_give_up_s: float = 120.0
    colleges: int = 50
    payload_bytes: int = 120


def run_fault(fault: Fault | None, shape: Shape, nodes: Nodes, work_root: Path, keep: bool,
              cleanup: list[Callable[[], None]]) -> dict[str, Any]:
    """One run; `fault` None is the baseline (the same burst, nothing broken)."""
    name = fault.name if fault else "none"
    deployment = Deployment.fresh("chaos")
    work_dir = Path(tempfile.mkdtemp(prefix=f"chaos-{name}-", dir=work_root))
    document: dict[str, Any] = {"fault": name, "work_dir": str(work_dir),
                                "keyspace": deployment.cassandra.keyspace,
                                "replication": deployment.cassandra.replication,
                                "consistency": deployment.cassandra.consistency}
    from scheduler.adapters.cassandra.connection import connect
    connection = connect(deployment.cassandra)
    try:
        deployment.create(connection, cleanup, keep)
    finally:
        connection.close()
    env = {**os.environ, **deployment.env()}

    text_len = text_length_for(shape.payload_bytes)
    minute_ms = math.ceil((now_ms() + (shape.tasks / INGEST_ROWS_PER_S + shape.lead_s) * 1000) / 1000) * 1000
    burst = Burst(minute_ms, shape.tasks, shape.spread_s * 1000, text_len, shape.colleges)
    echo(f"[{name}] M = {clock(minute_ms)}; storing {shape.tasks:,} tasks ...")
    document["ingest"], expected = ingest(deployment.cassandra, burst.submissions(seed=1))
    end_ms = minute_ms + shape.spread_s * 1000

    scene = Scene(nodes, deployment.kafka, deployment.ready_topics)
    preexec: dict[str, Callable[[], None]] = {}
    if fault is not None and fault.cut_dispatcher is not None:
        group = CutGroup(fault.cut_dispatcher)
        scene.cut_groups[fault.cut_dispatcher] = group
        cleanup.append(group.remove)
        preexec[fault.cut_dispatcher] = group.enter
    fleet = Fleet(deployment.env(), ["--backend", "cassandra"], work_dir)
    workers = WorkerFleet(env, work_dir, ["--backend", "cassandra"])
    reader = Reader("process", deployment.kafka, deployment.ready_topics)
    watch = CursorWatch(deployment.cassandra)
    producer_dir = work_dir / "producer"
    producer_log = (work_dir / "producer.log").open("wb")
    feeder: subprocess.Popen[bytes] | None = None
    codes: list[int | None] = []
    completed = False
    try:
        fleet.start(DISPATCHERS, preexec)
        scene.dispatchers = fleet.members
        workers.start(shape.workers, shape.worker_concurrency)
        watch.start()
        feeder = subprocess.Popen(
            [sys.executable, "-m", "bench.faults.producer", "--out", str(producer_dir), "--rate",
             str(shape.producer_rate), "--until-ms", str(end_ms), "--give-up-s", str(shape.producer_give_up_s)],
            stdout=producer_log, stderr=subprocess.STDOUT, env=env, cwd=REPOSITORY, start_new_session=True)
        settle_s = fleet.wait_for_shards(SETTLE_TIMEOUT_S)
        echo(f"[{name}] dispatchers hold the shards after {settle_s:.1f} s; burst at {clock(minute_ms)}")
        if fault is not None:
            sleep_until(minute_ms + round(shape.fault_at_s * 1000), fleet, workers, feeder)
            fault.inject(scene)
            sleep_until(now_ms() + round(fault.hold_s * 1000), fleet, workers, feeder)
            fault.recover(scene)
        sleep_until(end_ms, fleet, workers, feeder)
        if feeder.wait(timeout=180) != 0:
            raise BenchFailure(f"the producer exited with status {feeder.returncode} (see {work_dir}/producer.log)")
        acked = producer.read_results(producer_dir)
        expected.update(acked.acked)
        recovered_at = fault.recovered_ms if fault is not None and fault.recovered_ms else 0
        deadline = max(end_ms, recovered_at) / 1000 + SETTLE_AFTER_S
        while time.time() < deadline:
            workers.poll()
            if reader.seen >= len(expected) and all_settled(workers.totals(), len(expected)):
                break
            fleet.check_alive()
            workers.check_alive()
            time.sleep(0.5)
        else:
            echo(f"[{name}] gave up waiting: {reader.seen:,} of {len(expected):,} published, workers "
                 f"{workers.totals()['done']:,} done")
        completed = True
    finally:
        # Each step on its own: one that fails (or is interrupted) must not leave the
        # rest running, nor a node stopped or a dispatcher cut off for the next run.
        def stop_feeder() -> None:
            if feeder is not None and feeder.poll() is None:
                feeder.send_signal(signal.SIGTERM)
                try:
                    feeder.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    feeder.kill()

        def undo() -> None:
            if fault is not None and fault.injected_ms is not None and fault.recovered_ms is None:
                fault.recover(scene)

        def stop_fleet() -> None:
            codes.extend(fleet.stop())

        def stop_workers() -> None:
            workers.stop()

        steps: list[Callable[[], None]] = [stop_feeder, producer_log.close,
                                           *(group.restore for group in scene.cut_groups.values()), undo,
                                           stop_fleet, stop_workers, watch.stop]
        if not completed:
            steps.append(reader.abort)
        for step in steps:
            try:
                step()
            except BaseException as error:  # noqa: BLE001 - the next step must run
                echo(f"warning: cleanup ({getattr(step, '__name__', step)}) failed: {error!r}")
    cursors = watch.figures()
    if len(codes) != len(fleet.members):  # stopping them failed: their exit is unknown
        codes = [None] * len(fleet.members)
    records, _ = reader.finish()
    handled = workers.records()
    acked = producer.read_results(producer_dir)
    injected = fault.injected_ms if fault else None
    recovered = fault.recovered_ms if fault else None
    result = reconcile(records, handled, expected, injected, recovered)
    replica = None
    if fault is not None and fault.name == "cassandra-kill" and injected and recovered:
        assert fault.target is not None
        host = str(nodes.status()[fault.target]["host"])
        replica = restarted_node_rows(host, deployment, expected, acked, handled, injected, recovered)
    document.update({
        "shape": shape.__dict__, "minute_ms": minute_ms,
        "fault": fault.figures() if fault else {"fault": "none"},
        "injected_after_minute_s": None if injected is None else round((injected - minute_ms) / 1000, 1),
        "producer": producer_figures(acked, injected, recovered),
        "result": result, "cursors": cursors, "restarted_node": replica,
        "dispatchers": [{"name": m.name, "exit_code": code, "log": str(m.log_path),
                         "warnings": m.log_warnings()["count"]} for m, code in zip(fleet.members, codes, strict=True)],
        "workers": workers.describe(),
    })
    failures = []
    if result["lost_unpublished"] or result["lost_unhandled"]:
        failures.append(f"{result['lost_unpublished']} acknowledged tasks never published, "
                        f"{result['lost_unhandled']} never handled")
        document["lost_sample"] = lost_sample(expected, records, handled)
    if result["early_published"] or result["early_handled"]:
        failures.append(f"{result['early_published']} published and {result['early_handled']} handled early")
    if replica is not None and (replica["rows"] < replica["asked"] or replica["done"] < replica["asked"]):
        failures.append(f"the restarted node holds {replica['rows']} of the {replica['asked']} rows written while it "
                        f"was down, {replica['done']} with their final status, {HINTS_WAIT_S} s after")
    if not cursors["reads"]:
        failures.append(f"the cursor watch read nothing ({cursors['first_error']})")
    given_up = document["producer"]["given_up"]
    if given_up:
        failures.append(f"the producer gave up on {given_up} tasks after retrying for {shape.producer_give_up_s} s")
    if fault is not None and fault.cut_dispatcher is not None and not fault.details.get("dropped_packets"):
        failures.append("the cut dropped no packet: the fault did not happen")
    if fault is not None and fault.name == "dispatcher-zookeeper-cut" and not cursors["shards_that_changed_owner"]:
        failures.append("no shard changed owner although a dispatcher was cut off from ZooKeeper past its lease")
    if cursors["backwards"]:
        failures.append(f"{cursors['backwards']} cursor reads went backwards")
    failures += [f"{m.name} exited with status {code}" for m, code in zip(fleet.members, codes, strict=True)
                 if code not in (0, -signal.SIGTERM)]
    worker_failures, _ = workers.exit_problems((0, -signal.SIGTERM))
    failures += worker_failures
    document["failures"] = failures
    return document


def restarted_node_rows(host: str, deployment: Deployment, expected: dict[bytes, int],
                        acked: producer.Results, handled: list[Handled], injected: int,
                        recovered: int) -> dict[str, Any]:
    """The restarted node's own copy of what was written while it was down: the rows of
    tasks acknowledged then, and the final statuses of tasks handled then (hints
    deliver them); asked again until complete or `HINTS_WAIT_S` has passed."""
    while_down = {key: expected[key] for key, at in acked.acked_when.items() if injected <= at < recovered}
    while_down.update({h.task_id: expected[h.task_id] for h in handled
                       if injected <= h.start_ms < recovered and h.task_id in expected})
    deadline = time.monotonic() + HINTS_WAIT_S
    while True:
        found = rows_on_node(host, deployment.cassandra.port, deployment.cassandra.keyspace, while_down,
                             deployment.cassandra.shard_count)
        if found["rows"] == found["done"] == found["asked"] or time.monotonic() > deadline:
            return found
        time.sleep(5)


def producer_figures(results: producer.Results, injected_ms: int | None,
                     recovered_ms: int | None) -> dict[str, Any]:
    """Submits acknowledged and failed, over the run and while the fault lasted (from its
    start until it was undone); the
    slowest acknowledgement; the longest time without one."""
    moments = sorted(results.acked_at_ms)
    gaps = [later - earlier for earlier, later in zip(moments, moments[1:], strict=False)]
    latency = sorted(results.ack_latency_ms)
    figures: dict[str, Any] = {
        "acknowledged": len(results.acked), "failed_submits": len(results.failures),
        "given_up": len(results.summary.get("given_up", [])),
        "errors": sorted({failure["error"] for failure in results.failures}),
        "first_error": results.failures[0]["text"] if results.failures else None,
        "ack_ms_p99": latency[max(0, math.ceil(0.99 * len(latency)) - 1)] if latency else None,
        "ack_ms_max": latency[-1] if latency else None,
        "longest_gap_s": round(max(gaps) / 1000, 1) if gaps else None,
    }
    if injected_ms is not None:
        end = recovered_ms or injected_ms
        figures["acknowledged_while_faulted"] = sum(1 for at in moments if injected_ms <= at <= end)
        figures["failed_while_faulted"] = sum(1 for failure in results.failures if injected_ms <= failure["at_ms"] <= end)
    return figures


def sleep_until(at_ms: int, fleet: Fleet, workers: WorkerFleet,
                feeder: subprocess.Popen[bytes] | None = None) -> None:
    """Wait until `at_ms`, failing early if a dispatcher, a worker or the producer dies."""
    while (left := at_ms - now_ms()) > 0:
        fleet.check_alive()
        workers.check_alive()
        if feeder is not None and feeder.poll() not in (None, 0):
            raise BenchFailure(f"the producer exited with status {feeder.returncode} before the burst ended "
                               "(its output is producer.log in the work directory)")
        workers.poll()
        time.sleep(min(left / 1000, 0.5))
