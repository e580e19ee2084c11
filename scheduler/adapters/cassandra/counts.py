"""`CassandraCountStore`: the `CountStore` port on Cassandra (tables `count_hours`,
`count_minutes`, `count_snapshots`, `count_snapshot_latest`, `processes`,
`lateness_minutes`; see `schema.cql`).

Every write is a plain write of absolute values (no counters, no lightweight
transaction but the one that starts the snapshots): written twice, a row is the same
row. A writer's rows of one hour share a partition and go as unlogged batches of at most
`BATCH_ROWS` rows, all sent at once, their values serialised here
(`packers_for`, checked against the prepared statements' metadata at open). Reads are by partition: an hour, a minute range of
one hour's tenant slice, the one snapshot, the one processes partition; never a scan of
tasks, and never of the count tables as a whole.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

from cassandra.cluster import NoHostAvailable
from cassandra.query import BoundStatement, PreparedStatement

from scheduler.adapters.cassandra.connection import DRIVER_ERRORS, CassandraConnection, prepare_for_table
from scheduler.adapters.cassandra.refusals import denial
from scheduler.adapters.cassandra.rows import add_rows, partition_batch
from scheduler.errors import StoreError, StoreUnavailable
from scheduler.ports import LatenessRow, ProcessReport
from scheduler.settings import check_keyspace
from scheduler.visibility.counts import EVENTS, HOUR_MS, MINUTE_MS, CountRow, Pair, Values
from scheduler.visibility.histogram import LatencyHistogram

if TYPE_CHECKING:
    from scheduler.adapters.cassandra.store import CassandraTaskStore

BATCH_ROWS = 50
"""Rows per unlogged batch: ~120 bytes a row keeps a batch well under the server's
5 KB warning for all but the longest tenant names."""

_NAMES = ", ".join(EVENTS)
_MARKS = ", ".join("?" for _ in EVENTS)

_QUERIES = {
    "write_hour": f"INSERT INTO {{keyspace}}.count_hours (hour, tenant, type, writer, {_NAMES}) "
                  f"VALUES (?, ?, ?, ?, {_MARKS})",
    "write_minute": f"INSERT INTO {{keyspace}}.count_minutes (hour, tenant, minute, type, writer, {_NAMES}) "
                    f"VALUES (?, ?, ?, ?, ?, {_MARKS})",
    "read_hour": f"SELECT hour, tenant, type, writer, {_NAMES} FROM {{keyspace}}.count_hours WHERE hour = ?",
    "read_minutes": f"SELECT minute, tenant, type, writer, {_NAMES} FROM {{keyspace}}.count_minutes "
                    "WHERE hour = ? AND tenant = ? AND minute >= ? AND minute <= ?",
    "start_snapshots": "INSERT INTO {keyspace}.count_snapshot_latest (id, hour) VALUES (0, ?) IF NOT EXISTS",
    "read_latest": "SELECT hour FROM {keyspace}.count_snapshot_latest WHERE id = 0",
    "set_latest": "INSERT INTO {keyspace}.count_snapshot_latest (id, hour) VALUES (0, ?)",
    "read_snapshot": f"SELECT tenant, type, {_NAMES} FROM {{keyspace}}.count_snapshots WHERE hour = ?",
    "write_snapshot": f"INSERT INTO {{keyspace}}.count_snapshots (hour, tenant, type, {_NAMES}) "
                      f"VALUES (?, ?, ?, {_MARKS})",
    "drop_snapshot": "DELETE FROM {keyspace}.count_snapshots WHERE hour = ?",
    "write_process": "INSERT INTO {keyspace}.processes (part, writer, role, host, pid, started_ms, updated_ms, "
                     "running, detail) VALUES (0, ?, ?, ?, ?, ?, ?, ?, ?)",
    "read_processes": "SELECT writer, role, host, pid, started_ms, updated_ms, running, detail "
                      "FROM {keyspace}.processes WHERE part = 0",
    "write_lateness": "INSERT INTO {keyspace}.lateness_minutes (hour, kind, minute, writer, buckets, sum_ms) "
                      "VALUES (?, ?, ?, ?, ?, ?)",
    "read_lateness": "SELECT minute, writer, buckets, sum_ms FROM {keyspace}.lateness_minutes "
                     "WHERE hour = ? AND kind = ? AND minute >= ? AND minute <= ?",
}


_PACKED = ("write_hour", "write_minute", "write_snapshot", "write_lateness")
"""The statements whose values `_write_rows` serialises itself."""

_BIGINT = struct.Struct(">q").pack
_INT = struct.Struct(">i").pack


def _bigint_list(values: object) -> bytes:
    items = list(values)  # type: ignore[call-overload]
    return _INT(len(items)) + b"".join(_INT(8) + _BIGINT(v) for v in items)


_PACKERS: dict[str, Callable[[Any], bytes]] = {
    "bigint": _BIGINT, "int": _INT, "varchar": lambda text: text.encode(), "list<bigint>": _bigint_list,
}


def packers_for(statement: PreparedStatement, name: str) -> list[Callable[[Any], bytes]]:
    """How to serialise each bound value of `statement`, from its own metadata; a
    column of another type is an error at open, never a wrong row."""
    packers = []
    for column in statement.column_metadata:
        typename = column.type.typename
        if typename == "list":
            typename = f"list<{column.type.subtypes[0].typename}>"
        if typename not in _PACKERS:
            raise StoreError(f"count store {name}: cannot pack column {column.name} of type {typename}")
        packers.append(_PACKERS[typename])
    return packers


def _values(cells: Sequence[int | None]) -> tuple[int, ...]:
    """Event counts as read: a row is written whole, so a null (an event column added
    after it was written) is rare, and only then is the row copied to replace it."""
    values = tuple(cells)
    if None in values:
        return tuple(v or 0 for v in values)
    return cast(tuple[int, ...], values)


def _hour_of_minute(minute: int) -> int:
    return minute * MINUTE_MS // HOUR_MS


class CassandraCountStore:
    """The distributed `CountStore`, on a task store's session (`for_store`).
    Thread-safe (the driver's session is)."""

    def __init__(self, connection: CassandraConnection, keyspace: str) -> None:
        check_keyspace(keyspace)
        self._session = connection.session
        self.keyspace = keyspace
        self._q = prepare_for_table(self._session, _QUERIES, keyspace, "count store", "count_hours")
        self._packers = {name: packers_for(self._q[name], name) for name in _PACKED}

    @classmethod
    def for_store(cls, store: CassandraTaskStore) -> CassandraCountStore:
        """A count store in the task store's keyspace, on its session (closing it does
        nothing; it is unusable once the task store is closed)."""
        return cls(store.connection, store.keyspace)

    # -- plumbing -------------------------------------------------------------------

    def _fail(self, what: str, exc: Exception) -> StoreError:
        if isinstance(exc, NoHostAvailable):
            return StoreUnavailable(f"no Cassandra node could take the count store's {what}: {exc}")
        return denial(exc, self._session, f"the count store's {what}") or StoreError(f"count store {what} failed: {type(exc).__name__}: {exc}")

    def _write_rows(self, what: str, statement: str, keyed: Iterable[tuple[int, tuple[object, ...]]]) -> None:
        """Write `(partition, values)` pairs: one unlogged batch per partition and
        `BATCH_ROWS`, every batch sent before any is waited for. A writer rewrites
        thousands of rows at a time (one per tenant and type it counted), so the values
        are serialised here (~3 µs a row) rather than bound by the driver (~25 µs)."""
        by_partition: dict[int, list[tuple[object, ...]]] = {}
        for partition, values in keyed:
            by_partition.setdefault(partition, []).append(values)
        prepared = self._q[statement]
        pack = self._packers[statement]
        futures = []
        try:
            for partition, rows in by_partition.items():
                for start in range(0, len(rows), BATCH_ROWS):
                    batch = partition_batch(self.keyspace, (_BIGINT(partition),))
                    add_rows(batch, prepared, ([p(v) for p, v in zip(pack, values, strict=True)]
                                               for values in rows[start:start + BATCH_ROWS]))
                    futures.append(self._session.execute_async(batch))
            for future in futures:
                future.result()
        except DRIVER_ERRORS as exc:
            raise self._fail(what, exc) from exc

    def _read(self, what: str, statements: Sequence[BoundStatement]) -> list[Any]:
        """Rows of every statement, all sent at once (pages fetched while iterating)."""
        try:
            futures = [self._session.execute_async(s) for s in statements]
            return [row for future in futures for row in future.result()]
        except DRIVER_ERRORS as exc:
            raise self._fail(what, exc) from exc

    def _one(self, name: str, values: tuple[object, ...]) -> Any:
        try:
            return self._session.execute(self._q[name].bind(values))
        except DRIVER_ERRORS as exc:
            raise self._fail(name.replace("_", " "), exc) from exc

    # -- counts ---------------------------------------------------------------------

    def write_counts(self, hours: Sequence[CountRow], minutes: Sequence[CountRow]) -> None:
        self._write_rows("count write", "write_hour",
                         ((r.period, (r.period, r.tenant, r.type, r.writer, *r.values)) for r in hours))
        self._write_rows("count write", "write_minute",
                         ((_hour_of_minute(r.period),
                           (_hour_of_minute(r.period), r.tenant, r.period, r.type, r.writer, *r.values))
                          for r in minutes))

    def read_hours(self, hours: Sequence[int]) -> list[CountRow]:
        rows = self._read("hours read", [self._q["read_hour"].bind((hour,)) for hour in hours])
        return [CountRow(r[0], r[1], r[2], r[3], _values(r[4:])) for r in rows]

    def read_minutes(self, first_minute: int, last_minute: int, tenant: str) -> list[CountRow]:
        hours = range(_hour_of_minute(first_minute), _hour_of_minute(last_minute) + 1)
        rows = self._read("minutes read", [self._q["read_minutes"].bind((h, tenant, first_minute, last_minute))
                                           for h in hours])
        return [CountRow(r[0], r[1], r[2], r[3], _values(r[4:])) for r in rows]

    # -- snapshots --------------------------------------------------------------------

    def start_snapshots(self, hour: int) -> None:
        self._one("start_snapshots", (hour,))

    def read_snapshot(self) -> tuple[int, dict[Pair, Values]] | None:
        latest = self._one("read_latest", ()).one()
        if latest is None:
            return None
        hour = latest[0]
        rows = self._read("snapshot read", [self._q["read_snapshot"].bind((hour,))])
        return hour, {(r[0], r[1]): _values(r[2:]) for r in rows}

    def write_snapshot(self, hour: int, totals: Mapping[Pair, Values], drop: int | None) -> None:
        self._write_rows("snapshot write", "write_snapshot",
                         ((hour, (hour, tenant, type_, *values)) for (tenant, type_), values in totals.items()))
        self._one("set_latest", (hour,))
        if drop is not None and drop != hour:
            self._one("drop_snapshot", (drop,))

    # -- processes and lateness --------------------------------------------------------

    def write_process(self, report: ProcessReport) -> None:
        running = json.dumps([[t, k, n] for (t, k), n in report.running.items()])
        self._one("write_process", (report.writer, report.role, report.host, report.pid, report.started_ms,
                                    report.updated_ms, running, json.dumps(dict(report.detail))))

    def read_processes(self) -> list[ProcessReport]:
        rows = self._read("processes read", [self._q["read_processes"].bind(())])
        return sorted((ProcessReport(r[0], r[1], r[2], r[3], r[4], r[5],
                                     {(t, k): n for t, k, n in json.loads(r[6] or "[]")},
                                     json.loads(r[7] or "{}")) for r in rows),
                      key=lambda p: (p.role, p.writer))

    def write_lateness(self, rows: Sequence[LatenessRow]) -> None:
        self._write_rows("lateness write", "write_lateness",
                         ((_hour_of_minute(r.minute),
                           (_hour_of_minute(r.minute), r.kind, r.minute, r.writer, list(r.histogram.counts),
                            r.histogram.sum_ms)) for r in rows))

    def read_lateness(self, kind: str, first_minute: int, last_minute: int) -> list[LatenessRow]:
        hours = range(_hour_of_minute(first_minute), _hour_of_minute(last_minute) + 1)
        rows = self._read("lateness read", [self._q["read_lateness"].bind((h, kind, first_minute, last_minute))
                                            for h in hours])
        return [LatenessRow(r[0], kind, r[1], LatencyHistogram.stored(list(r[2] or []), r[3] or 0)) for r in rows]

    def close(self) -> None:
        """Nothing: the session is the task store's."""
