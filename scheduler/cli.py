"""The `scheduler` command. Its options become settings here; `wiring` picks the
adapters, and producers come from `scheduler.connect`, as applications get theirs.

Every option also reads a `SCHEDULER_*` environment variable, shown in `--help`.
Exit codes are the named constants below, so scripts can tell a bad flag from a
server that is down.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from enum import IntEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO, TypeVar, cast

import click

from scheduler import __version__, connecting, wiring
from scheduler.errors import (
    ConfigError,
    CoordinatorUnavailable,
    InvalidTask,
    QueueUnavailable,
    SchedulerError,
    SchemaConflict,
    StoreUnavailable,
)
from scheduler.model import DEFAULT_MAX_ATTEMPTS, MAX_COST, Priority, TaskId, decode_payload
from scheduler.ports import CancelOutcome, Handoff, StoredTask, TaskStore
from scheduler.settings import (
    CASSANDRA_ENV,
    CONSISTENCY_LEVELS,
    CassandraSettings,
    KafkaSettings,
    ZooKeeperSettings,
    split_hosts,
)
from scheduler.wiring import BackendSettings

if TYPE_CHECKING:
    from scheduler.producer import Client


class Exit(IntEnum):
    OK = 0
    FAILURE = 1
    USAGE = 2  # click's own code for a bad flag
    UNAVAILABLE = 3  # a server could not be reached
    CONFLICT = 4  # the store holds something that contradicts the request


F = TypeVar("F", bound=Callable[..., Any])


def cassandra_options(function: F) -> F:
    """The options that say where the Cassandra cluster and keyspace are; their defaults
    and variables are those of `CassandraSettings`."""
    defaults = CassandraSettings()

    def option(flag: str, field: str, help: str, **kwargs: Any) -> Callable[[F], F]:
        kwargs.setdefault("default", getattr(defaults, field))
        return click.option(flag, field, envvar=CASSANDRA_ENV[field], show_envvar=True, show_default=True,
                            help=help, **kwargs)

    options = [
        option("--hosts", "hosts", "Cassandra contact points, comma-separated.", default=",".join(defaults.hosts)),
        option("--port", "port", "Cassandra native-protocol port.", type=int),
        option("--keyspace", "keyspace", "Keyspace holding the scheduler's tables."),
        option("--replication", "replication",
               "CQL replication map used when the keyspace is created, e.g. "
               "\"{'class': 'NetworkTopologyStrategy', 'dc1': 3}\" in production."),
        option("--consistency", "consistency", "Consistency of reads and writes.",
               type=click.Choice(CONSISTENCY_LEVELS)),
        option("--shard-count", "shard_count", "Shards per keyspace; fixed when the keyspace is created.", type=int),
    ]
    for decorate in reversed(options):
        function = decorate(function)
    return function


def settings_from(hosts: str, port: int, keyspace: str, replication: str, consistency: str,
                  shard_count: int) -> CassandraSettings:
    return CassandraSettings.from_env(
        hosts=split_hosts(hosts), port=port, keyspace=keyspace, replication=replication,
        consistency=consistency, shard_count=shard_count,
    )


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="scheduler")
def cli() -> None:
    """A distributed task scheduler: tasks stored in Cassandra, leased shards in ZooKeeper,
    due tasks published to Kafka. `scheduler demo` runs on one machine with no servers."""


@cli.group()
def schema() -> None:
    """Show or apply the Cassandra schema (schema.cql)."""


@schema.command("show")
@cassandra_options
def schema_show(**options: Any) -> None:
    """Print the CQL that `schema apply` runs for the given keyspace and replication."""
    from scheduler.adapters.cassandra.schema import render

    settings = settings_from(**options)
    click.echo(";\n\n".join(render(settings.keyspace, settings.replication)) + ";")


@schema.command("apply")
@cassandra_options
def schema_apply(**options: Any) -> None:
    """Create the keyspace and tables if they are missing (safe to run again).

    The shard count is recorded in the keyspace the first time; asking for another
    count later is refused, since every task's partition depends on it.
    """
    from scheduler.adapters.cassandra import schema as cassandra_schema
    from scheduler.adapters.cassandra.connection import connect

    settings = settings_from(**options)
    with connect(settings) as connection:
        applied = cassandra_schema.apply(connection, settings)
    recorded = "recorded now" if applied.shard_count_recorded_now else "as recorded before"
    click.echo(
        f"schema applied to keyspace {applied.keyspace}: {applied.statements} statements, "
        f"{applied.shard_count} shards ({recorded})"
    )


def queue_options(function: F) -> F:
    """Where the Kafka cluster is, and the prefix of the scheduler's topics."""
    defaults = KafkaSettings()
    function = click.option(
        "--topic-prefix", "topic_prefix", default=defaults.topic_prefix, envvar="SCHEDULER_TOPIC_PREFIX",
        show_envvar=True, show_default=True, help="Kafka topic names start with this and a dot.",
    )(function)
    return click.option(
        "--kafka", "kafka_bootstrap", default=defaults.bootstrap, envvar="SCHEDULER_KAFKA_BOOTSTRAP",
        show_envvar=True, show_default=True, help="Kafka bootstrap servers (cassandra backend).",
    )(function)


def store_options(function: F) -> F:
    """`--backend`, `--db`, the Cassandra and the Kafka options: which task store a
    command uses, and where tasks due soon are handed to the dispatchers."""
    function = queue_options(cassandra_options(function))
    function = click.option(
        "--db", "db", type=click.Path(dir_okay=False, path_type=Path), default=connecting.default_db_path,
        envvar=connecting.DB_ENV, show_envvar=True, show_default="$XDG_DATA_HOME/scheduler/tasks.db",
        help="SQLite file of the embedded backend (created when missing); its queue and coordinator "
             "files sit beside it.",
    )(function)
    return click.option(
        "--backend", "backend", type=click.Choice(connecting.BACKENDS), default="embedded",
        envvar=connecting.BACKEND_ENV,
        show_envvar=True, show_default=True,
        help="embedded: SQLite files on this machine, no servers. cassandra: the distributed backend "
             "(Cassandra, Kafka, ZooKeeper).",
    )(function)


def backend_settings(backend: str, db: Path, *, kafka_bootstrap: str, topic_prefix: str,
                     zookeeper: ZooKeeperSettings | None = None, **cassandra: Any) -> BackendSettings:
    """The backend a command's options name (each already read from its flag or variable),
    resolved as `scheduler.connect` resolves its arguments."""
    return connecting.backend_settings(
        backend=backend, db=db, cassandra=settings_from(**cassandra),
        kafka=KafkaSettings.from_env(bootstrap=kafka_bootstrap, topic_prefix=topic_prefix), zookeeper=zookeeper,
    )


@contextmanager
def open_store(backend: str, db: Path, **options: Any) -> Iterator[TaskStore]:
    with wiring.open_store(backend_settings(backend, db, **options)) as store:
        yield store


def open_client(backend: str, db: Path, tenant: str | None = None, default_max_attempts: int = DEFAULT_MAX_ATTEMPTS,
                **options: Any) -> Client:
    """A producer client whose hand-off reaches this backend's dispatchers: the one
    `scheduler.connect` gives applications. Use it in a `with` block."""
    settings = backend_settings(backend, db, **options)
    return connecting.connect(tenant=tenant, backend=settings.backend, db=settings.db, cassandra=settings.cassandra,
                              kafka=settings.kafka, default_max_attempts=default_max_attempts)


def unopened_client() -> Client:
    """A client on no store, for the checks `Client.task` makes (it builds a task and
    reads no store), so a command with bad input fails before any store is opened: on
    the embedded backend, opening one creates its files. It checks as the command's own
    client will, which has a hand-off (so a keyed task due long ago is accepted)."""
    from scheduler.producer import Client

    return Client(cast(TaskStore, None), handoff=cast(Handoff, _NOT_USED))


_NOT_USED = object()
"""Stands for the hand-off of `unopened_client`: `Client.task` only asks whether there is one."""


_DELAY = re.compile(r"(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+(?:\.\d+)?)s)?")


def parse_delay(text: str) -> timedelta:
    """`90`, `90s`, `15m`, `1h30m`, `2d`: a delay from now."""
    stripped = text.strip()
    problem = f"{text!r} is not a delay: use seconds (90) or units such as 90s, 15m, 1h30m, 2d"
    try:
        return timedelta(seconds=float(stripped))
    except (ValueError, OverflowError):
        pass
    match = _DELAY.fullmatch(stripped)
    if not stripped or match is None:
        raise click.BadParameter(problem)
    days, hours, minutes, seconds = (float(part) if part else 0.0 for part in match.groups())
    try:
        return timedelta(days=days, hours=hours, minutes=minutes, seconds=seconds)
    except OverflowError:
        raise click.BadParameter(f"{text!r} is too long a delay") from None


def parse_run_at(text: str) -> datetime:
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise click.BadParameter(f"{text!r} is not an ISO 8601 time such as 2026-12-02T10:00:00+05:30") from None
    if moment.tzinfo is None:
        raise click.BadParameter(f"{text!r} has no time zone: add one, e.g. {text}Z or {text}+05:30")
    return moment


def parse_payload(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise click.BadParameter(f"payload is not JSON ({exc.msg} at column {exc.colno})") from None


def tenant_option(help: str, required: bool = True) -> Callable[[F], F]:
    return click.option("--tenant", "tenant", envvar="SCHEDULER_TENANT", show_envvar=True, required=required,
                        help=help)


@cli.command()
@click.argument("task_type", metavar="TYPE", required=False)
@click.option("--payload", "payload", default="null", show_default=True, help="The task's payload as JSON.")
@tenant_option("Tenant that owns the task (with --file: of the lines that name none).", required=False)
@click.option("--run-at", "run_at", help="When it is due: ISO 8601 with a zone, e.g. 2026-12-02T10:00:00+05:30. "
              "A time in the past means due now.")
@click.option("--delay", "delay", help="Due this long from now: 90, 90s, 15m, 1h30m, 2d. Default: due now.")
@click.option("--priority", "priority", type=click.Choice([p.value for p in Priority]), default="normal",
              show_default=True)
@click.option("--key", "key", help="Idempotency key: the same tenant, key and --run-at always name the same "
              "task, so a repeated submit writes no second one. Needs --run-at.")
@click.option("--max-attempts", "max_attempts", type=int, default=DEFAULT_MAX_ATTEMPTS, show_default=True)
@click.option("--cost", "cost", type=click.IntRange(1, MAX_COST), default=1, show_default=True,
              help="Units of the tenant's rate limit the task uses, e.g. 500 for a task that sends 500 SMS.")
@click.option("--file", "file", type=click.File("r"), help="Submit every task of a JSON-lines file (`-` for "
              "stdin) instead: one object per line with the fields type, payload, tenant, run_at, delay "
              "(seconds), priority, idempotency_key, max_attempts, cost; --tenant and --cost are the defaults "
              "of lines without them.")
@store_options
def submit(task_type: str | None, payload: str, tenant: str | None, run_at: str | None, delay: str | None, priority: str,
           key: str | None, max_attempts: int, cost: int, file: TextIO | None, backend: str, db: Path,
           **cassandra: Any) -> None:
    """Store a task and print its id once the store acknowledged the write.

    With --file, submits a whole file, shows progress, and reports every line that was
    not stored with its reason; the exit code is 1 if any line was not stored.
    """
    # Everything is checked before a store is opened (`connect` checks the settings and
    # the default max attempts first), so a failed submit leaves no file behind.
    if file is not None:
        if task_type is not None:
            raise click.UsageError("give TYPE or --file, not both")
        with open_client(backend, db, tenant=tenant, default_max_attempts=max_attempts, **cassandra) as client:
            submit_file(client, file, cost)
        return
    if task_type is None:
        raise click.UsageError("missing TYPE (the task's handler name), or --file")
    if not tenant:
        raise click.UsageError("missing --tenant (or SCHEDULER_TENANT): the tenant that owns the task")
    task: dict[str, Any] = {
        "type": task_type, "payload": parse_payload(payload), "tenant": tenant,
        "run_at": parse_run_at(run_at) if run_at else None, "delay": parse_delay(delay) if delay else None,
        "priority": priority, "idempotency_key": key, "max_attempts": max_attempts, "cost": cost,
    }
    unopened_client().task(**task)  # InvalidTask, as submit would raise it
    with open_client(backend, db, **cassandra) as client:
        task_id = client.submit(**task)
    click.echo(str(task_id))


def submit_file(client: Any, file: TextIO, cost: int = 1) -> None:
    """Submit the lines of `file`; `cost` is the cost of the lines that give none."""
    from scheduler.producer import SubmitReport

    line_of: list[int] = []  # the file line of each item: blank lines are not items

    def items() -> Iterator[Any]:
        for number, line in enumerate(file, start=1):
            if not line.strip():
                continue
            line_of.append(number)
            try:
                item = json.loads(line)
            except json.JSONDecodeError as exc:
                item = InvalidTask(f"not JSON: {exc.msg} at column {exc.colno}")
            if isinstance(item, dict) and isinstance(item.get("run_at"), str):
                try:
                    item["run_at"] = datetime.fromisoformat(item["run_at"])
                except ValueError:
                    item = InvalidTask(f"run_at {item['run_at']!r} is not an ISO 8601 time")
            if isinstance(item, dict):
                item.setdefault("cost", cost)
            yield item

    with click.progressbar(length=0, label="submitting", show_pos=True, file=sys.stderr) as bar:
        def progress(report: SubmitReport) -> None:
            bar.length = report.consumed
            bar.update(report.stored + len(report.failed) + len(report.rejected) - bar.pos)

        report = client.submit_many(items(), progress=progress, keep_ids=False)
    for error in report.rejected:
        click.echo(f"line {line_of[error.index]}: not stored, invalid: {error.reason}", err=True)
    for error in report.failed:
        click.echo(f"line {line_of[error.index]}: task {error.task_id} not stored for certain: {error.reason}",
                   err=True)
    unread = " (stopped: lines after the last one reported were not read)" if report.stopped_early else ""
    click.echo(f"{report.stored} stored, {len(report.rejected)} invalid, {len(report.failed)} not stored for certain"
               f"{unread}")
    if report.failed:
        click.echo("Lines with an idempotency_key can be submitted again safely; a line without one would get a "
                   "new id, so check with `scheduler get` first.", err=True)
    if not report.complete:
        raise click.exceptions.Exit(Exit.FAILURE)


def describe(stored: StoredTask) -> dict[str, Any]:
    task = stored.task
    return {
        "id": str(task.id),
        "tenant": task.tenant,
        "type": task.type,
        "status": stored.status.value,
        "run_at": task.run_at.isoformat().replace("+00:00", "Z"),
        "priority": task.priority.value,
        "attempt": task.attempt,
        "max_attempts": task.max_attempts,
        "cost": task.cost,
        "idempotency_key": task.idempotency_key,
        "payload": decode_payload(task.payload),
    }


@cli.command()
@click.argument("task_id")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@tenant_option("Only show the task if it belongs to this tenant (as a tenant's own tools should).",
               required=False)
@store_options
def get(task_id: str, as_json: bool, tenant: str | None, backend: str, db: Path, **cassandra: Any) -> None:
    """Show a task and its status (exit 1 if there is none with this id, or it belongs
    to another tenant than --tenant)."""
    from scheduler.producer import Client

    parsed = TaskId.parse(task_id)
    with open_store(backend, db, **cassandra) as store:
        stored = Client(store).get(parsed, tenant=tenant or None)
    if stored is None:
        click.echo(f"no task with id {parsed}", err=True)
        raise click.exceptions.Exit(Exit.FAILURE)
    fields = describe(stored)
    if as_json:
        click.echo(json.dumps(fields, default=repr))
        return
    for name, value in fields.items():
        click.echo(f"{name + ':':17}{json.dumps(value, default=repr) if name == 'payload' else value}")


@cli.command()
@click.argument("task_id")
@tenant_option("Tenant that owns the task; another tenant's task reads as not found.")
@store_options
def cancel(task_id: str, tenant: str, backend: str, db: Path, **cassandra: Any) -> None:
    """Cancel a task that has not run yet.

    Exit 0 when it is (or already was) cancelled, 1 when no task of this tenant has
    this id, 4 when it already finished. Once it answers "cancelled", no attempt of the
    task starts; for a task due within minutes that answer takes about 2 s.
    """
    parsed = TaskId.parse(task_id)  # before anything is opened: a bad id creates no file
    with open_client(backend, db, **cassandra) as client:
        outcome = client.cancel(parsed, tenant)
    click.echo(f"{task_id}: {outcome.value}")
    if outcome is CancelOutcome.NOT_FOUND:
        raise click.exceptions.Exit(Exit.FAILURE)
    if outcome is CancelOutcome.FINISHED:
        raise click.exceptions.Exit(Exit.CONFLICT)


@cli.command()
@click.option("--shards", "shards", default="auto", envvar="SCHEDULER_DISPATCHER_SHARDS", show_envvar=True,
              show_default=True, help="auto: share the shards with the other live dispatchers; or pin ranges "
              "such as 0-15 or 0-7,32-39 (then every dispatcher of the deployment should pin its "
              "range: auto members count pinned ones in their split).")
@click.option("--member", "member", envvar="SCHEDULER_MEMBER", show_envvar=True,
              help="This dispatcher's name among the members; unique. Default: host name and process id.")
@click.option("--zookeeper", "zookeeper_hosts", default=ZooKeeperSettings().hosts, envvar="SCHEDULER_ZOOKEEPER_HOSTS",
              show_envvar=True, show_default=True, help="ZooKeeper connection string (cassandra backend).")
@click.option("--zookeeper-root", "zookeeper_root", default=ZooKeeperSettings().root,
              envvar="SCHEDULER_ZOOKEEPER_ROOT", show_envvar=True, show_default=True,
              help="ZooKeeper path under which members and leases live.")
@click.option("--lease-timeout", "lease_timeout_s", type=float, default=ZooKeeperSettings().session_timeout_s,
              envvar="SCHEDULER_LEASE_TIMEOUT_S", show_envvar=True, show_default=True,
              help="Seconds after which the shards of a dispatcher that died (or paused) go to others.")
@click.option("--tick-ms", "tick_ms", type=click.IntRange(10, 1000), default=100, show_default=True,
              envvar="SCHEDULER_TICK_MS", show_envvar=True,
              help="Timing-wheel tick: due tasks fire at most this late. Must divide 1000.")
@click.option("--long-types", "long_types", default="", envvar="SCHEDULER_LONG_TYPES", show_envvar=True,
              help="Comma-separated task types published to the long topic (the long worker pool).")
@click.option("--stats-file", "stats_file", type=click.Path(dir_okay=False, path_type=Path),
              envvar="SCHEDULER_STATS_FILE", show_envvar=True,
              help="Rewrite this JSON file every second with the shards held and the counters.")
@click.option("--limits-interval", "limits_interval_s", type=click.FloatRange(0.1, 300), default=5.0,
              show_default=True, help="Seconds between reads of the tenants' limits (`scheduler limits`).")
@click.option("--hold-timeout", "hold_timeout_s", type=click.FloatRange(1, 86_400), default=300.0, show_default=True,
              help="Seconds a released task of a capped tenant holds its place when no completion comes back "
                   "(its worker died and nothing ran it again). Set it above the longest task.")
@click.option("--sweep-interval", "sweep_interval_s", type=click.FloatRange(1, 600), default=20.0, show_default=True,
              envvar="SCHEDULER_SWEEP_INTERVAL_S", show_envvar=True,
              help="Seconds between counts of the last 90 s behind each shard's cursor, which find rows written "
                   "there late with no hand-off: such a row fires about this long after it was written. Every "
                   "sixth count covers the whole --sweep-horizon.")
@click.option("--sweep-horizon", "sweep_horizon_s", type=click.FloatRange(360, 86_400), default=600.0,
              show_default=True, envvar="SCHEDULER_SWEEP_HORIZON_S", show_envvar=True,
              help="How far back (seconds) the full sweep looks. A row written without a hand-off more than this "
                   "after its run_at is not found; the SDK hands such tasks off (scheduler.connect). Costs 24 bytes "
                   "a task fired within it.")
@click.option("--log-level", "log_level", type=click.Choice(["debug", "info", "warning", "error"]), default="info",
              envvar="SCHEDULER_LOG_LEVEL", show_envvar=True, show_default=True)
@store_options
def dispatcher(shards: str, member: str | None, zookeeper_hosts: str, zookeeper_root: str, lease_timeout_s: float,
               tick_ms: int, long_types: str, stats_file: Path | None, limits_interval_s: float,
               hold_timeout_s: float, sweep_interval_s: float, sweep_horizon_s: float, log_level: str, backend: str,
               db: Path, **options: Any) -> None:
    """Hold shard leases and fire due tasks to the ready topics until stopped.

    With tenant limits set (`scheduler limits`), due tasks are released fairly between
    tenants: weighted round robin, caps on running tasks, and rates, each dispatcher
    enforcing its share (shards held / shard count). Without any, they fire at once.

    Runs until SIGTERM or Ctrl-C, then gives its shards back so the other dispatchers
    take them at once. Exits 3 when a server cannot be reached at start; while
    running, it rides out servers that go away, firing late rather than never.
    """
    import signal
    import socket

    from scheduler.dispatcher import memory
    from scheduler.dispatcher.balance import parse_shards
    from scheduler.dispatcher.runtime import Dispatcher, DispatcherConfig, wall_clock_ms
    from scheduler.producer import Client
    from scheduler.recurring.runner import ScheduleRunner

    memory.limit_arenas()

    logging.basicConfig(level=log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s.%(msecs)03d %(levelname)s %(name)s: %(message)s",
                        datefmt="%Y-%m-%dT%H:%M:%S")
    if 1000 % tick_ms:
        raise click.BadParameter(f"--tick-ms {tick_ms} does not divide 1000")
    zookeeper = ZooKeeperSettings.from_env(hosts=zookeeper_hosts, root=zookeeper_root,
                                           session_timeout_s=lease_timeout_s)
    settings = backend_settings(backend, db, zookeeper=zookeeper, **options)
    name = member or f"{socket.gethostname()}-{os.getpid()}"
    with wiring.open_dispatcher_parts(settings, name) as parts:
        config = DispatcherConfig(
            member=name, shards=parse_shards(shards, parts.store.shard_count), tick_ms=tick_ms,
            lease_timeout_s=lease_timeout_s,
            long_types=frozenset(t.strip() for t in long_types.split(",") if t.strip()), stats_path=stats_file,
            limits_interval_s=limits_interval_s, hold_timeout_s=hold_timeout_s,
            sweep_interval_ms=int(sweep_interval_s * 1000), sweep_horizon_ms=int(sweep_horizon_s * 1000),
            dead_letter_topic=settings.kafka.dead_letter_topic,
        )
        schedule_runner = ScheduleRunner(parts.schedules, Client(parts.store, handoff=parts.handoff),
                                         clock=wall_clock_ms)
        runner = Dispatcher(config, store=parts.store, coordinator=parts.coordinator, publisher=parts.publisher,
                            handoff_reader=parts.handoff_reader, topics=parts.topics,
                            schedule_runner=schedule_runner, limits_store=parts.limits)
        runner.load_limits()
        runner.start_session()
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: runner.stop())
        logging.getLogger("scheduler.dispatcher").info(
            "dispatcher %s started: shards %s, backend %s", name, shards, backend)
        runner.run()
    if runner.failed is not None:
        click.echo(f"error: dispatcher {name} stopped: {runner.failed}", err=True)
        raise click.exceptions.Exit(Exit.FAILURE)


@cli.command()
@click.option("--results", "results", type=click.IntRange(1, 1_000_000), default=20_000, show_default=True,
              help="Result SMS the state board sends.")
@click.option("--batch", "batch", type=click.IntRange(1, 1000), default=250, show_default=True,
              help="SMS per board task (its cost). With two dispatchers each holds half of --sms-rate: a task "
                   "larger than that holds the rate on average, not in every second.")
@click.option("--reminders", "reminders", type=click.IntRange(2, 100_000), default=50, show_default=True,
              help="Exam reminders the college books (one of them to an unreachable number).")
@click.option("--reminder-delay", "reminder_delay", default="30s", show_default=True,
              help="How long after the results the reminders are due (at least 10s): 60, 45s, 2m.")
@click.option("--sms-rate", "sms_rate", type=click.FloatRange(0, 1_000_000), default=500, show_default=True,
              help="The provider's limit in SMS a second, shared by every tenant (`scheduler limits set --global "
                   "--rate`); each board task costs its SMS. 0: no limit.")
@click.option("--lead", "lead", default="10s", show_default=True,
              help="How long after the submit the results are due (at least 3s).")
@click.option("--workers", "workers", type=click.IntRange(2, 16), default=2, show_default=True,
              help="Worker processes (one is killed mid-batch).")
@click.option("--concurrency", "concurrency", type=click.IntRange(1, 64), default=4, show_default=True,
              help="Handler threads per worker.")
@click.option("--backend", "backend", type=click.Choice(["embedded", "local"]), default="embedded",
              show_default=True, help="embedded: SQLite files, no servers. local: the real Cassandra, Kafka and "
              "ZooKeeper (deploy/local, or the servers SCHEDULER_* variables name), in a keyspace, topics and "
              "ZooKeeper root of the demo's own, removed afterwards.")
@click.option("--dir", "directory", type=click.Path(file_okay=False, path_type=Path),
              help="Keep the databases, logs and stats files here (an empty or new directory). Default: a "
              "temporary directory, removed afterwards unless something went wrong.")
@click.option("--keep", "keep", is_flag=True, help="Keep the directory (and with --backend local the keyspace, "
              "topics and ZooKeeper root).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Also write the summary as a JSON document to this file.")
def demo(results: int, batch: int, reminders: int, reminder_delay: str, sms_rate: float, lead: str, workers: int,
         concurrency: int, backend: str, directory: Path | None, keep: bool, json_path: Path | None) -> None:
    """Play results day on this machine, end to end, in about a minute.

    \b
    A state board's result SMS go out as tasks of --batch, due --lead from now; a college
    books --reminders exam reminders for --reminder-delay later, one of them to a number
    the provider cannot reach (retried with backoff, then dead-lettered). The provider
    takes --sms-rate SMS a second: the board's SMS drain at that limit, and the
    reminders, due while they drain, go out on their time all the same. Two dispatchers
    share the shards and two workers send through a fake SMS provider that refuses to
    send a key twice. A worker is killed (kill -9) in the middle of a batch, and later
    dispatcher-1 with the reminders loaded; the others take over. A live board shows
    every tenant's tasks by status; the summary reconciles every task and SMS: delivered,
    lost, repeats the provider absorbed, and how late handlers started.

    Exit status 0 when everything was delivered as it should be, 1 otherwise.
    """
    from rich.console import Console

    from scheduler.demo.outcome import render
    from scheduler.demo.play import DemoOptions, play
    from scheduler.demo.story import Story

    delay_s, lead_s = parse_delay(reminder_delay).total_seconds(), parse_delay(lead).total_seconds()
    if delay_s < 10:
        raise click.BadParameter(f"{reminder_delay!r} is under 10s", param_hint="--reminder-delay")
    if lead_s < 3:
        raise click.BadParameter(f"{lead!r} is under 3s", param_hint="--lead")
    if 0 < sms_rate < 1:
        raise click.BadParameter(f"{sms_rate} is under 1 SMS a second (0 for no limit)", param_hint="--sms-rate")
    options = DemoOptions(Story(results=results, batch=batch, reminders=reminders, reminder_delay_s=delay_s,
                                sms_rate=sms_rate or None),
                          backend=backend, directory=directory, lead_s=lead_s, workers=workers,
                          concurrency=concurrency, keep=keep)
    console = Console(highlight=False, soft_wrap=True)
    summary = play(options, console)
    for line in render(summary):
        console.print(line)
    if json_path is not None:
        json_path.write_text(json.dumps(summary, indent=2) + "\n")
    if not summary["ok"]:
        raise click.exceptions.Exit(Exit.FAILURE)


def exit_code_for(error: SchedulerError) -> Exit:
    if isinstance(error, SchemaConflict):
        return Exit.CONFLICT
    if isinstance(error, StoreUnavailable | QueueUnavailable | CoordinatorUnavailable):
        return Exit.UNAVAILABLE
    if isinstance(error, ConfigError | InvalidTask):
        return Exit.USAGE
    return Exit.FAILURE


def main(argv: list[str] | None = None) -> None:
    """Console entry point: runs the CLI and turns scheduler errors into exit codes."""
    try:
        code = cli.main(args=argv, prog_name="scheduler", standalone_mode=False)
        if isinstance(code, int):  # a command's click.exceptions.Exit, returned in this mode
            sys.exit(code)
    except click.exceptions.Exit as done:
        sys.exit(done.exit_code)
    except click.ClickException as error:
        error.show()
        sys.exit(error.exit_code)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(Exit.FAILURE)
    except SchedulerError as error:
        click.echo(f"error: {error}", err=True)
        sys.exit(exit_code_for(error))


from scheduler import limits_commands, schedule_commands, worker_commands  # noqa: E402, F401  (register their groups)
