"""What the command modules share: the options that name a backend and where its servers
are, the parsers of option values, the clients and stores those options open, and the
exit codes.

Every option also reads a `SCHEDULER_*` environment variable, shown in `--help`.
Exit codes are the named constants of `Exit`, so scripts can tell a bad flag from a
server that is down.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from enum import IntEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

import click

from scheduler import backends, connecting
from scheduler.backends import BackendSettings
from scheduler.errors import ConfigError
from scheduler.model import DEFAULT_MAX_ATTEMPTS
from scheduler.ports import Handoff, TaskStore
from scheduler.settings import (
    CASSANDRA_ENV,
    CONSISTENCY_LEVELS,
    CassandraSettings,
    KafkaSettings,
    TlsFiles,
    ZooKeeperSettings,
    split_hosts,
)

if TYPE_CHECKING:
    from scheduler.producer import Client
    from scheduler.visibility.metrics import MetricsServer


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

    def option(flag: str, name: str, help: str, field: str | None = None, envvar: str | None = None,
               **kwargs: Any) -> Callable[[F], F]:
        field = field or name
        kwargs.setdefault("default", getattr(defaults, field, None))
        return click.option(flag, name, envvar=envvar or CASSANDRA_ENV[field], show_envvar=True,
                            show_default=kwargs["default"] is not None, help=help, **kwargs)

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
        option("--cassandra-username", "cassandra_username", "Role to log in as (PasswordAuthenticator); "
               "default: no login.", field="username"),
        option("--cassandra-password-file", "cassandra_password_file",
               "File holding the role's password (one line). No flag takes the password itself.",
               field="password_file", type=click.Path(dir_okay=False, path_type=Path)),
        *(option(f"--cassandra-tls-{part}", f"cassandra_tls_{part}", help, envvar=f"SCHEDULER_CASSANDRA_TLS_{part.upper()}",
                 default=None, type=click.Path(dir_okay=False, path_type=Path))
          for part, help in (
              ("ca", "PEM file of the CA that signed the nodes' certificates: connect over TLS, checking each node's "
                     "certificate against it and the address dialled. Default: no TLS."),
              ("cert", "PEM file of this client's certificate, for nodes that require one (with --cassandra-tls-key)."),
              ("key", "PEM file of the private key of --cassandra-tls-cert (unencrypted; keep it chmod 600)."),
          )),
    ]
    for decorate in reversed(options):
        function = decorate(function)
    return function


def settings_from(hosts: str, port: int, keyspace: str, replication: str, consistency: str,
                  shard_count: int, cassandra_username: str | None = None,
                  cassandra_password_file: Path | None = None, cassandra_tls_ca: Path | None = None,
                  cassandra_tls_cert: Path | None = None, cassandra_tls_key: Path | None = None) -> CassandraSettings:
    """The settings of `cassandra_options`' values, over what the environment says."""
    tls = None
    if cassandra_tls_ca is not None:
        tls = TlsFiles(cassandra_tls_ca, cassandra_tls_cert, cassandra_tls_key)
    elif cassandra_tls_cert is not None or cassandra_tls_key is not None:
        raise ConfigError("--cassandra-tls-cert and --cassandra-tls-key need --cassandra-tls-ca "
                          "(SCHEDULER_CASSANDRA_TLS_CA): TLS starts from the CA that signed the nodes' certificates")
    return CassandraSettings.from_env(
        hosts=split_hosts(hosts), port=port, keyspace=keyspace, replication=replication,
        consistency=consistency, shard_count=shard_count, username=cassandra_username,
        password_file=cassandra_password_file, tls=tls,
    )



KAFKA_SECURITY_OPTIONS = {
    # option name: (flag, variable, help)
    "kafka_username": ("--kafka-username", "SCHEDULER_KAFKA_USERNAME",
                       "SASL user to authenticate to Kafka as (with --kafka-password-file). Default: no SASL."),
    "kafka_password_file": ("--kafka-password-file", "SCHEDULER_KAFKA_PASSWORD_FILE",
                            "File holding the Kafka user's password (one line; chmod 600). Read when a client is "
                            "made; never give the password itself."),
    "kafka_sasl_mechanism": ("--kafka-sasl-mechanism", "SCHEDULER_KAFKA_SASL_MECHANISM",
                             "SASL mechanism: SCRAM-SHA-512 (default), SCRAM-SHA-256 or PLAIN (PLAIN only with TLS)."),
    "kafka_tls_ca": ("--kafka-tls-ca", "SCHEDULER_KAFKA_TLS_CA",
                     "PEM file of the CA that signed the brokers' certificates: turns TLS on, and a broker whose "
                     "certificate it did not sign, or that does not name the address dialled, is refused."),
    "kafka_tls_cert": ("--kafka-tls-cert", "SCHEDULER_KAFKA_TLS_CERT",
                       "PEM client certificate, for brokers that require one (with --kafka-tls-key)."),
    "kafka_tls_key": ("--kafka-tls-key", "SCHEDULER_KAFKA_TLS_KEY", "PEM private key of --kafka-tls-cert."),
}
"""Each Kafka security option's flag, variable and help; `kafka_settings` reads them."""


def queue_options(function: F) -> F:
    """Where the Kafka cluster is, the prefix of the scheduler's topics, and how to
    connect to it (SASL user and password file, TLS files): paths only, never a secret."""
    defaults = KafkaSettings()
    for name, (flag, variable, help) in reversed(KAFKA_SECURITY_OPTIONS.items()):
        function = click.option(flag, name, envvar=variable, show_envvar=True, help=help)(function)
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


def metrics_options(function: F) -> F:
    """`--metrics-port` and `--metrics-host`: the process's Prometheus endpoint."""
    function = click.option(
        "--metrics-host", "metrics_host", default="127.0.0.1", envvar="SCHEDULER_METRICS_HOST", show_envvar=True,
        show_default=True, help="Address the metrics endpoint listens on. Loopback by default: the endpoint has no "
        "authentication, so expose it (e.g. 0.0.0.0) only where the network decides who can scrape it.",
    )(function)
    return click.option(
        "--metrics-port", "metrics_port", type=click.IntRange(0, 65535), envvar="SCHEDULER_METRICS_PORT",
        show_envvar=True, help="Serve Prometheus metrics at http://HOST:PORT/metrics (0: any free port, logged). "
        "Default: no endpoint. A port in use is an error (exit 2) before the process joins anything.",
    )(function)


def start_metrics(host: str, port: int | None) -> MetricsServer | None:
    """The process's metrics endpoint, bound now (`ConfigError`, exit 2, if it cannot be),
    or None without `--metrics-port`. Collectors are registered once the process exists."""
    if port is None:
        return None
    from scheduler.visibility.metrics import serve

    return serve(host, port)


def kafka_settings(kafka_bootstrap: str, topic_prefix: str, **security: str | None) -> KafkaSettings:
    """`KafkaSettings` from `queue_options`' values (each already read from its flag or
    variable); a flag wins over its variable."""
    given = {KAFKA_SECURITY_OPTIONS[name][1]: value for name, value in security.items() if value}
    return KafkaSettings.from_env({**os.environ, **given}, bootstrap=kafka_bootstrap, topic_prefix=topic_prefix)


def backend_settings(backend: str, db: Path, *, kafka_bootstrap: str, topic_prefix: str,
                     zookeeper: ZooKeeperSettings | None = None, **options: Any) -> BackendSettings:
    """The backend a command's options name (each already read from its flag or variable),
    resolved as `scheduler.connect` resolves its arguments."""
    security = {name: options.pop(name, None) for name in KAFKA_SECURITY_OPTIONS}
    return connecting.backend_settings(
        backend=backend, db=db, cassandra=settings_from(**options),
        kafka=kafka_settings(kafka_bootstrap, topic_prefix, **security), zookeeper=zookeeper,
    )


@contextmanager
def open_store(backend: str, db: Path, **options: Any) -> Iterator[TaskStore]:
    with backends.open_store(backend_settings(backend, db, **options)) as store:
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


def parse_listen(listen: str, param_hint: str = "--listen") -> tuple[str, int]:
    """HOST:PORT (an IPv6 host in brackets) as (host, port); `BadParameter` otherwise."""
    host, sep, port = listen.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise click.BadParameter(f"{listen!r}: give HOST:PORT, e.g. 127.0.0.1:8470 or 0.0.0.0:0",
                                 param_hint=param_hint)
    return host, int(port)
