"""What a Cassandra table takes on disk, read without JMX: the bytes of its SSTables, a
flush of its memtable, whether its compactions have settled, and what the node has
compacted of it.

The local cluster opens no JMX port, so there is no nodetool. Instead:
- the table's files are found under the node's data directory, which the node itself
  names (`system_views.settings`, `data_file_directories`), and summed with `stat`; this
  works where the bench runs on the node's machine, and says so (None) where it does not;
- a flush is the table's own `memtable_flush_period_in_ms`, set low for a moment: the
  node flushes a dirty memtable once that period has passed;
- compactions running are `system_views.sstable_tasks`; an SSTable being written (a
  flush or a compaction) leaves a transaction log (`*_txn_*.log`) in the table's
  directory until it is done;
- what was compacted, bytes in and out, is `system.compaction_history`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from cassandra.cluster import Session

FLUSH_PERIOD_MS = 1000
"""The flush period set for a moment to have the memtable written out."""


def data_directories(session: Session) -> list[Path]:
    """The node's data directories, as it reports them (`[/a/data, /b/data]`)."""
    row = session.execute("SELECT value FROM system_views.settings WHERE name = 'data_file_directories'").one()
    if row is None or not row.value:
        return []
    return [Path(part.strip()) for part in row.value.strip("[]").split(",") if part.strip()]


def table_directories(session: Session, keyspace: str, table: str) -> list[Path]:
    """The table's directories on this machine (`<data>/<keyspace>/<table>-<id>`); empty
    when the node's disk is not this machine's."""
    row = session.execute("SELECT id FROM system_schema.tables WHERE keyspace_name = %s AND table_name = %s",
                          (keyspace, table)).one()
    if row is None:
        return []
    name = f"{table}-{row.id.hex}"
    return [path for base in data_directories(session) if (path := base / keyspace / name).is_dir()]


@dataclass(frozen=True)
class DiskUsage:
    """The table's live files: every SSTable component, not snapshots or backups."""

    bytes: int
    data_bytes: int
    """Of which the `-Data.db` components (the rows themselves, compressed)."""
    sstables: int
    writing: int
    """Transaction logs: SSTables being written or removed right now."""

    def as_dict(self) -> dict[str, int]:
        return {"bytes": self.bytes, "data_bytes": self.data_bytes, "sstables": self.sstables}


def usage(directories: list[Path]) -> DiskUsage:
    total = data = sstables = writing = 0
    for directory in directories:
        try:
            entries = list(directory.iterdir())
        except FileNotFoundError:
            continue
        for entry in entries:
            try:
                if not entry.is_file():
                    continue
                size = entry.stat().st_size
            except FileNotFoundError:  # compacted away while listed
                continue
            total += size
            if entry.name.endswith("-Data.db"):
                data += size
                sstables += 1
            elif entry.name.endswith(".log") and "_txn_" in entry.name:
                writing += 1
    return DiskUsage(total, data, sstables, writing)


def running_compactions(session: Session, keyspace: str, table: str | None = None) -> int:
    """Compaction tasks of the keyspace (the table's, if given) the node runs now."""
    return sum(1 for row in session.execute("SELECT keyspace_name, table_name FROM system_views.sstable_tasks")
               if row.keyspace_name == keyspace and (table is None or row.table_name == table))


def set_flush_period(session: Session, keyspace: str, table: str, period_ms: int) -> None:
    session.execute(f"ALTER TABLE {keyspace}.{table} WITH memtable_flush_period_in_ms = {int(period_ms)}")


def settle(session: Session, keyspace: str, table: str, directories: list[Path], *, quiet_s: float = 10.0,
           timeout_s: float = 600.0, flush: bool = True) -> tuple[float, bool]:
    """Flush the table's memtable (if `flush`), then wait until nothing has been written
    to its directory and no compaction of it has run for `quiet_s` in a row, at most
    `timeout_s`. The seconds it took, and whether it settled (False: timed out).

    Without the table's directory (a remote node) only the compaction tasks are watched."""
    started = time.monotonic()
    if flush:
        set_flush_period(session, keyspace, table, FLUSH_PERIOD_MS)
    try:
        quiet_since: float | None = None
        last: tuple[int, int, int] | None = None
        if flush:
            time.sleep(2 * FLUSH_PERIOD_MS / 1000)
        while (now := time.monotonic()) - started < timeout_s:
            current = usage(directories)
            # A compaction that ended between two looks shows in the history, if nowhere else.
            state = (current.sstables, current.bytes, compacted(session, keyspace, table).compactions)
            busy = running_compactions(session, keyspace, table) > 0 or current.writing > 0 or state != last
            last = state
            if busy:
                quiet_since = None
            elif quiet_since is None:
                quiet_since = now
            elif now - quiet_since >= quiet_s:
                return now - started - quiet_s, True
            time.sleep(1.0)
        return time.monotonic() - started, False
    finally:
        if flush:
            set_flush_period(session, keyspace, table, 0)


@dataclass(frozen=True)
class Compacted:
    """What the node's compactions of a table read and wrote since some moment."""

    compactions: int
    bytes_in: int
    bytes_out: int

    def as_dict(self) -> dict[str, int]:
        return {"compactions": self.compactions, "bytes_in": self.bytes_in, "bytes_out": self.bytes_out}


def compacted(session: Session, keyspace: str, table: str, since: datetime | None = None) -> Compacted:
    """`system.compaction_history` of the table, from `since` (UTC) on."""
    rows: list[Any] = list(session.execute(
        "SELECT columnfamily_name, compacted_at, bytes_in, bytes_out FROM system.compaction_history "
        "WHERE keyspace_name = %s ALLOW FILTERING", (keyspace,)))
    count = bytes_in = bytes_out = 0
    for row in rows:
        at = row.compacted_at.replace(tzinfo=timezone.utc) if row.compacted_at is not None else None
        if row.columnfamily_name != table or (since is not None and at is not None and at < since):
            continue
        count += 1
        bytes_in += row.bytes_in or 0
        bytes_out += row.bytes_out or 0
    return Compacted(count, bytes_in, bytes_out)
