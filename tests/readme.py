"""The README's Python examples, run the way a user runs them, against a running
`scheduler dispatcher` and `scheduler worker`.

`python_block(heading)` takes the one Python block of the README section under that
heading, found by the heading, so a README that changes shape fails the tests loudly.
`check_readme_examples` writes the "Workers" block to `results_app.py` (the module the
README's `scheduler worker --app results_app:app` names), starts a dispatcher and that
worker in the deployment `env` describes, runs the "Submitting tasks from Python" block
as a script in a process of its own with nothing but the `SCHEDULER_*` variables set,
and checks that every task it submitted was handed off to the dispatcher (through
`scheduler.connect`), fired no earlier than its `run_at`, and ended `done`.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import scheduler
from scheduler import backends
from scheduler.connecting import backend_settings
from scheduler.handoff import HandedTask, decode
from scheduler.model import TaskId, decode_message
from scheduler.ports import TaskStatus
from scheduler.settings import READY_TOPICS
from tests.dispatchers import Fleet
from tests.support import run_cli, wait_until
from tests.workers import SESSION_TIMEOUT_S, WorkerProcess, Workers

README = Path(__file__).resolve().parents[1] / "README.md"
SUBMIT_SECTION = "## Submitting tasks from Python"
WORKERS_SECTION = "## Workers"
APP_MODULE = "results_app"
WORKER_COMMAND = f"scheduler worker --app {APP_MODULE}:app"
"""How the README says to run its Workers block."""
START_TIMEOUT_S = 40.0
FINISH_TIMEOUT_S = 40.0

RUNNER = '''\
"""Runs the script named by the first argument as `python SCRIPT` would, then prints the
ids of the tasks it submitted: every TaskId it left in a global, and a SubmitReport's."""

import json
import runpy
import sys

from scheduler.model import TaskId
from scheduler.producer import SubmitReport

names = runpy.run_path(sys.argv[1], run_name="__main__")
ids = [str(value) for value in names.values() if isinstance(value, TaskId)]
for value in names.values():
    if isinstance(value, SubmitReport):
        ids += [str(task_id) for task_id in value.ids or () if task_id is not None]
print("submitted:", json.dumps(ids))
'''


def section(heading: str) -> str:
    """The text of the README section under the `## ` heading `heading`, up to the next one."""
    lines = README.read_text().splitlines(keepends=True)
    starts = [n for n, line in enumerate(lines) if line.rstrip("\n") == heading]
    assert len(starts) == 1, f"README.md has {len(starts)} sections headed {heading!r}, not one"
    body = []
    for line in lines[starts[0] + 1:]:
        if line.startswith("## "):
            break
        body.append(line)
    return "".join(body)


def python_blocks(heading: str, count: int) -> list[str]:
    """The `count` ```python blocks of the README section under `heading`, in order."""
    blocks = re.findall(r"^```python\n(.*?)^```$", section(heading), flags=re.DOTALL | re.MULTILINE)
    assert len(blocks) == count, f"the README section {heading!r} has {len(blocks)} Python blocks, not {count}"
    return [str(block) for block in blocks]


def python_block(heading: str) -> str:
    """The one ```python block of the README section under `heading`."""
    return python_blocks(heading, 1)[0]


def user_env(env: Mapping[str, str]) -> dict[str, str]:
    """A user's environment: the `SCHEDULER_*` variables (this process's, then `env`'s) and nothing else."""
    return {name: value for name, value in {**os.environ, **env}.items() if name.startswith("SCHEDULER_")}


def start_worker(workers: Workers, app_dir: Path, command: str = WORKER_COMMAND,
                 heading: str = WORKERS_SECTION) -> WorkerProcess:
    """`scheduler worker --app results_app:app` (or `command`), run in the application's
    directory as the README says (the current directory is importable), among `workers`
    for their waiting and stopping."""
    assert command in section(heading), f"the README section {heading!r} no longer says {command!r}"
    name = "readme-worker"
    log_path = workers.directory / f"{name}.log"
    stats_path = workers.directory / f"{name}.json"
    log_file = log_path.open("wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "scheduler", *command.split()[1:], "--member", name,
         "--stats-file", str(stats_path), "--session-timeout", str(SESSION_TIMEOUT_S)],
        cwd=app_dir, stdout=log_file, stderr=log_file, env={**os.environ, **workers.env, "PYTHONUNBUFFERED": "1"},
    )
    worker = WorkerProcess(name, process, log_path, stats_path, log_file)
    workers.workers.append(worker)
    return worker


def run_submit_example(env: Mapping[str, str], directory: Path) -> list[TaskId]:
    """Run the submit block as `python submit_example.py` with only `SCHEDULER_*` set; the
    ids of the tasks it submitted."""
    script = directory / "submit_example.py"
    script.write_text(python_block(SUBMIT_SECTION))
    runner = directory / "run_example.py"
    runner.write_text(RUNNER)
    result = subprocess.run([sys.executable, str(runner), str(script)], cwd=directory, env=user_env(env),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, f"the README's submit example failed:\n{result.stdout}\n{result.stderr}"
    *_, last = result.stdout.splitlines()
    assert last.startswith("submitted: "), result.stdout
    return [TaskId.parse(text) for text in json.loads(last.removeprefix("submitted: "))]


def check_readme_examples(env: Mapping[str, str], directory: Path, dispatchers: Fleet,
                          count_stored: Callable[[], int]) -> list[TaskId]:
    """Run both examples in the deployment of `env` with one dispatcher of `dispatchers`
    and the README's worker, and check every task the submit example made; its ids.
    `count_stored` counts the tasks in the deployment's store (none before)."""
    settings = backend_settings(env=user_env(env))
    app_dir = directory / "app"
    app_dir.mkdir()
    (app_dir / f"{APP_MODULE}.py").write_text(python_block(WORKERS_SECTION))
    workers = Workers(env, directory, directory / "sink.db")
    try:
        dispatcher = dispatchers.start("readme-dispatcher")
        worker = start_worker(workers, app_dir)
        dispatchers.wait_for_split({dispatcher.name: settings.cassandra.shard_count}, timeout_s=START_TIMEOUT_S)
        workers.wait_started(worker, timeout_s=START_TIMEOUT_S)

        submitted = run_submit_example(env, directory)
        assert len(submitted) == len(set(submitted)) == count_stored() > 0

        with scheduler.connect(env=user_env(env)) as client:
            def statuses() -> dict[TaskStatus, int]:
                found: dict[TaskStatus, int] = {}
                for task_id in submitted:
                    stored = client.get(task_id)
                    status = TaskStatus.SCHEDULED if stored is None else stored.status
                    found[status] = found.get(status, 0) + 1
                return found

            wait_until(lambda: statuses() == {TaskStatus.DONE: len(submitted)}, timeout_s=FINISH_TIMEOUT_S,
                       interval_s=0.2, what=f"every task the README submitted to be done (worker log:\n"
                       f"{worker.log()[-2000:]})")
        wait_until(lambda: dispatcher.stats().get("stats", {}).get("handed_tasks", 0) >= len(submitted),
                   timeout_s=10, what="the dispatcher to count the tasks handed off to it")

        with backends.open_dead_letters(settings) as (scanner, _):  # a scanner of any topic
            handoffs = [decode(d.value) for d in scanner.scan(settings.kafka.handoff_topic)]
            fired = [(decode_message(d.value).task, d.timestamp_ms)
                     for name in READY_TOPICS for d in scanner.scan(settings.kafka.ready_topic(name))]
        # Each task is due within the hand-off window, so connect's hand-off announced each.
        assert {item.task.id for item in handoffs if isinstance(item, HandedTask)} == set(submitted)
        assert {task.id for task, _ in fired} == set(submitted)
        early = [(str(task.id), at_ms - task.run_at_ms) for task, at_ms in fired if at_ms < task.run_at_ms]
        assert not early, f"fired before their run_at (id, ms): {early}"
        return submitted
    finally:
        workers.stop_all()


WORKFLOWS_SECTION = "## Workflows"
FLOW_MODULE = "results_flow"
FLOW_COMMAND = f"scheduler worker --app {FLOW_MODULE}:app"


def check_workflow_example(env: Mapping[str, str], directory: Path, dispatchers: Fleet) -> dict[str, Any]:
    """Run the README's "Workflows" section as a user would: its first block as
    `results_flow.py` under `scheduler worker`, its second as a script with only
    `SCHEDULER_*` set, a dispatcher beside them; the workflow succeeds, every step ran
    once in order, the report joined every send, and `scheduler workflow show` says so
    (as JSON, which this returns, and as text)."""
    handlers, submit = python_blocks(WORKFLOWS_SECTION, 2)
    settings = backend_settings(env=user_env(env))
    app_dir = directory / "flow-app"
    app_dir.mkdir()
    (app_dir / f"{FLOW_MODULE}.py").write_text(handlers)
    workers = Workers(env, directory, directory / "sink.db")
    try:
        dispatcher = dispatchers.start("readme-flow-dispatcher")
        worker = start_worker(workers, app_dir, FLOW_COMMAND, WORKFLOWS_SECTION)
        dispatchers.wait_for_split({dispatcher.name: settings.cassandra.shard_count}, timeout_s=START_TIMEOUT_S)
        workers.wait_started(worker, timeout_s=START_TIMEOUT_S)
        script = directory / "submit_flow.py"
        script.write_text(submit)
        for _ in range(2):  # the second submit is the same workflow, as the example says
            result = subprocess.run([sys.executable, str(script)], cwd=directory, env=user_env(env),
                                    capture_output=True, text=True, timeout=60)
            assert result.returncode == 0, f"the README's workflow example failed:\n{result.stdout}\n{result.stderr}"
            assert result.stdout.strip() == "results-2026"
        show = ["workflow", "show", "results-2026", "--tenant", "state-board"]

        def shown() -> dict[str, Any]:
            answer = run_cli(*show, "--json", env=user_env(env))
            assert answer.returncode == 0, answer.stderr
            found: dict[str, Any] = json.loads(answer.stdout)
            return found

        wait_until(lambda: shown()["state"] == "succeeded", timeout_s=FINISH_TIMEOUT_S * 2, interval_s=0.5,
                   what=f"the README's workflow to succeed (worker log:\n{worker.log()[-2000:]})")
        final = shown()
        assert {step["name"]: step["states"] for step in final["steps"]} == {
            "render": {"done": 40}, "send": {"done": 40}, "report": {"done": 1}, "alert": {"not needed": 1}}
        log = worker.log()
        # print() writes its newline apart: two threads' lines may interleave.
        rendered = set(re.findall(r"rendering batch (\d+)", log))
        assert rendered == {str(n) for n in range(40)}, log[-2000:]
        assert "report to board@example.org: 20000 SMS in 40 batches" in log, log[-2000:]
        text = run_cli(*show, env=user_env(env))
        assert text.returncode == 0 and "results-2026 of state-board: succeeded" in text.stdout, text.stdout
        return final
    finally:
        workers.stop_all()


RETENTION_SECTION = "## How long things are kept"


def check_retention_commands(env: Mapping[str, str]) -> None:
    """The README's retention commands, as written, on a store at the default: `show`
    prints 7d, `set 3d` says what it changed, and `show` then prints 3d."""
    blocks = re.findall(r"```sh\n(.*?)```", section(RETENTION_SECTION), re.S)
    assert len(blocks) == 1, f"the README's retention section has {len(blocks)} sh blocks, not one"
    commands = [shlex.split(line, comments=True) for line in blocks[0].splitlines() if line.strip()]
    assert [command[:3] for command in commands] == [["scheduler", "retention", "show"],
                                                     ["scheduler", "retention", "set"]], commands
    said = [run_cli(*command[1:], env=env) for command in commands]
    assert all(result.returncode == 0 for result in said), [result.stderr for result in said]
    assert said[0].stdout.strip() == "7d"
    assert said[1].stdout.strip() == f"retention {commands[1][3]} (was 7d)"
    assert run_cli(*commands[0][1:], env=env).stdout.strip() == commands[1][3]
