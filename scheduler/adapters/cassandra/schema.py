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
from dataclasses import dataclass
from importlib import resources
from typing import Any

from cassandra import OperationTimedOut, Timeout, Unavailable
from cassandra.cluster import NoHostAvailable, Session
from cassandra.pool import Host

from scheduler.adapters.cassandra.connection import DRIVER_ERRORS, CassandraConnection
from scheduler.adapters.cassandra.refusals import raise_if_denied
from scheduler.errors import SchemaConflict, StoreError
from scheduler.settings import CassandraSettings, check_keyspace, check_replication

_KEYSPACE = re.compile(r"CREATE KEYSPACE IF NOT EXISTS \w+\s+WITH replication = \{[^}]*\}")
_USE = re.compile(r"USE \w+")
_TABLE = re.compile(r"(CREATE TABLE IF NOT EXISTS) (\w+)")
_ADD_COLUMN = re.compile(r"(ALTER TABLE) (\w+)( ADD IF NOT EXISTS \w+ [\w<>, ]+)")
_TABLE_OPTION = re.compile(r"(ALTER TABLE) (\w+)( WITH \w+ = \d+)")

STATEMENT_TIMEOUT_S = 60.0
"""How long one schema statement may take: a table made on a busy cluster of several
nodes waits for each of them."""
PATIENCE_S = 180.0
"""How long `apply` keeps asking again after a statement timed out or its node was
held down (the driver marks a node down when it stops answering, and up again when it
reconnects)."""
RETRY_DELAYS_S = (1.0, 2.0, 5.0, 10.0)
"""Waits before each ask again; the last one repeats."""
_TRANSIENT = (OperationTimedOut, NoHostAvailable, Timeout, Unavailable)
"""A node too slow or not there for now: asked again. Refusals (syntax, grants) are not."""

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
    ask = _Asker(session, _coordinator(session), time.monotonic() + PATIENCE_S)
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
    except DRIVER_ERRORS as exc:
        raise_if_denied(exc, session, f"applying the schema to keyspace {settings.keyspace!r}")
        raise StoreError(
            f"applying the schema to keyspace {settings.keyspace!r} failed: {exc}. Every statement is "
            "`IF NOT EXISTS`: once the nodes answer again, running it again finishes what is missing."
        ) from exc
    if not row.applied and int(row.value) != settings.shard_count:
        raise SchemaConflict(
            f"keyspace {settings.keyspace!r} was created with {row.value} shards, not {settings.shard_count}. "
            "The shard count is fixed per keyspace: use the recorded count, or a new keyspace."
        )
    return AppliedSchema(settings.keyspace, len(statements), settings.shard_count, bool(row.applied))


def _coordinator(session: Session) -> Host | None:
    """The node every schema statement goes to: one the driver holds as up (None if it
    holds none; the driver then picks, and fails as it would)."""
    up = [host for host in session.cluster.metadata.all_hosts() if host.is_up]
    return min(up, key=lambda host: str(host.endpoint)) if up else None


@dataclass
class _Asker:
    """Runs statements on one node, asking again after a timeout until `deadline`."""

    session: Session
    host: Host | None
    deadline: float

    def __call__(self, statement: str, values: tuple[object, ...] | None = None) -> Any:
        attempt = 0
        while True:
            try:
                return self.session.execute(statement, values, timeout=STATEMENT_TIMEOUT_S, host=self.host)
            except _TRANSIENT as exc:
                delay = RETRY_DELAYS_S[min(attempt, len(RETRY_DELAYS_S) - 1)]
                if time.monotonic() + delay >= self.deadline:
                    raise
                where = self.host.endpoint if self.host is not None else "Cassandra"
                log.warning("%s did not answer %r in time (%s); asking it again in %.0f s",
                            where, " ".join(statement.split()[:6]), exc, delay)
                time.sleep(delay)
                attempt += 1
