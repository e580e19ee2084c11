"""`scheduler worker`: run an application's handlers on fired tasks until stopped."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import sys
import threading
from pathlib import Path
from typing import Any

import click

from scheduler import backends
from scheduler.backends import POOL_TOPICS
from scheduler.cli.options import Exit, backend_settings, metrics_options, start_metrics, store_options
from scheduler.worker.runtime import CHECKS


@click.command()
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
              help="On SIGTERM: seconds in-flight handlers get to finish before the worker leaves. It then "
                   "settles, commits and leaves its group, and exits at most 10 s later whatever the servers do "
                   "(what it could not commit is delivered again to the other workers).")
@click.option("--session-timeout", "session_timeout_s", type=float, default=10.0, show_default=True,
              help="Seconds after which a silent worker's partitions go to the others.")
@click.option("--check", "check", type=click.Choice(CHECKS), default="suspect", show_default=True,
              envvar="SCHEDULER_WORKER_CHECK", show_envvar=True,
              help="Which messages are checked against their task's stored status before running: "
                   "suspect (those that can be repeats: retries, backlog, just after a rebalance), always, "
                   "never. Cancels are honoured whatever this says: a message of a task whose shard had a cancel "
                   "since a few minutes before the task was first due (any attempt of it) is checked, and started "
                   "only once that check answered; a failed check is tried again, never skipped.")
@click.option("--stats-file", "stats_file", type=click.Path(dir_okay=False, path_type=Path),
              help="Keep a JSON document of this worker's counters here (rewritten every second).")
@metrics_options
@click.option("--log-level", "log_level", default="info", show_default=True,
              type=click.Choice(["debug", "info", "warning", "error"]), help="Least severe log line written to stderr.")
@store_options
def worker(app_spec: str, pool: str, concurrency: int, member: str | None, drain_timeout_s: float,
           session_timeout_s: float, check: str, stats_file: Path | None, metrics_port: int | None,
           metrics_host: str, log_level: str, backend: str, db: Path, **options: Any) -> None:
    """Run the handlers of fired tasks until stopped.

    Consumes the pool's ready topics in the pool's consumer group, runs each task's
    handler, retries failures with backoff through the store, and parks what cannot
    succeed on the dead-letter topic (see `scheduler dlq`). Offsets are committed only
    after a task's outcome is stored, so a worker killed at any moment loses nothing.
    SIGTERM finishes the handlers in flight, commits and leaves the group.
    """
    from scheduler.dispatcher.runtime import write_json
    from scheduler.worker import load_app
    from scheduler.worker.runtime import LEAVE_S, Worker, WorkerConfig

    logging.basicConfig(level=log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s.%(msecs)03d %(levelname)s %(name)s: %(message)s",
                        datefmt="%Y-%m-%dT%H:%M:%S")
    metrics = start_metrics(metrics_host, metrics_port)  # before joining: a port in use fails now
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    app = load_app(app_spec)
    if not app.handlers():
        raise click.UsageError(f"{app_spec} has no handlers registered")
    name = member or f"{socket.gethostname()}-{os.getpid()}"
    settings = backend_settings(backend, db, **options)
    with backends.open_worker_parts(settings, name, pool, session_timeout_s) as parts:
        config = WorkerConfig(
            member=name, pool=pool, topics=parts.topics, dead_letter_topic=parts.dead_letter_topic,
            concurrency=concurrency, drain_timeout_s=drain_timeout_s, shard_count=parts.store.shard_count,
            check=check,
        )
        runner = Worker(app, config, consumer_factory=parts.consumer_factory, store=parts.store,
                        publisher=parts.publisher, handoff=parts.handoff, ledger=parts.ledger, counts=parts.counts,
                        workflows=parts.workflows)
        if metrics is not None:
            from scheduler.visibility.worker_metrics import WorkerCollector

            metrics.register(WorkerCollector(runner))
        logger = logging.getLogger("scheduler.worker")
        leave_after_s = drain_timeout_s + LEAVE_S

        def leave_now() -> None:
            logger.warning("still stopping %.0f s after the stop was asked (drain timeout %.0f s, then %.0f s to "
                           "settle, commit and leave the group): leaving now; what was not committed is delivered "
                           "again to the other workers", leave_after_s, drain_timeout_s, LEAVE_S)
            logging.shutdown()
            os._exit(Exit.OK)

        leaving = threading.Timer(leave_after_s, leave_now)
        leaving.daemon = True

        def stop(*_: object) -> None:
            runner.stop()
            if not leaving.is_alive():  # the first signal starts the clock; `start` twice would raise
                leaving.start()

        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, stop)
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
