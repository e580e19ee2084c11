"""The status scenario, on either backend: real `scheduler dispatcher` and `scheduler
worker` processes, tasks submitted and cancelled through `scheduler.connect` as an
application does, and `scheduler status --json` run as a user runs it, until what it
shows equals what the test made happen (and the worker's own record of handler starts).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

import scheduler
from tests.dispatchers import Fleet
from tests.support import wait_until
from tests.workers import Workers

OK_TASKS = 30
DEAD_TASKS = 5
WAITING = 4
CANCELLED = 3
BLOCKED = 2


def status(env: Mapping[str, str], *args: str) -> dict[str, Any]:
    result = subprocess.run([sys.executable, "-m", "scheduler", "status", "--json", *args], env=dict(env),
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    document: dict[str, Any] = json.loads(result.stdout)
    return document


def counts_of(document: Mapping[str, Any]) -> dict[tuple[str, str], dict[str, int]]:
    return {(row["tenant"], row["type"]): {k: v for k, v in row.items() if k not in ("tenant", "type")}
            for row in document["counts"]}


def nonzero(counts: Mapping[tuple[str, str], Mapping[str, int]]) -> dict[tuple[str, str], dict[str, int]]:
    return {pair: {state: n for state, n in states.items() if n} for pair, states in counts.items()
            if any(states.values())}


def run_status_scenario(env: Mapping[str, str], fleet: Fleet, workers: Workers, tmp_path: Path,
                        timeout_s: float = 90) -> dict[str, Any]:
    full_env = {**env, "SCHEDULER_TEST_SINK": str(workers.sink_path)}
    fleet.start("d1")
    worker = workers.start("w1", concurrency=8)
    workers.wait_started(worker)
    wait_until(lambda: status(full_env)["shards"] and all(s["owner"] == "d1" for s in status(full_env)["shards"]),
               timeout_s=timeout_s, what="d1 to hold every shard")
    release = tmp_path / "release"
    with scheduler.connect(env=full_env) as client:
        ok = [client.submit("sms", {}, tenant="acme", delay=timedelta(seconds=2)) for _ in range(OK_TASKS)]
        dead = [client.submit("sms", {"mode": "permanent"}, tenant="beta") for _ in range(DEAD_TASKS)]
        for _ in range(BLOCKED):
            client.submit("sms", {"mode": "wait_for", "path": str(release)}, tenant="gamma")
        for _ in range(WAITING):
            client.submit("reminder", {}, tenant="acme", delay=timedelta(hours=1))
        doomed = [client.submit("reminder", {}, tenant="delta", delay=timedelta(hours=1)) for _ in range(CANCELLED)]
        for task_id in doomed:
            assert client.cancel(task_id, tenant="delta").value == "cancelled"

    expected_while_blocked = {
        ("acme", "sms"): {"done": OK_TASKS},
        ("beta", "sms"): {"dead": DEAD_TASKS},
        ("gamma", "sms"): {"running": BLOCKED},
        ("acme", "reminder"): {"waiting": WAITING},
        ("delta", "reminder"): {"cancelled": CANCELLED},
    }

    def shows(expected: Mapping[tuple[str, str], Mapping[str, int]]) -> dict[str, Any] | None:
        document = status(full_env)
        return document if nonzero(counts_of(document)) == expected else None

    blocked = wait_until(lambda: shows(expected_while_blocked), timeout_s=timeout_s, interval_s=0.5,
                         what=f"status to show {expected_while_blocked}")
    assert blocked is not None
    assert blocked["total"]["running"] == BLOCKED and blocked["dead_by_tenant"] == {"beta": DEAD_TASKS}
    roles = sorted(p["role"] for p in blocked["processes"])
    assert roles == ["dispatcher", "worker"], roles
    started = OK_TASKS + DEAD_TASKS + BLOCKED
    assert blocked["lateness"]["start"]["count"] == started
    assert blocked["lateness"]["fire"]["count"] == started
    minutes = blocked["per_minute"]
    assert sum(m["submitted"] for m in minutes) == started + WAITING + CANCELLED
    assert sum(m["done"] for m in minutes) == OK_TASKS and sum(m["dead"] for m in minutes) == DEAD_TASKS
    assert sum(m["cancelled"] for m in minutes) == CANCELLED
    only_acme = status(full_env, "--tenant", "acme")
    assert nonzero(counts_of(only_acme)) == {("acme", "sms"): {"done": OK_TASKS},
                                            ("acme", "reminder"): {"waiting": WAITING}}
    assert sum(m["done"] for m in only_acme["per_minute"]) == OK_TASKS

    release.write_text("go")
    done = {**expected_while_blocked, ("gamma", "sms"): {"done": BLOCKED}}
    final = wait_until(lambda: shows(done), timeout_s=timeout_s, interval_s=0.5, what=f"status to show {done}")
    assert final is not None
    sink = workers.sink()
    try:
        runs = sink.runs()
    finally:
        sink.close()
    assert len({run[0] for run in runs}) == started  # the handlers' own record: one task each
    check_history(full_env, str(ok[0]), "done", None)
    check_history(full_env, str(dead[0]), "dead", "invalid phone number")
    return final


def check_history(env: Mapping[str, str], task_id: str, outcome: str, error: str | None) -> None:
    """`scheduler get ID --history` (JSON and text) shows the one attempt as it ended."""
    result = subprocess.run([sys.executable, "-m", "scheduler", "get", task_id, "--history", "--json"],
                            env=dict(env), capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    (record,) = json.loads(result.stdout)["history"]
    assert record["attempt"] == 1 and record["outcome"] == outcome and record["worker"] == "w1"
    assert record["fired_ms"] <= record["started_ms"] <= record["finished_ms"]
    assert (error is None and record["error"] is None) or (error is not None and error in record["error"])
    text = subprocess.run([sys.executable, "-m", "scheduler", "get", task_id, "--history"], env=dict(env),
                          capture_output=True, text=True, timeout=60, check=False).stdout
    assert f"attempt 1: {outcome}; published " in text and " on w1" in text
