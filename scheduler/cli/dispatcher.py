"""`scheduler dispatcher`: hold shard leases and fire due tasks until stopped."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Any

import click

from scheduler import backends
from scheduler.cli.options import Exit, backend_settings, metrics_options, start_metrics, store_options
from scheduler.errors import ConfigError
from scheduler.settings import TlsFiles, ZooKeeperSettings
from scheduler.visibility.labels import DEFAULT_TYPE_LABELS, MAX_TYPE_LABELS


@click.command()
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
@click.option("--zookeeper-auth-file", "zookeeper_auth_file", type=click.Path(dir_okay=False, path_type=Path),
              envvar="SCHEDULER_ZOOKEEPER_AUTH_FILE", show_envvar=True,
              help="File holding one line user:password (chmod 600): authenticate to ZooKeeper as this digest "
                   "identity and make the members and leases writable by it alone (read: anyone). Default: no "
                   "authentication, open znodes. A missing or malformed file is an error (exit 2); so is a "
                   "ZooKeeper that refuses the identity.")
@click.option("--zookeeper-tls-ca", "zookeeper_tls_ca", type=click.Path(dir_okay=False, path_type=Path),
              envvar="SCHEDULER_ZOOKEEPER_TLS_CA", show_envvar=True,
              help="PEM file of the CA that signed ZooKeeper's certificate: connect over TLS (its secureClientPort), "
                   "refusing a server whose certificate it did not sign for the address dialled. Default: clear text.")
@click.option("--zookeeper-tls-cert", "zookeeper_tls_cert", type=click.Path(dir_okay=False, path_type=Path),
              envvar="SCHEDULER_ZOOKEEPER_TLS_CERT", show_envvar=True,
              help="PEM file of this client's certificate, for a ZooKeeper that requires one (ssl.clientAuth=need); "
                   "with --zookeeper-tls-key and --zookeeper-tls-ca. A server that refuses it is an error (exit 2).")
@click.option("--zookeeper-tls-key", "zookeeper_tls_key", type=click.Path(dir_okay=False, path_type=Path),
              envvar="SCHEDULER_ZOOKEEPER_TLS_KEY", show_envvar=True,
              help="PEM file of the private key of --zookeeper-tls-cert, unencrypted (chmod 600).")
@click.option("--lease-timeout", "lease_timeout_s", type=float, default=ZooKeeperSettings().session_timeout_s,
              envvar="SCHEDULER_LEASE_TIMEOUT_S", show_envvar=True, show_default=True,
              help="Seconds after which the shards of a dispatcher that died (or paused) go to others.")
@click.option("--tick-ms", "tick_ms", type=click.IntRange(10, 1000), default=100, show_default=True,
              envvar="SCHEDULER_TICK_MS", show_envvar=True,
              help="The fire loop's beat (hand-offs, reads, cursors) and the timing wheel's slot width. "
                   "Must divide 1000.")
@click.option("--fire-gap-ms", "fire_gap_ms", type=click.IntRange(1, 1000), default=15, show_default=True,
              envvar="SCHEDULER_FIRE_GAP_MS", show_envvar=True,
              help="Least time between two firing passes: tasks falling due within it are published as one batch, "
                   "so a task fires up to this late (plus the publish). At --tick-ms or more, tasks fire at the "
                   "ticks only, up to a tick late.")
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
@click.option("--metrics-types", "metrics_types", type=click.IntRange(0, MAX_TYPE_LABELS),
              default=DEFAULT_TYPE_LABELS, show_default=True, envvar="SCHEDULER_METRICS_TYPES", show_envvar=True,
              help="How many task types get a `type` label of their own in the metrics: the first seen; every "
                   "other type counts as `other`, so producers cannot grow the series without bound.")
@metrics_options
@click.option("--log-level", "log_level", type=click.Choice(["debug", "info", "warning", "error"]), default="info",
              envvar="SCHEDULER_LOG_LEVEL", show_envvar=True, show_default=True, help="Least severe log line written "
              "to stderr.")
@store_options
def dispatcher(shards: str, member: str | None, zookeeper_hosts: str, zookeeper_root: str,
               zookeeper_auth_file: Path | None, zookeeper_tls_ca: Path | None, zookeeper_tls_cert: Path | None,
               zookeeper_tls_key: Path | None, lease_timeout_s: float, tick_ms: int, fire_gap_ms: int, long_types: str, stats_file: Path | None, limits_interval_s: float,
               hold_timeout_s: float, sweep_interval_s: float, sweep_horizon_s: float, metrics_types: int,
               metrics_port: int | None, metrics_host: str, log_level: str, backend: str, db: Path,
               **options: Any) -> None:
    """Hold shard leases and fire due tasks to the ready topics until stopped.

    With tenant limits set (`scheduler limits`), due tasks are released fairly between
    tenants: weighted round robin, caps on running tasks, and rates, each dispatcher
    enforcing its share (shards held / shard count). Without any, they fire at once.

    Runs until SIGTERM or Ctrl-C, then gives its shards back so the other dispatchers
    take them at once. Exits 3 when a server cannot be reached at start, and 2 when
    ZooKeeper refuses its identity (--zookeeper-auth-file) or lack of one, or its
    TLS certificate (--zookeeper-tls-*) or lack of one; while
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
    metrics = start_metrics(metrics_host, metrics_port)  # before joining: a port in use fails now
    zookeeper = ZooKeeperSettings.from_env(hosts=zookeeper_hosts, root=zookeeper_root,
                                           auth_file=zookeeper_auth_file, session_timeout_s=lease_timeout_s,
                                           tls=zookeeper_tls(zookeeper_tls_ca, zookeeper_tls_cert, zookeeper_tls_key))
    settings = backend_settings(backend, db, zookeeper=zookeeper, **options)
    if settings.backend == "cassandra":
        zookeeper.identity()  # a bad auth file fails now (exit 2), before any server is touched
    name = member or f"{socket.gethostname()}-{os.getpid()}"
    with backends.open_dispatcher_parts(settings, name) as parts:
        config = DispatcherConfig(
            member=name, shards=parse_shards(shards, parts.store.shard_count), tick_ms=tick_ms,
            fire_gap_ms=fire_gap_ms, lease_timeout_s=lease_timeout_s,
            long_types=frozenset(t.strip() for t in long_types.split(",") if t.strip()), stats_path=stats_file,
            limits_interval_s=limits_interval_s, hold_timeout_s=hold_timeout_s,
            sweep_interval_ms=int(sweep_interval_s * 1000), sweep_horizon_ms=int(sweep_horizon_s * 1000),
            dead_letter_topic=settings.kafka.dead_letter_topic, metrics_types=metrics_types,
        )
        schedule_runner = ScheduleRunner(parts.schedules, Client(parts.store, handoff=parts.handoff),
                                         clock=wall_clock_ms)
        runner = Dispatcher(config, store=parts.store, coordinator=parts.coordinator, publisher=parts.publisher,
                            handoff_reader=parts.handoff_reader, topics=parts.topics,
                            schedule_runner=schedule_runner, limits_store=parts.limits, counts=parts.counts,
                            purgers=parts.purgers)
        if metrics is not None:
            from scheduler.visibility.dispatcher_metrics import DispatcherCollector

            metrics.register(DispatcherCollector(runner.ctx))
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


def zookeeper_tls(ca: Path | None, cert: Path | None, key: Path | None) -> TlsFiles | None:
    """The --zookeeper-tls-* files (each also read from its variable), or None without a CA."""
    if ca is None:
        if cert is not None or key is not None:
            raise ConfigError("--zookeeper-tls-cert and --zookeeper-tls-key need --zookeeper-tls-ca "
                              "(SCHEDULER_ZOOKEEPER_TLS_CA): TLS starts from the CA that signed ZooKeeper's certificate")
        return None
    return TlsFiles(ca, cert, key)
