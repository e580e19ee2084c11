"""The status scenario, on either backend: real `scheduler dispatcher` and `scheduler
worker` processes, tasks submitted and cancelled through `scheduler.connect` as an
application does, and `scheduler status --json` run as a user runs it, until what it
shows equals what the test made happen (and the worker's own record of handler starts).
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from collections.abc import Mapping
from contextlib import ExitStack
from datetime import timedelta
from pathlib import Path
from typing import Any

from playwright.sync_api import Page

import scheduler
from tests.dispatchers import Fleet
from tests.readme import section
from tests.status_page import (
    browser_page,
    check_task,
    log_in,
    make_credentials,
    replay_from_page,
    screenshot,
    status_page,
)
from tests.status_page import shows as status_page_shows
from tests.support import wait_until
from tests.workers import Workers

OK_TASKS = 30
DEAD_TASKS = 5
WAITING = 4
CANCELLED = 3
BLOCKED = 2
OPS_SECRET = "ops-secret-of-the-status-test"


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
                        timeout_s: float = 90, page: bool = False) -> dict[str, Any]:
    """With `page`, the status page is opened in a browser too, logged in with a
    credential of every tenant, and must show the same counts, refresh itself to the end
    state, look tasks up and replay a dead letter."""
    with ExitStack() as stack:
        browser, url = None, ""
        if page:
            credentials = make_credentials(tmp_path / "ui-credentials", {"ops": ("all", OPS_SECRET)})
            url = stack.enter_context(status_page({**env, "SCHEDULER_TEST_SINK": str(workers.sink_path)},
                                                  tmp_path / "ui.log", credentials))
            browser = stack.enter_context(browser_page())
            log_in(browser, url, "ops", OPS_SECRET)
        return _scenario(env, fleet, workers, tmp_path, timeout_s, browser, url)


def _scenario(env: Mapping[str, str], fleet: Fleet, workers: Workers, tmp_path: Path, timeout_s: float,
              browser: Page | None, url: str) -> dict[str, Any]:
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
    # The blocked attempts' messages cannot be committed while they run.
    assert sum(blocked["consumer_lag"].values()) >= BLOCKED, blocked["consumer_lag"]
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
    # A tenant's own minutes are written every 10 s (the states at every write).
    wait_until(lambda: sum(m["done"] for m in status(full_env, "--tenant", "acme")["per_minute"]) == OK_TASKS,
               timeout_s=timeout_s, interval_s=1, what="acme's minutes to show its done tasks")
    navigations = []
    if browser is not None:
        browser.goto(url)
        browser.on("framenavigated", lambda frame: navigations.append(frame.url))
        wait_until(lambda: status_page_shows(browser, expected_while_blocked), timeout_s=timeout_s, interval_s=0.5,
                   what=f"the status page to show {expected_while_blocked}")
        assert browser.text_content("#owners") and browser.query_selector("#processes tr[data-role=worker]")

    release.write_text("go")
    done = {**expected_while_blocked, ("gamma", "sms"): {"done": BLOCKED}}
    def settled() -> dict[str, Any] | None:
        document = shows(done)
        return document if document is not None and not any(document["consumer_lag"].values()) else None

    final = wait_until(settled, timeout_s=timeout_s, interval_s=0.5,
                       what=f"status to show {done} and no consumer lag")
    assert final is not None
    if browser is not None:
        # The page, not reloaded, follows: its live part is fetched again every 3 s.
        wait_until(lambda: status_page_shows(browser, done), timeout_s=timeout_s, interval_s=0.5,
                   what=f"the open status page to show {done}")
        assert navigations == [], navigations
        screenshot(browser, tmp_path)
    sink = workers.sink()
    try:
        runs = sink.runs()
    finally:
        sink.close()
    assert len({run[0] for run in runs}) == started  # the handlers' own record: one task each
    check_history(full_env, str(ok[0]), "done", None)
    check_history(full_env, str(dead[0]), "dead", "invalid phone number")
    run_readme_commands(full_env, str(ok[0]))
    if browser is not None:
        check_task(browser, str(ok[0]), "done", None)
        check_task(browser, str(dead[0]), "dead", "invalid phone number")
        new_id = replay_from_page(browser, url, str(dead[0]))
        with scheduler.connect(env=full_env) as client:
            replayed = client.get(new_id)
        assert replayed is not None and (replayed.task.tenant, replayed.task.type) == ("beta", "sms")
    return final


README_ID = "01a244a5-3cd7-766c-b76a-50447abbfbc9"
"""The task id the README's example names; its commands run with a real one instead."""


def run_readme_commands(env: Mapping[str, str], task_id: str) -> None:
    """Each command of the README's "Seeing what is going on" block, as written (the
    example id replaced by a real one), exits 0 and prints something."""
    block = re.search(r"```sh\n(.*?)```", section("## Seeing what is going on"), re.S)
    assert block is not None, "the README's visibility section has no sh block"
    commands = [shlex.split(line, comments=True) for line in block.group(1).splitlines() if line.strip()]
    assert len(commands) == 3 and all(command[0] == "scheduler" for command in commands)
    for command in commands:
        args = [task_id if arg == README_ID else arg for arg in command[1:]]
        result = subprocess.run([sys.executable, "-m", "scheduler", *args], env=dict(env), capture_output=True,
                                text=True, timeout=60, check=False)
        assert result.returncode == 0 and result.stdout.strip(), (command, result.stderr)


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
