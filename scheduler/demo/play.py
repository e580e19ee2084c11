"""The whole demo, step by step (`play`):

1. Two dispatchers start and share the 64 shards; two workers join.
2. The board submits its results day as a workflow, due `lead_s` from now: render
   each batch, send each rendered batch's SMS, report to its office once every batch is
   sent; the college books its reminders for `reminder_delay_s` after that; one
   reminder cannot be delivered.
3. While the results go out, one worker is killed (kill -9) in the middle of a batch:
   the other worker receives its uncommitted batches and re-runs them; the provider
   absorbs the messages already sent.
4. Halfway to the reminders, dispatcher-1 is killed (kill -9) with the reminders of its
   shards loaded; its leases expire and dispatcher-2 takes every shard over and fires
   them on time.
5. When every task has ended (or the deadline passed), the workers and the dispatcher
   are stopped and the summary reconciles every task and every SMS.
"""

from __future__ import annotations

import functools
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from scheduler import backends
from scheduler.connecting import backend_settings, connect
from scheduler.errors import SchedulerError, StoreUnavailable
from scheduler.model import TaskId, from_ms
from scheduler.ports import StoredTask
from scheduler.ports.workflows import WorkflowState
from scheduler.producer import Client
from scheduler.ui.serving import PageServer
from scheduler.visibility.status import read_status
from scheduler.workflows.engine import decode_definition, member_task_ids

from .app import GATEWAY_ENV
from .board import Board, Frame
from .fleet import Fleet, Member
from .gateway import Gateway, Start, now_ms
from .local import LEASE_TIMEOUT_S, LocalDeployment
from .outcome import Planned, against_status, status_counts, summarise
from .story import BOARD, COLLEGE, RESULT_TYPE, WORKFLOW_ID, Story

APP = "scheduler.demo.app:app"
SESSION_TIMEOUT_S = 6.0
"""The workers' group session timeout: the smallest Kafka accepts by default
(`group.min.session.timeout.ms`), so a killed worker's batches move on quickly."""
START_TIMEOUT_S = 60.0
FINISH_GRACE_S = 90.0
"""How long after the reminders are due the demo waits for every task to end."""
TICK_S = 0.2
BACKEND_NAMES = {"embedded": "embedded backend (SQLite files, no servers)",
                 "local": "local cluster (Cassandra, Kafka, ZooKeeper)"}


class DemoFailure(SchedulerError):
    """The demo could not play its story (a process died, a submit failed)."""


@dataclass(frozen=True)
class DemoOptions:
    story: Story = field(default_factory=Story)
    backend: str = "embedded"
    """embedded (SQLite files, no servers) or local (the real servers)."""
    directory: Path | None = None
    lead_s: float = 10.0
    workers: int = 2
    concurrency: int = 4
    keep: bool = False
    page: tuple[str, int] | None = ("127.0.0.1", 0)
    """Where the status page listens while the demo plays (port 0: any free port); None: no page."""


@dataclass
class Stage:
    """Where the story is: what has happened, and when (ms since the demo began)."""

    began_ms: int
    events: list[dict[str, Any]] = field(default_factory=list)
    worker_killed: bool = False
    dispatcher_killed: Member | None = None
    killed_shards: frozenset[int] = frozenset()
    reowned: bool = False

    def note(self, what: str, **figures: Any) -> None:
        self.events.append({"at_s": round((now_ms() - self.began_ms) / 1000, 1), "what": what, **figures})


def play(options: DemoOptions, console: Console) -> dict[str, Any]:
    """Play the story; the summary document (`outcome.summarise`). Raises `DemoFailure`
    if it cannot be played, and the scheduler's errors if a backend is unreachable."""
    directory = options.directory or Path(tempfile.mkdtemp(prefix="scheduler-demo-"))
    directory.mkdir(parents=True, exist_ok=True)
    if any(directory.iterdir()):
        raise DemoFailure(f"{directory} is not empty: the demo needs a directory of its own")
    failed = True
    try:
        with ExitStack() as stack:
            settings, backend_args, env = stack.enter_context(_backend(options, directory, console))
            gateway = Gateway(directory / "gateway.db")
            stack.callback(gateway.close)
            client = stack.enter_context(connect(backend=settings.backend, db=settings.db,
                                                 cassandra=settings.cassandra, kafka=settings.kafka))
            fleet = Fleet(directory, backend_args, {**env, GATEWAY_ENV: str(gateway.path)})
            stack.callback(fleet.stop)
            if options.page is not None:
                try:
                    page = PageServer(settings, host=options.page[0], port=options.page[1], refresh_s=2.0,
                                      title="results day").start()
                except (OSError, ValueError) as exc:
                    reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
                    raise DemoFailure(f"cannot serve the status page on {options.page[0]}:{options.page[1]}: "
                                      f"{reason}") from None
                stack.callback(page.close)
                console.print(f"status page at {page.url} (open it to watch; it closes with the demo)",
                              highlight=False)
            summary = _story(options, settings, client, fleet, gateway, console)
            failed = not summary["ok"]
            return summary
    finally:
        empty = not any(directory.iterdir())
        if (options.keep or failed) and not empty:
            console.print(f"logs, stats and databases kept in {directory}", highlight=False)
        elif options.directory is None:
            shutil.rmtree(directory, ignore_errors=True)


@contextmanager
def _backend(options: DemoOptions, directory: Path,
             console: Console) -> Iterator[tuple[backends.BackendSettings, list[str], dict[str, str]]]:
    """The settings of the demo's own client, the backend arguments and environment of
    its processes; for `local`, a deployment of its own, removed afterwards."""
    if options.backend == "embedded":
        settings = backend_settings(backend="embedded", db=directory / "tasks.db")
        yield settings, ["--backend", "embedded", "--db", str(settings.db)], {
            "SCHEDULER_TOPIC_PREFIX": settings.kafka.topic_prefix,
            "SCHEDULER_SHARDS_TOTAL": str(settings.cassandra.shard_count)}
        return
    deployment = LocalDeployment.fresh()
    console.print(f"creating keyspace {deployment.cassandra.keyspace}, topics {deployment.kafka.topic_prefix}.* "
                  f"and ZooKeeper root {deployment.zookeeper.root}", highlight=False)

    def remove() -> None:
        if not options.keep:
            for warning in deployment.remove():
                console.print(f"warning: {warning}", highlight=False)

    try:
        deployment.create()
    except StoreUnavailable:
        raise  # Cassandra is out of reach: nothing was made, and removing would only wait on it
    except BaseException:
        remove()
        raise
    try:
        settings = backends.BackendSettings("cassandra", directory / "unused.db", deployment.cassandra,
                                          deployment.kafka, deployment.zookeeper)
        yield settings, ["--backend", "cassandra"], deployment.env()
    finally:
        remove()


def _story(options: DemoOptions, settings: backends.BackendSettings, client: Client, fleet: Fleet,
           gateway: Gateway, console: Console) -> dict[str, Any]:
    story = options.story
    store = client.store
    stage = Stage(began_ms=now_ms())
    if story.sms_rate is not None:
        with backends.open_limits(settings, store) as limits:
            limits.set_global_rate(story.sms_rate)  # read by the dispatchers as they start
    with Board(console) as board:
        for n in (1, 2):
            fleet.dispatcher(f"dispatcher-{n}", LEASE_TIMEOUT_S)
        split = _wait_for_shards(fleet, fleet.of_kind("dispatcher"), store.shard_count)
        stage.note(f"dispatcher-1 and dispatcher-2 share the {store.shard_count} shards ({split})")
        for n in range(1, options.workers + 1):
            fleet.worker(f"worker-{n}", APP, options.concurrency, SESSION_TIMEOUT_S)
        _wait(lambda: all(w.stats() for w in fleet.of_kind("worker")), fleet, "the workers to start")
        stage.note(f"{options.workers} workers joined, {options.concurrency} handler threads each")

        results_at_ms = (now_ms() + int(options.lead_s * 1000)) // 1000 * 1000 + 1000
        reminders_at_ms = results_at_ms + int(story.reminder_delay_s * 1000)
        reminders = _submit(client, story, results_at_ms)
        planned = _board_steps(client, story) + reminders
        ids = [task.task_id for task in planned]
        stage.note(f"state-board submitted its results day as a workflow due at "
                   f"t+{(results_at_ms - stage.began_ms) / 1000:.0f}s: render {story.board_tasks} batches, send "
                   f"their {story.results:,} SMS, report; city-college booked {story.reminders} "
                   f"reminders for t+{(reminders_at_ms - stage.began_ms) / 1000:.0f}s")
        kill_dispatcher_ms = results_at_ms + int(story.reminder_delay_s * 500)
        drained_ms = results_at_ms + int(story.results / story.sms_rate * 1000) if story.sms_rate else results_at_ms
        deadline_ms = max(reminders_at_ms, drained_ms) + int(FINISH_GRACE_S * 1000)
        rows: dict[TaskId, StoredTask] = {}
        while now_ms() < deadline_ms:
            dead = fleet.died()
            if dead is not None:
                raise DemoFailure(f"{dead.name} exited with status {dead.process.returncode}:\n{dead.log_tail()}")
            planned = _board_steps(client, story) + reminders  # the workflow's steps, as it creates them
            ids = [task.task_id for task in planned]
            batch_sizes = {str(task.task_id): len(task.sms_keys) for task in planned if task.type == RESULT_TYPE}
            rows = store.get_many(ids)
            if not stage.worker_killed and now_ms() >= results_at_ms:
                _kill_a_worker_mid_batch(fleet, gateway, batch_sizes, story.board_tasks, stage)
            if stage.dispatcher_killed is None and now_ms() >= kill_dispatcher_ms:
                victim = fleet.of_kind("dispatcher")[0]
                stage.killed_shards = frozenset(victim.shards())
                held = len(stage.killed_shards)
                victim.kill(now_ms())
                stage.dispatcher_killed = victim
                stage.note(f"{victim.name} killed (kill -9) holding {held} shards, the reminders of them loaded")
            if stage.dispatcher_killed is not None and not stage.reowned:
                _note_takeover(fleet, stage.dispatcher_killed, store.shard_count, stage)
            totals = gateway.totals()
            board.show(Frame(
                at_s=(now_ms() - stage.began_ms) / 1000, counts=status_counts(planned, rows, now_ms()),
                sms_sent=totals.sent, sms_expected=story.expected_sms(), absorbed=totals.absorbed,
                processes=[(m.name, _state(m)) for m in fleet.members], events=stage.events))
            if stage.reowned and len(ids) == len(reminders) + story.board_steps and len(rows) == len(ids) \
                    and all(row.status.finished for row in rows.values()):
                stage.note("every task has ended")
                break
            time.sleep(TICK_S)
        else:
            stage.note("the demo stopped waiting: not every task ended in time")
    with backends.open_dead_letters(settings) as (scanner, _):
        from scheduler.worker.dead_letters import waiting

        letters, _replayed, _unreadable = waiting(scanner.scan(settings.kafka.dead_letter_topic))
    codes = fleet.stop()
    stage.note("stopped: " + ", ".join(f"{name} exit {code}" for name, code in codes.items()
                                       if name != (stage.dispatcher_killed.name if stage.dispatcher_killed else "")))
    planned = _board_steps(client, story) + reminders
    rows = store.get_many([task.task_id for task in planned])
    totals = gateway.totals()
    created = len(planned) - len(reminders)
    workflow_problems = [f"{BOARD} workflow {WORKFLOW_ID}: {story.board_steps - created} of its "
                         f"{story.board_steps} steps never created"] if created < story.board_steps else []
    record = client.workflows.store.read(BOARD, WORKFLOW_ID)
    if record is None or record.state is not WorkflowState.SUCCEEDED:
        state = record.state.value if record is not None else "not stored"
        workflow_problems.append(f"{BOARD} workflow {WORKFLOW_ID}: {state}, not succeeded")
    summary = summarise(planned, rows, gateway.sent_keys(), totals.absorbed, gateway.starts(), letters, stage.events,
                        (now_ms() - stage.began_ms) / 1000, BACKEND_NAMES[options.backend], workflow_problems)
    summary["fairness"] = _fairness(story, gateway, reminders_at_ms)
    killed = {m.process.pid for m in fleet.of_kind("worker") if m.killed_at_ms is not None}
    starts = gateway.starts()
    with backends.open_counts(settings, store) as counts:
        status = read_status(store, counts, shards=False)
    summary["status"] = against_status(summary["tenants"], status,
                                       len({start.task for start in starts if start.pid in killed}),
                                       _fired_unwritten(stage, starts, store.shard_count))
    return summary


UNWRITTEN_MS = 10_000
"""How far before its kill a dispatcher's fired counts may still be unwritten: it writes
them every 2 s (`scheduler.visibility.writer`), on a busy machine later."""


def _fired_unwritten(stage: Stage, starts: list[Start], shard_count: int) -> int:
    """The tasks the killed dispatcher may have fired without writing their `fired` count:
    of the shards it held, started (so fired before that) no earlier than `UNWRITTEN_MS`
    before the kill. Each may show `waiting` beside its `done`."""
    killed = stage.dispatcher_killed
    if killed is None or killed.killed_at_ms is None:
        return 0
    since = killed.killed_at_ms - UNWRITTEN_MS
    return len({start.task for start in starts if start.started_ms >= since
                and TaskId.parse(start.task).shard(shard_count) in stage.killed_shards})


def _fairness(story: Story, gateway: Gateway, reminders_at_ms: int) -> dict[str, Any]:
    """How the board's SMS drained, and how many were still to go when the reminders fell due."""
    sent = gateway.sent_times(BOARD)
    span_s = (sent[-1] - sent[0]) / 1000 if len(sent) > 1 else 0.0
    return {
        "sms_rate_limit": story.sms_rate,
        "board_sms_per_s": round((len(sent) - 1) / span_s) if span_s > 0 else None,
        "board_sms_after_reminders_due": sum(1 for at in sent if at > reminders_at_ms),
        "reminders": len({start.task for start in gateway.starts() if start.tenant == COLLEGE}),
    }


def _submit(client: Client, story: Story, results_at_ms: int) -> list[Planned]:
    """Submit the board's workflow, due at `results_at_ms`, and the college's reminders;
    the reminders as planned tasks (the workflow's are read as it creates them)."""
    try:
        client.workflows.submit(story.workflow(), run_at=from_ms(results_at_ms))
    except SchedulerError as exc:
        raise DemoFailure(f"the board's results-day workflow was not stored: {exc}") from None
    items = story.plan(results_at_ms)
    report = client.submit_many(items, keep_ids=True)
    if not report.complete or report.stored != len(items) or report.ids is None:
        errors = report.rejected or report.failed
        raise DemoFailure(f"stored {report.stored} of {len(items)} tasks"
                          + (f": {errors[0].reason}" if errors else ""))
    planned = []
    for n, (item, task_id) in enumerate(zip(items, report.ids, strict=True)):
        assert task_id is not None and item.run_at is not None and item.tenant is not None
        doomed = n == len(items) - 1
        keys = () if doomed else (f"{task_id}:sms",)
        planned.append(Planned(task_id, item.tenant, item.type, task_id.run_at_ms, keys, doomed))
    return planned


def _board_steps(client: Client, story: Story) -> list[Planned]:
    """The board's workflow steps created so far, each with the SMS it should send: a
    send the messages of its batch (keyed as `ctx.effect_key` keys them), the report
    one to the office."""
    store = client.workflows.store
    record = store.read(BOARD, WORKFLOW_ID)
    if record is None:
        return []
    definition = decode_definition(record.definition)
    planned = []
    for (step, index), task_id in sorted(member_task_ids(BOARD, WORKFLOW_ID, definition,
                                                         store.claims(BOARD, WORKFLOW_ID)).items()):
        spec = definition.by_name[step]
        if spec.type == RESULT_TYPE:
            keys = _send_keys(story, index, task_id)
        elif step == "report":
            keys = (f"{task_id}:sms",)
        else:
            keys = ()
        planned.append(Planned(task_id, BOARD, spec.type, task_id.run_at_ms, keys))
    return planned


@functools.lru_cache(maxsize=8192)
def _send_keys(story: Story, batch_no: int, task_id: TaskId) -> tuple[str, ...]:
    """A send's SMS keys, made once per send (the board is redrawn five times a second)."""
    return tuple(f"{task_id}:sms:{m['to']}" for m in story.batch_messages(batch_no))


def _kill_a_worker_mid_batch(fleet: Fleet, gateway: Gateway, batch_sizes: dict[str, int], batches: int,
                             stage: Stage) -> None:
    """Kill the worker running a batch that is partly sent, if one is; once every one of
    the `batches` sends exists and has gone out, give up and say so."""
    sent = gateway.sent_per_task()
    workers = {m.process.pid: m for m in fleet.of_kind("worker") if m.alive()}
    if len(workers) < 2:
        return
    for start in reversed(gateway.starts()):
        size = batch_sizes.get(start.task)
        if size and 0 < sent.get(start.task, 0) < size and start.pid in workers:
            victim = workers[start.pid]
            victim.kill(now_ms())
            stage.worker_killed = True
            stage.note(f"{victim.name} killed (kill -9) in the middle of a batch ({sent[start.task]} of {size} "
                       "SMS sent); its uncommitted batches go to the other workers")
            return
    if len(batch_sizes) == batches and all(sent.get(task, 0) >= size for task, size in batch_sizes.items()):
        stage.worker_killed = True
        stage.note("every result batch went out before a worker could be caught mid-batch; no worker killed")


def _note_takeover(fleet: Fleet, killed: Member, shard_count: int, stage: Stage) -> None:
    held: set[int] = set()
    for member in fleet.of_kind("dispatcher"):
        if member is not killed:
            held.update(member.shards())
    if len(held) == shard_count:
        assert killed.killed_at_ms is not None
        seconds = (now_ms() - killed.killed_at_ms) / 1000
        stage.reowned = True
        stage.note(f"the other dispatcher holds all {shard_count} shards, {seconds:.1f} s after the kill "
                   f"(lease timeout {LEASE_TIMEOUT_S:.0f} s)", reowned_after_s=round(seconds, 1))


def _wait_for_shards(fleet: Fleet, dispatchers: list[Member], shard_count: int) -> str:
    def shared() -> str | None:
        held = [set(member.shards()) for member in dispatchers]
        union: set[int] = set().union(*held)
        if all(held) and sum(map(len, held)) == len(union) == shard_count:
            return " + ".join(str(len(shards)) for shards in held)
        return None

    return str(_wait(shared, fleet, "the dispatchers to share the shards"))


def _wait(condition: Callable[[], Any], fleet: Fleet, what: str) -> Any:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        dead = fleet.died()
        if dead is not None:
            raise DemoFailure(f"{dead.name} exited with status {dead.process.returncode} while waiting for {what}:"
                              f"\n{dead.log_tail()}")
        value = condition()
        if value:
            return value
        time.sleep(TICK_S)
    raise DemoFailure(f"timed out after {START_TIMEOUT_S:.0f} s waiting for {what}")


def _state(member: Member) -> str:
    if member.killed_at_ms is not None:
        return "killed"
    if not member.alive():
        return f"exited {member.process.returncode}"
    if member.kind == "dispatcher":
        return f"{len(member.shards())} shards"
    return "running"
