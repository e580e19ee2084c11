"""`connect`: a producer `Client` wired to the configured backend, the one way to make one.

    import scheduler

    with scheduler.connect(tenant="state-board") as client:
        client.submit("sms", {"to": "+919800000001"}, delay=60)

`connect` opens the backend's task store, its count store and its hand-off, the log through which a
submit tells a shard's owner of the tasks due within two minutes (the Kafka hand-off
topic, or the embedded backend's `queue.db`), and returns a `Client` whose `close()`
(or the end of its `with` block) closes them. The client counts what it submits and
cancels, and a thread writes those counts every two seconds and on close, for `scheduler
status` (`scheduler.visibility`). `scheduler submit` and `scheduler cancel`
take their clients from here too, so an application wires a producer exactly as the
CLI does.

Where each setting comes from: the argument when given, else the `SCHEDULER_*`
variable that the CLI's option reads, else the CLI's default:

    argument               variables                                  default
    backend                SCHEDULER_BACKEND                          embedded
    db                     SCHEDULER_DB                               $XDG_DATA_HOME/scheduler/tasks.db
    cassandra              SCHEDULER_CASSANDRA_HOSTS, _PORT, ...,     CassandraSettings()
                           SCHEDULER_KEYSPACE (`settings.CASSANDRA_ENV`)
    kafka                  SCHEDULER_KAFKA_BOOTSTRAP,                 KafkaSettings()
                           SCHEDULER_TOPIC_PREFIX
    tenant                 SCHEDULER_TENANT                           none: each call names its tenant
    default_max_attempts   (none)                                     model.DEFAULT_MAX_ATTEMPTS

A settings object given as an argument is used whole: no variable is read for its
fields. `db` is used by the embedded backend only (with `queue.db` beside it); `kafka`
by the cassandra backend, and on the embedded one for its topic names.

How it fails, always from `connect` itself and with whatever it had opened closed
again: `ConfigError` for a setting that cannot be used (raised before anything is
opened, so no file is created); `StoreUnavailable` when Cassandra does not answer, and
the store's other errors (a keyspace without the schema, another shard count);
`QueueUnavailable` when no Kafka broker answers. A hand-off topic that does not exist
yet (the dispatchers create it) is only logged: tasks due later are stored as usual,
and a task due soon fails its submit with `HandoffFailed` until the topic is there (it
is stored, and fires late: the dispatchers find it behind their reads).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING

from scheduler import backends
from scheduler.backends import BackendSettings
from scheduler.errors import ConfigError
from scheduler.model import DEFAULT_MAX_ATTEMPTS, MAX_ATTEMPTS_LIMIT, valid_max_attempts
from scheduler.producer import Client
from scheduler.settings import CassandraSettings, KafkaSettings, ZooKeeperSettings
from scheduler.visibility.writer import CountWriter

if TYPE_CHECKING:
    from scheduler.workflows.engine import Workflows

BACKENDS = ("embedded", "cassandra")

BACKEND_ENV = "SCHEDULER_BACKEND"
DB_ENV = "SCHEDULER_DB"
TENANT_ENV = "SCHEDULER_TENANT"


def default_db_path(env: Mapping[str, str] | None = None) -> Path:
    """Where the embedded store lives unless told: `$XDG_DATA_HOME/scheduler/tasks.db`
    (`~/.local/share/scheduler/tasks.db` without the variable)."""
    environment = os.environ if env is None else env
    base = environment.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(base) / "scheduler" / "tasks.db"


def backend_settings(
    *,
    backend: str | None = None,
    db: str | os.PathLike[str] | None = None,
    cassandra: CassandraSettings | None = None,
    kafka: KafkaSettings | None = None,
    zookeeper: ZooKeeperSettings | None = None,
    env: Mapping[str, str] | None = None,
) -> BackendSettings:
    """The backend's settings: each argument given, else its `SCHEDULER_*` variables in
    `env` (default: this process's environment), else the default. `ConfigError` for a
    value that cannot be used. Opens nothing."""
    environment = os.environ if env is None else env
    chosen = backend or environment.get(BACKEND_ENV) or "embedded"
    if chosen not in BACKENDS:
        raise ConfigError(f"backend {chosen!r} is not one of {', '.join(BACKENDS)} (argument or {BACKEND_ENV})")
    if db is not None:
        path = Path(db)
    elif text := environment.get(DB_ENV):
        path = Path(text)
    else:
        path = default_db_path(environment)
    return BackendSettings(
        backend=chosen,
        db=path,
        cassandra=cassandra or CassandraSettings.from_env(environment),
        kafka=kafka or KafkaSettings.from_env(environment),
        zookeeper=zookeeper or ZooKeeperSettings.from_env(environment),
    )


def connect(
    *,
    tenant: str | None = None,
    backend: str | None = None,
    db: str | os.PathLike[str] | None = None,
    cassandra: CassandraSettings | None = None,
    kafka: KafkaSettings | None = None,
    default_max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    env: Mapping[str, str] | None = None,
) -> Client:
    """A `Client` over the configured backend's task store and hand-off; see the module
    docstring for where each setting comes from and how this fails. Close it (`close()`,
    or use it as a context manager) to close both."""
    environment = os.environ if env is None else env
    settings = backend_settings(backend=backend, db=db, cassandra=cassandra, kafka=kafka, env=environment)
    if tenant is None:
        tenant = environment.get(TENANT_ENV) or None
    if not valid_max_attempts(default_max_attempts):
        raise ConfigError(f"max attempts must be from 1 to {MAX_ATTEMPTS_LIMIT}, got {default_max_attempts!r}")
    with ExitStack() as stack:
        store = stack.enter_context(backends.open_store(settings))
        handoff = stack.enter_context(backends.open_handoff(settings, store.shard_count, check=True))
        counts = stack.enter_context(backends.open_counts(settings, store))
        writer = CountWriter(counts, "producer").start()
        stack.callback(writer.stop)  # its last write, before the stores close
        opened = stack.pop_all()
    def open_workflows(client: Client) -> Workflows:
        from scheduler.workflows.engine import Workflows

        return Workflows(opened.enter_context(backends.open_workflows(settings, store)), client)

    try:
        return Client(store, tenant=tenant, handoff=handoff, default_max_attempts=default_max_attempts,
                      closer=opened.close, events=writer.counter, workflows=open_workflows)
    except BaseException:
        opened.close()
        raise
