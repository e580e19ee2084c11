"""`scheduler worker` and `scheduler dlq`: the worker-side commands of the CLI."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import click

from scheduler import wiring
from scheduler.cli import Exit, backend_settings, cli, store_options
from scheduler.errors import SchedulerError
from scheduler.model import decode_message, decode_payload, from_ms
from scheduler.wiring import POOL_TOPICS
from scheduler.worker.runtime import CHECKS


@cli.command()
@click.option("--app", "app_spec", required=True, envvar="SCHEDULER_APP", show_envvar=True,
              help="The application's handlers: module:attribute naming a scheduler.worker.App "
                   "(the current directory is importable).")
@click.option("--pool", "pool", type=click.Choice(list(POOL_TOPICS)), default="default", show_default=True,
              envvar="SCHEDULER_POOL", show_envvar=True,
              help="default: the high, normal and low topics, served 7:2:1; long: the long topic.")
@click.option("--concurrency", "concurrency", type=click.IntRange(1, 1024), default=8, show_default=True,
              envvar="SCHEDULER_CONCURRENCY", show_envvar=True, help="Handlers running at once in this process.")
@click.option("--member", "member", envvar="SCHEDULER_MEMBER", show_envvar=True,
              help="This worker's name in its consumer group (default: host-pid).")
@click.option("--drain-timeout", "drain_timeout_s", type=float, default=30.0, show_default=True,
              help="On SIGTERM: seconds in-flight handlers get to finish before the worker leaves.")
@click.option("--session-timeout", "session_timeout_s", type=float, default=10.0, show_default=True,
              help="Seconds after which a silent worker's partitions go to the others.")
@click.option("--check", "check", type=click.Choice(CHECKS), default="suspect", show_default=True,
              envvar="SCHEDULER_WORKER_CHECK", show_envvar=True,
              help="Which messages are checked against their task's stored status before running: "
                   "suspect (those that can be repeats: retries, backlog, just after a rebalance), always, "
                   "never. Cancels are honoured whatever this says (a cancel's shard mark makes its messages "
                   "checked).")
@click.option("--stats-file", "stats_file", type=click.Path(dir_okay=False, path_type=Path),
              help="Keep a JSON document of this worker's counters here (rewritten every second).")
@click.option("--log-level", "log_level", default="info", show_default=True,
              type=click.Choice(["debug", "info", "warning", "error"]))
@store_options
def worker(app_spec: str, pool: str, concurrency: int, member: str | None, drain_timeout_s: float,
           session_timeout_s: float, check: str, stats_file: Path | None, log_level: str, backend: str, db: Path,
           **options: Any) -> None:
    """Run the handlers of fired tasks until stopped.

    Consumes the pool's ready topics in the pool's consumer group, runs each task's
    handler, retries failures with backoff through the store, and parks what cannot
    succeed on the dead-letter topic (see `scheduler dlq`). Offsets are committed only
    after a task's outcome is stored, so a worker killed at any moment loses nothing.
    SIGTERM finishes the handlers in flight, commits and leaves the group.
    """
    from scheduler.dispatcher.runtime import write_json
    from scheduler.worker import load_app
    from scheduler.worker.runtime import Worker, WorkerConfig

    logging.basicConfig(level=log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s.%(msecs)03d %(levelname)s %(name)s: %(message)s",
                        datefmt="%Y-%m-%dT%H:%M:%S")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    app = load_app(app_spec)
    if not app.handlers():
        raise click.UsageError(f"{app_spec} has no handlers registered")
    name = member or f"{socket.gethostname()}-{os.getpid()}"
    settings = backend_settings(backend, db, **options)
    with wiring.open_worker_parts(settings, name, pool, session_timeout_s) as parts:
        config = WorkerConfig(
            member=name, pool=pool, topics=parts.topics, dead_letter_topic=parts.dead_letter_topic,
            concurrency=concurrency, drain_timeout_s=drain_timeout_s, shard_count=parts.store.shard_count,
            check=check,
        )
        runner = Worker(app, config, consumer_factory=parts.consumer_factory, store=parts.store,
                        publisher=parts.publisher, handoff=parts.handoff, ledger=parts.ledger)
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: runner.stop())
        stats_writer: threading.Thread | None = None
        if stats_file is not None:
            path = stats_file

            def keep_stats() -> None:
                """The only writer of the stats file: once a second, and once after the stop."""
                while not runner.wait_stopped(1.0):
                    write_json(path, runner.snapshot())
                write_json(path, runner.snapshot())

            stats_writer = threading.Thread(target=keep_stats, name="stats", daemon=True)
            stats_writer.start()
        logger = logging.getLogger("scheduler.worker")
        logger.info("worker %s started: app %s (%s), pool %s, concurrency %d, backend %s",
                    name, app_spec, ", ".join(app.types()), pool, concurrency, backend)
        try:
            runner.run()
        except BaseException:
            logger.exception("worker %s failed", name)
            logging.shutdown()
            os._exit(Exit.FAILURE)  # handler threads cannot be stopped; their tasks go to other workers
        if stats_writer is not None:
            stats_writer.join(10)
    logger.info("worker %s stopped: %s", name, json.dumps(
        {k: v for k, v in runner.snapshot().items() if isinstance(v, int) and v}))
    if runner.abandoned:
        # Plain handler threads cannot be stopped and would hold the process open; their
        # tasks were not committed, so the next worker runs them again.
        logger.warning("leaving %d handlers running past the drain timeout; their tasks will be delivered again",
                       runner.abandoned)
        logging.shutdown()
        os._exit(Exit.OK)


@cli.group()
def dlq() -> None:
    """List and replay dead letters: tasks that failed for good or could not be run."""


def _letters(backend: str, db: Path, options: dict[str, Any]) -> tuple[list[Any], int, int]:
    from scheduler.worker.dead_letters import waiting

    settings = backend_settings(backend, db, **options)
    with wiring.open_dead_letters(settings) as (scanner, _):
        deliveries = scanner.scan(settings.kafka.dead_letter_topic)
    letters, replayed, unreadable = waiting(deliveries)
    return letters, len(replayed), unreadable


def _matches(letter: Any, tenant: str | None, type_: str | None) -> bool:
    return (tenant is None or letter.tenant == tenant) and (type_ is None or letter.type == type_)


def _when(ms: int) -> str:
    return from_ms(ms).astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


@dlq.command("list")
@click.option("--tenant", "tenant", help="Only this tenant's letters.")
@click.option("--type", "type_", help="Only letters of this task type.")
@click.option("--limit", "limit", type=click.IntRange(1), default=100, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@store_options
def dlq_list(tenant: str | None, type_: str | None, limit: int, as_json: bool, backend: str, db: Path,
             **options: Any) -> None:
    """Show the dead letters not yet replayed, oldest first.

    Each line: the letter's name (partition:offset, for `dlq replay`), when it died,
    tenant, type, task id, attempt, reason, and the last line of the last error (the
    exception; `--json` has all of it).
    """
    letters, replayed, unreadable = _letters(backend, db, options)
    selected = [letter for letter in letters if _matches(letter, tenant, type_)]
    for letter in selected[:limit]:
        if as_json:
            click.echo(json.dumps({
                "letter": letter.letter, "dead_at": _when(letter.dead_at_ms), "tenant": letter.tenant,
                "type": letter.type, "task_id": None if letter.task_id is None else str(letter.task_id),
                "attempt": letter.attempt, "reason": letter.reason, "error": letter.error,
                "source_topic": letter.source_topic,
            }))
        else:
            first_line = (letter.error.strip().splitlines() or [""])[-1][:120]
            click.echo(f"{letter.letter}\t{_when(letter.dead_at_ms)}\t{letter.tenant or '-'}\t{letter.type or '-'}\t"
                       f"{letter.task_id or '-'}\tattempt {letter.attempt}\t{letter.reason}\t{first_line}")
    if not as_json:
        click.echo(f"{len(selected)} waiting ({min(len(selected), limit)} shown), {replayed} replayed"
                   + (f", {unreadable} unreadable records" if unreadable else ""), err=True)


@dlq.command("replay")
@click.argument("letters", nargs=-1)
@click.option("--all", "replay_all", is_flag=True, help="Replay every waiting letter (with --tenant/--type: those).")
@click.option("--tenant", "tenant", help="Only this tenant's letters.")
@click.option("--type", "type_", help="Only letters of this task type.")
@click.option("--dry-run", "dry_run", is_flag=True, help="Say what would be replayed, change nothing.")
@store_options
def dlq_replay(letters: tuple[str, ...], replay_all: bool, tenant: str | None, type_: str | None, dry_run: bool,
               backend: str, db: Path, **options: Any) -> None:
    """Submit dead letters again as new tasks, due now, with a fresh series of attempts.

    Name letters (as `dlq list` shows them) or pass --all. Each replayed letter gets a
    marker on the dead-letter topic, so it is no longer listed and not replayed twice.
    A letter whose message cannot be decoded cannot be replayed and is reported.
    Exits 1 if any named letter was not found or could not be replayed.
    """
    from scheduler.producer import Client
    from scheduler.worker.dead_letters import Replayed, encode_replayed, waiting

    if not letters and not replay_all:
        raise click.UsageError("name the letters to replay (see `scheduler dlq list`) or pass --all")
    settings = backend_settings(backend, db, **options)
    failed = 0
    with wiring.open_store(settings) as store, wiring.open_handoff(settings, store.shard_count) as handoff, \
            wiring.open_dead_letters(settings) as (scanner, publisher):
        waiting_letters, _, _ = waiting(scanner.scan(settings.kafka.dead_letter_topic))
        by_name = {letter.letter: letter for letter in waiting_letters}
        if replay_all:
            chosen = [letter for letter in waiting_letters if _matches(letter, tenant, type_)]
        else:
            chosen = []
            for name in dict.fromkeys(letters):  # a name given twice is replayed once
                if name not in by_name:
                    click.echo(f"{name}: no such waiting letter (already replayed, or never there)", err=True)
                    failed += 1
                else:
                    chosen.append(by_name[name])
        client = Client(store, handoff=handoff)
        for letter in chosen:
            try:
                task = decode_message(letter.message).task
                payload = decode_payload(task.payload)
            except Exception as exc:  # InvalidMessage, or whatever msgpack raises on a bad payload
                click.echo(f"{letter.letter}: cannot be replayed, its message is unreadable: {exc}", err=True)
                failed += 1
                continue
            if dry_run:
                click.echo(f"{letter.letter}: would replay {task.tenant}/{task.type} (was {task.id})")
                continue
            now = datetime.now(timezone.utc)  # explicit: a keyed task needs one, and it names the new task
            try:
                new_id = client.submit(task.type, payload, tenant=task.tenant, priority=task.priority, run_at=now,
                                       idempotency_key=task.idempotency_key, max_attempts=task.max_attempts,
                                       cost=task.cost)
                publisher.publish(settings.kafka.dead_letter_topic, [encode_replayed(
                    Replayed(letter.letter, new_id, time.time_ns() // 1_000_000))])
                publisher.flush(30.0)
            except SchedulerError as exc:
                click.echo(f"{letter.letter}: not replayed: {exc}", err=True)
                failed += 1
                continue
            click.echo(f"{letter.letter}: replayed as {new_id} (was {task.id})")
    if failed:
        raise click.exceptions.Exit(Exit.FAILURE)
