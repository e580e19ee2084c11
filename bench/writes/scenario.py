"""Tasks written through every way a caller has, due from a minute ago to seconds ahead,
on a deployment where `scheduler dispatcher` and `scheduler worker` processes run (the
worker running `tests.worker.apps:app`, whose handlers record each start in a sink).

A row in the store is a promise whoever wrote it (`scheduler.dispatcher.shard`): it
fires, never before its run_at, late rather than never. The paths:

    connect    scheduler.connect().submit: the store and the hand-off
    client     Client(store) around a store opened by hand, as the README showed before
               connect existed (CassandraTaskStore.open / SqliteTaskStore): no hand-off
    insert     store.insert([Task(...)]): a row as another writer makes it, run_at as
               given (into the past too, with no idempotency key)
    cli        `scheduler submit`: --run-at with --key into the past, --delay ahead
    schedule   `scheduler schedule add --cron '* * * * *'` while the dispatcher runs: the
               run of its next slot, created by the dispatcher and handed off

Each task of the SDK paths and the CLI is due `offset` from the moment it is written
(`OFFSETS_MS`). Past run_at needs an idempotency key on the SDK's paths (without one a
past run_at means now) and on the CLI (`--run-at` in the past without `--key` is now).
A `scheduler submit` process takes a second or two to write, so its past offsets are
that much further in the past when it does.

What comes back (`run_writes`): each acknowledged write with when it was asked for and
when it returned, and from the worker app's sink every handler start, and from the ready
topics every publish with its stamp (`bench.writes.figures`). Writes run on this
process's threads, and the CLI processes at most `Plan.cli_parallel` at a time, since
each costs a core for a second or two on a machine that also runs the servers.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import scheduler
from bench.writes.figures import SCHEDULE, NotWritten, Seen, Written, bound_ms, seen
from scheduler import backends
from scheduler.backends import BackendSettings
from scheduler.connecting import backend_settings
from scheduler.errors import InvalidMessage, SchedulerError
from scheduler.model import Task, TaskId, decode_message, encode_payload, from_ms
from scheduler.ports import TaskStore
from scheduler.producer import Client
from scheduler.recurring.runner import run_id
from scheduler.recurring.schedule import schedule_id
from scheduler.settings import READY_TOPICS

OFFSETS_MS = (-60_000, -30_000, -5_000, -1_000, 0, 500, 2_000, 5_000)
SDK_PATHS = ("connect", "client", "insert")
PATHS = (*SDK_PATHS, "cli", SCHEDULE)
TENANT = "college"
TASK_TYPE = "sms"
SCHEDULE_TYPE = "reminder"
"""The test app's async handler: it records its start like `sms` does."""
OK: dict[str, Any] = {"mode": "ok"}
WORKER_APP = "tests.worker.apps:app"
SINK_ENV = "SCHEDULER_TEST_SINK"
REPOSITORY = Path(__file__).resolve().parents[2]
CLI_TIMEOUT_S = 60.0


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class RunLog(Protocol):
    """The worker app's record of handler starts (`tests.worker.apps.Sink`): rows of
    (task id, attempt, type, started ms, run_at ms, pid, fence)."""

    def runs(self) -> list[tuple[str, int, str, int, int, int, int]]: ...


def handler_starts(log: RunLog) -> dict[TaskId, list[int]]:
    found: dict[TaskId, list[int]] = {}
    for row in log.runs():
        found.setdefault(TaskId.parse(row[0]), []).append(row[3])
    return found


@dataclass(frozen=True)
class Plan:
    per_cell: int = 1
    """Tasks per SDK path and offset."""
    cli_per_offset: int = 1
    """`scheduler submit` processes per offset."""
    schedules: int = 1
    offsets_ms: tuple[int, ...] = OFFSETS_MS
    cli_parallel: int = 2
    """`scheduler` processes running at once."""


def open_by_hand(settings: BackendSettings) -> TaskStore:
    """The backend's store opened directly, as the README's example did before `connect`."""
    if settings.backend == "embedded":
        from scheduler.adapters.embedded.store import SqliteTaskStore

        return SqliteTaskStore(settings.db, shard_count=settings.cassandra.shard_count)
    from scheduler.adapters.cassandra.store import CassandraTaskStore

    return CassandraTaskStore.open(settings.cassandra)


@dataclass
class Producers:
    """What writes and cancels: `connected` (scheduler.connect: store and hand-off), and
    `by_hand`, a `Client(store)` without a hand-off around `store`, opened by hand."""

    env: dict[str, str]
    settings: BackendSettings
    connected: Client
    store: TaskStore
    by_hand: Client
    token: str = field(default_factory=lambda: secrets.token_hex(4))
    """Makes this run's idempotency keys and schedule names its own."""

    def client(self, path: str) -> Client:
        return self.connected if path == "connect" else self.by_hand


@contextmanager
def producers(env: Mapping[str, str]) -> Iterator[Producers]:
    """The producers of the deployment `env` (`SCHEDULER_*` variables) names."""
    variables = dict(env)
    settings = backend_settings(env=variables)
    with scheduler.connect(tenant=TENANT, env=variables) as connected:
        store = open_by_hand(settings)
        try:
            yield Producers(variables, settings, connected, store, Client(store, tenant=TENANT))
        finally:
            store.close()


def timing(asked_ms: int, offset_ms: int, key: str) -> dict[str, Any]:
    """submit's arguments for a task due `offset_ms` from `asked_ms`."""
    if offset_ms < 0:
        return {"run_at": from_ms(asked_ms + offset_ms), "idempotency_key": key}
    if offset_ms > 0:
        return {"delay": offset_ms / 1000}
    return {}


def sdk_write(producers: Producers, path: str, offset_ms: int, n: int) -> Written | NotWritten:
    asked = now_ms()
    try:
        if path == "insert":
            run_at = asked + offset_ms
            task = Task(TaskId.new(run_at), TENANT, TASK_TYPE, encode_payload(OK), run_at)
            failures = producers.store.insert([task])
            if failures:
                return NotWritten(path, offset_ms, failures[0].reason)
            task_id = task.id
        else:
            key = f"write-paths:{producers.token}:{path}:{offset_ms}:{n}"
            task_id = producers.client(path).submit(TASK_TYPE, OK, **timing(asked, offset_ms, key))
    except SchedulerError as exc:
        return NotWritten(path, offset_ms, f"{type(exc).__name__}: {exc}")
    return Written(path, offset_ms, task_id, asked, now_ms())


# The `scheduler` command.


@dataclass(frozen=True)
class Answer:
    code: int
    lines: list[tuple[str, int]]
    """Each line of stdout, with the moment it was read (ms)."""
    stderr: str

    def last(self) -> tuple[str, int]:
        return self.lines[-1] if self.lines else ("", 0)


def run_scheduler(env: Mapping[str, str], *args: str, timeout_s: float = CLI_TIMEOUT_S) -> Answer:
    """`python -m scheduler ARGS` in the deployment `env` names, as a user runs it; killed
    after `timeout_s`. Its stdout is read as it comes, so an answer's moment is when the
    command printed it, not when the process was done closing its connections."""
    with tempfile.TemporaryFile() as errors, subprocess.Popen(
        [sys.executable, "-m", "scheduler", *args], stdout=subprocess.PIPE, stderr=errors,
        env={**os.environ, **env}, cwd=REPOSITORY, text=True,
    ) as process:
        watchdog = threading.Timer(timeout_s, process.kill)
        watchdog.start()
        try:
            assert process.stdout is not None
            lines = [(line.rstrip("\n"), now_ms()) for line in process.stdout]
            code = process.wait()
        finally:
            watchdog.cancel()
        errors.seek(0)
        return Answer(code, lines, errors.read().decode(errors="replace"))


def cli_write(producers: Producers, offset_ms: int, n: int) -> Written | NotWritten:
    asked = now_ms()
    args = ["submit", TASK_TYPE, "--tenant", TENANT, "--payload", json.dumps(OK)]
    if offset_ms < 0:
        args += ["--run-at", from_ms(asked + offset_ms).isoformat(), "--key",
                 f"write-paths:{producers.token}:cli:{offset_ms}:{n}"]
    elif offset_ms > 0:
        args += ["--delay", f"{offset_ms / 1000:g}"]
    answer = run_scheduler(producers.env, *args)
    text, at = answer.last()
    if answer.code != 0:
        return NotWritten("cli", offset_ms, f"exit {answer.code}: {answer.stderr[-1000:]}")
    return Written("cli", offset_ms, TaskId.parse(text), asked, at)


def add_schedule(producers: Producers, n: int) -> Written | NotWritten:
    """A schedule of every minute; the run of its first slot, as the dispatcher will make it."""
    name = f"write-paths-{producers.token}-{n}"
    asked = now_ms()
    answer = run_scheduler(producers.env, "schedule", "add", name, "--tenant", TENANT, "--cron", "* * * * *",
                           "--zone", "UTC", "--type", SCHEDULE_TYPE, "--payload", "{}")
    _, at = answer.last()
    if answer.code != 0:
        return NotWritten(SCHEDULE, None, f"exit {answer.code}: {answer.stderr[-1000:]}")
    with backends.open_schedules(producers.settings, producers.store) as schedules:
        stored = schedules.get(schedule_id(TENANT, name))
    if stored is None:
        return NotWritten(SCHEDULE, None, f"schedule {name} was added but cannot be read back")
    return Written(SCHEDULE, None, run_id(stored, stored.rule.next_slot(stored.created_ms)), asked, at)


# One run.


def write_everything(producers: Producers, plan: Plan) -> tuple[list[Written], list[NotWritten]]:
    """Every path, every offset: the `scheduler` processes on a pool (started first, as
    they take longest), the SDK's writes on this thread meanwhile, round after round."""
    outcomes: list[Written | NotWritten] = []
    with ThreadPoolExecutor(plan.cli_parallel, thread_name_prefix="write-paths-cli") as pool:
        jobs: list[Future[Written | NotWritten]] = [pool.submit(add_schedule, producers, n)
                                                    for n in range(plan.schedules)]
        jobs += [pool.submit(cli_write, producers, offset, n) for n in range(plan.cli_per_offset)
                 for offset in plan.offsets_ms]
        for n in range(plan.per_cell):
            for offset in plan.offsets_ms:
                for path in SDK_PATHS:
                    outcomes.append(sdk_write(producers, path, offset, n))
        outcomes += [job.result() for job in jobs]
    return ([o for o in outcomes if isinstance(o, Written)], [o for o in outcomes if isinstance(o, NotWritten)])


def published(settings: BackendSettings) -> dict[TaskId, list[int]]:
    """Every task in the ready topics, with the stamp of each of its messages (ms)."""
    found: dict[TaskId, list[int]] = {}
    with backends.open_dead_letters(settings) as (scanner, _):  # a scanner of any topic
        for name in READY_TOPICS:
            for delivery in scanner.scan(settings.kafka.ready_topic(name)):
                try:
                    task = decode_message(delivery.value).task
                except InvalidMessage:
                    continue
                found.setdefault(task.id, []).append(delivery.timestamp_ms)
    return found


def wait_for_starts(written: Sequence[Written], log: RunLog, sweep_interval_ms: int, grace_ms: int,
                    progress: Callable[[int, int], None] | None = None) -> dict[TaskId, list[int]]:
    """Handler starts, once every written task started or `grace_ms` after the last one's
    bound passed (the waiting goes on past the bound, so a late task is told from a lost
    one)."""
    deadline = max((w.due_ms + bound_ms(w.path, sweep_interval_ms) for w in written), default=0) + grace_ms
    wanted = {w.task_id for w in written}
    while True:
        starts = handler_starts(log)
        done = len(wanted & starts.keys())
        if progress is not None:
            progress(done, len(wanted))
        if done == len(wanted) or now_ms() > deadline:
            return starts
        time.sleep(0.2)


@dataclass
class WriteRun:
    written: list[Written]
    not_written: list[NotWritten]
    results: list[Seen]


def run_writes(producers: Producers, plan: Plan, log: RunLog, sweep_interval_ms: int, grace_ms: int,
               progress: Callable[[int, int], None] | None = None) -> WriteRun:
    """Write everything, wait for the handlers, read the ready topics: what became of each."""
    written, not_written = write_everything(producers, plan)
    starts = wait_for_starts(written, log, sweep_interval_ms, grace_ms, progress)
    return WriteRun(written, not_written, seen(written, starts, published(producers.settings)))
