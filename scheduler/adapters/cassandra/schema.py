"""Rendering and applying `schema.cql`, and recording the keyspace's shard count.

`schema.cql` is written for cqlsh with the keyspace `scheduler`; `render` puts the
configured keyspace name and replication in its place and qualifies every table, so
the statements can run on any session. `apply` is idempotent: every statement is
`IF NOT EXISTS` (a column added to a table after its first release is added with
`ALTER TABLE ... ADD IF NOT EXISTS`, so an older keyspace catches up and a new one is
unchanged), and the shard count is recorded once (a conditional insert). Asking
for a different shard count on an existing keyspace is a `SchemaConflict`, because
every task's shard, and so its partition, depends on it.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from typing import Any

from cassandra import OperationTimedOut, Timeout, Unavailable
from cassandra.cluster import EXEC_PROFILE_DEFAULT, NoHostAvailable, Session
from cassandra.connection import ConnectionException
from cassandra.policies import FallthroughRetryPolicy
from cassandra.pool import Host
from cassandra.protocol import IsBootstrappingErrorMessage, OverloadedErrorMessage

from scheduler.adapters.cassandra.connection import DRIVER_ERRORS, CassandraConnection
from scheduler.adapters.cassandra.refusals import raise_if_denied
from scheduler.errors import SchemaConflict, StoreError, StoreUnavailable
from scheduler.settings import CassandraSettings, check_keyspace, check_replication

_KEYSPACE = re.compile(r"CREATE KEYSPACE IF NOT EXISTS \w+\s+WITH replication = \{[^}]*\}")
_USE = re.compile(r"USE \w+")
_TABLE = re.compile(r"(CREATE TABLE IF NOT EXISTS) (\w+)")
_ADD_COLUMN = re.compile(r"(ALTER TABLE) (\w+)( ADD IF NOT EXISTS \w+ [\w<>, ]+)")
_TABLE_OPTION = re.compile(r"(ALTER TABLE) (\w+)( WITH \w+ = \d+)")

STATEMENT_TIMEOUT_S = 60.0
"""How long one ask of a schema statement may take: a table made on a busy cluster of
several nodes waits for each of them."""
PATIENCE_S = 180.0
"""How long one statement is asked again after it timed out or its node was held down
(the driver marks a node down when it stops answering, and up again when it reconnects)."""
RETRY_DELAYS_S = (1.0, 2.0, 5.0, 10.0)
"""Waits before each ask again; the last one repeats."""
_TRANSIENT = (OperationTimedOut, NoHostAvailable, ConnectionException, Timeout, Unavailable,
              OverloadedErrorMessage, IsBootstrappingErrorMessage)
"""A node too slow, too busy or not there for now: asked again. Refusals (syntax,
grants, a replication Cassandra does not know) are not."""
_FAILURES = (*DRIVER_ERRORS, ConnectionException)

log = logging.getLogger(__name__)


def schema_text() -> str:
    """The text of `schema.cql` as shipped with the package."""
    return resources.files("scheduler.adapters.cassandra").joinpath("schema.cql").read_text(encoding="utf-8")


def split_statements(text: str) -> list[str]:
    """CQL statements in `text`, without `--` comments or blank lines, split on `;`
    outside quotes. Line breaks and indentation inside a statement are kept."""
    statements: list[str] = []
    lines: list[str] = []
    kept: list[str] = []

    def end_line() -> None:
        line = "".join(kept).rstrip()
        if line.strip():
            lines.append(line)
        kept.clear()

    for line in text.splitlines():
        in_quote = False
        for index, char in enumerate(line):
            if char == "'":
                in_quote = not in_quote
            elif not in_quote and line.startswith("--", index):
                break
            elif char == ";" and not in_quote:
                end_line()
                statements.append("\n".join(lines))
                lines.clear()
                continue
            kept.append(char)
        end_line()
    if lines:
        raise StoreError("schema.cql ends with a statement that has no closing ';'")
    return [statement for statement in statements if statement]


def render(keyspace: str, replication: str, text: str | None = None) -> list[str]:
    """The statements of the schema for `keyspace`, tables qualified, no `USE`."""
    check_keyspace(keyspace)
    check_replication(replication)
    rendered = []
    for statement in split_statements(schema_text() if text is None else text):
        if _KEYSPACE.fullmatch(statement):
            rendered.append(f"CREATE KEYSPACE IF NOT EXISTS {keyspace} WITH replication = {replication}")
        elif _USE.fullmatch(statement):
            continue
        elif _TABLE.match(statement):
            rendered.append(_TABLE.sub(rf"\1 {keyspace}.\2", statement, count=1))
        elif _ADD_COLUMN.fullmatch(statement):
            rendered.append(_ADD_COLUMN.sub(rf"\1 {keyspace}.\2\3", statement, count=1))
        elif _TABLE_OPTION.fullmatch(statement):  # a table option, set again on every apply
            rendered.append(_TABLE_OPTION.sub(rf"\1 {keyspace}.\2\3", statement, count=1))
        else:
            raise StoreError(f"schema.cql holds a statement the renderer does not know: {statement[:60]!r}")
    return rendered


@dataclass(frozen=True)
class AppliedSchema:
    keyspace: str
    statements: int
    shard_count: int
    shard_count_recorded_now: bool


def apply(connection: CassandraConnection, settings: CassandraSettings) -> AppliedSchema:
    """Create the keyspace and tables if missing, and record the shard count."""
    statements = render(settings.keyspace, settings.replication)
    session = connection.session
    ask = _Asker(session)
    try:
        for statement in statements:
            ask(statement)
        # Asked again after a timeout, the conditional insert may find its own first value:
        # then it is not "recorded now", but the count is the one asked for.
        row = ask(
            f"INSERT INTO {settings.keyspace}.meta (name, value) VALUES ('shard_count', %s) IF NOT EXISTS",
            (str(settings.shard_count),),
        ).one()
        # No task can be older than this: a shard never fired starts from here.
        ask(
            f"INSERT INTO {settings.keyspace}.meta (name, value) VALUES ('created_ms', %s) IF NOT EXISTS",
            (str(time.time_ns() // 1_000_000),),
        )
    except _FAILURES as exc:
        raise_if_denied(exc, session, f"applying the schema to keyspace {settings.keyspace!r}")
        failed = f"applying the schema to keyspace {settings.keyspace!r} failed: {exc}."
        if isinstance(exc, _TRANSIENT):
            raise StoreUnavailable(f"{failed} Every statement is safe to run twice: once every node is up, "
                                   "`scheduler schema apply` finishes what is missing.") from exc
        raise StoreError(failed) from exc
    if not row.applied and int(row.value) != settings.shard_count:
        raise SchemaConflict(
            f"keyspace {settings.keyspace!r} was created with {row.value} shards, not {settings.shard_count}. "
            "The shard count is fixed per keyspace: use the recorded count, or a new keyspace."
        )
    return AppliedSchema(settings.keyspace, len(statements), settings.shard_count, bool(row.applied))


def _open_hosts(session: Session) -> set[Host]:
    """The nodes the driver holds up and has an open connection to. `is_up` alone is not
    enough: a node found in `system.peers` is held up before any connection to it was made."""
    return {host for host, state in session.get_pool_state().items() if host.is_up and state.get("open_count", 0)}


class _Asker:
    """Runs schema statements on one node, asking a statement again after a timeout, of
    the node it may have reached, for up to `PATIENCE_S`."""

    def __init__(self, session: Session, *, sleep: Callable[[float], None] = time.sleep,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.session = session
        self.sleep = sleep
        self.clock = clock
        # The driver's default policy sends a statement a node failed to the next node at
        # once, which for a statement pinned to a node is the same node again, with no
        # wait: asking again is left to the waits below.
        self.profile = session.execution_profile_clone_update(EXEC_PROFILE_DEFAULT,
                                                              retry_policy=FallthroughRetryPolicy())
        self.host: Host | None = None
        self.unsettled = False
        """Whether the last change was not seen on every node when it returned (the
        driver waits 10 s for that, then goes on): the next statement stays on its node."""

    def __call__(self, statement: str, values: tuple[object, ...] | None = None) -> Any:
        deadline = self.clock() + PATIENCE_S
        may_have_reached = False  # once it may have, it is asked only of that node
        attempt = 0
        while True:
            if not (may_have_reached or self.unsettled) and self.host not in (hosts := _open_hosts(self.session)):
                # Any node with an open connection; the same one from then on while it has.
                self.host = min(hosts, key=lambda host: str(host.endpoint), default=None)
            try:
                if self.host is None:
                    raise NoHostAvailable("no Cassandra node has an open connection for now", {})
                timeout = min(STATEMENT_TIMEOUT_S, max(deadline - self.clock(), 1.0))
                result = self.session.execute(statement, values, timeout=timeout, host=self.host,
                                              execution_profile=self.profile)
                self.unsettled = not getattr(getattr(result, "response_future", None), "is_schema_agreed", True)
                return result
            except _TRANSIENT as exc:
                may_have_reached = may_have_reached or not isinstance(exc, NoHostAvailable)
                delay = RETRY_DELAYS_S[min(attempt, len(RETRY_DELAYS_S) - 1)]
                if self.clock() + delay >= deadline:
                    raise
                where = self.host.endpoint if self.host is not None else "Cassandra"
                log.warning("%s: %r failed (%s: %s); asking again in %.0f s", where,
                            " ".join(statement.split()[:6]), type(exc).__name__, exc, delay)
                self.sleep(delay)
                attempt += 1
