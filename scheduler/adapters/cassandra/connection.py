"""Opening a Cassandra session the way the scheduler needs it.

Token-aware routing (a request goes straight to a replica of its partition), the
configured consistency for reads and writes, LOCAL_SERIAL for conditional writes; the
role's login and TLS when the settings give them (`refusals` tells a refusal from an
outage). Failure to reach any contact point is a `StoreUnavailable` that names the
addresses tried; a server that answered and refused the credentials, the TLS or a
statement is a `StoreAccessDenied` naming the setting to fix.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from cassandra import ConsistencyLevel, DriverException
from cassandra.auth import PlainTextAuthProvider
from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, ExecutionProfile, NoHostAvailable, Session
from cassandra.policies import DCAwareRoundRobinPolicy, TokenAwarePolicy
from cassandra.protocol import ErrorMessage
from cassandra.query import PreparedStatement

from scheduler.adapters.cassandra.refusals import connect_failure, raise_if_denied, tls_context
from scheduler.errors import StoreError, StoreUnavailable
from scheduler.settings import CassandraSettings

REQUEST_TIMEOUT_S = 30.0

DRIVER_ERRORS: tuple[type[Exception], ...] = (DriverException, NoHostAvailable, ErrorMessage)
"""What a request can raise: the driver's own failures (timeouts), no node reachable
(`NoHostAvailable`, which is not a DriverException) and the server's refusals (syntax,
invalid request, configuration), which are not DriverExceptions either."""


class _ReportedByConnect(logging.Filter):
    """Drops the driver's own log records of a failed first connection ("[control
    connection] Error connecting to ...", "Control connection failed to connect ..."),
    each with a traceback: `connect` raises the same failure as one error that says what
    to do, and a refused login would otherwise print two tracebacks before it."""

    PREFIXES = ("[control connection] Error connecting to", "Control connection failed to connect")

    def filter(self, record: logging.LogRecord) -> bool:
        return not (isinstance(record.msg, str) and record.msg.startswith(self.PREFIXES))


logging.getLogger("cassandra.cluster").addFilter(_ReportedByConnect())


@dataclass
class CassandraConnection:
    cluster: Cluster
    session: Session

    def close(self) -> None:
        self.cluster.shutdown()

    def __enter__(self) -> CassandraConnection:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def connect(settings: CassandraSettings) -> CassandraConnection:
    """A session on the cluster in `settings`, not bound to a keyspace: logged in as
    `settings.username` and over TLS (`settings.tls`: the server's certificate checked
    against the CA and the address dialled, this client's certificate presented) when
    they are given."""
    profile = ExecutionProfile(
        load_balancing_policy=TokenAwarePolicy(DCAwareRoundRobinPolicy(local_dc=settings.local_dc)),
        consistency_level=ConsistencyLevel.name_to_value[settings.consistency],
        serial_consistency_level=ConsistencyLevel.LOCAL_SERIAL,
        request_timeout=REQUEST_TIMEOUT_S,
    )
    credentials = settings.credentials()
    auth = PlainTextAuthProvider(*credentials) if credentials else None
    # With check_hostname on, the driver checks each node's certificate against the
    # address it dialled (a contact point, or a peer's rpc_address).
    ssl_context = tls_context(settings.tls) if settings.tls is not None else None
    cluster = Cluster(
        contact_points=list(settings.hosts),
        port=settings.port,
        execution_profiles={EXEC_PROFILE_DEFAULT: profile},
        auth_provider=auth,
        ssl_context=ssl_context,
        connect_timeout=settings.connect_timeout_s,
    )
    try:
        session = cluster.connect()
    except NoHostAvailable as exc:
        cluster.shutdown()
        raise connect_failure(exc, settings) from exc
    return CassandraConnection(cluster, session)


def prepare_for_table(session: Session, queries: Mapping[str, str], keyspace: str, what: str,
                      table: str) -> dict[str, PreparedStatement]:
    """`queries` (with `{keyspace}` in them) prepared by name; `StoreError` naming `what`
    if the server refuses, with the likely cause: a keyspace made before `table` was
    added to the schema."""
    try:
        return {name: session.prepare(text.format(keyspace=keyspace)) for name, text in queries.items()}
    except DRIVER_ERRORS as exc:
        raise_if_denied(exc, session, f"preparing the {what}'s statements in keyspace {keyspace!r}")
        raise StoreError(
            f"cannot prepare the {what}'s statements in keyspace {keyspace!r} ({type(exc).__name__}: {exc}); "
            f"has `scheduler schema apply` been run for it since the {table} table was added?"
        ) from exc


def run_prepared(session: Session, statements: Mapping[str, Any], name: str, values: tuple[object, ...],
                 what: str) -> Any:
    """Run the prepared statement `name` of a store (`what`, e.g. "limits store") with
    `values`; a driver error becomes `StoreUnavailable` or `StoreError` naming both."""
    try:
        return session.execute(statements[name].bind(values))
    except NoHostAvailable as exc:
        raise StoreUnavailable(f"no Cassandra node could take the {what}'s {name}: {exc}") from exc
    except DRIVER_ERRORS as exc:
        raise_if_denied(exc, session, f"the {what}'s {name}")
        raise StoreError(f"{what} {name} failed: {type(exc).__name__}: {exc}") from exc


def answer_column(result: Any, name: str) -> Any:
    """A column of the first row of a conditional write's answer (tuple rows)."""
    names = list(result.column_names or [])
    row = result.one()
    if row is None or name not in names:
        return None
    return row[names.index(name)]
