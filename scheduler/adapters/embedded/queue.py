"""`SqliteQueue`: the embedded backend's log, one SQLite file shared by the processes of
one machine, with Kafka's shape: topics of partitions of messages at dense offsets, and
committed positions per (group, topic, partition).

    messages  (topic, partition, offset) -> value, published_at_ms
    positions (group, topic, partition)  -> next_offset

Example: three values published to `scheduler.ready.high`, then one hand-off record
for shard 5, then a dispatcher commits having handled it:

    messages  ('scheduler.ready.high', 0, 0..2)  ('scheduler.handoff', 5, 0)
    positions ('dispatchers', 'scheduler.handoff', 5) -> 1

It offers what the dispatcher needs: a `Publisher` of the ready topics, which puts every
message in partition 0 (one ordered log per topic), and the hand-off log, whose
partition is the shard, with its `HandoffReader`. `read` returns a whole topic, for
tests and the demo.

Durability: every write is one `BEGIN IMMEDIATE` transaction committed with
`synchronous=FULL` (the WAL is fsynced before it returns). `BEGIN IMMEDIATE` takes the
write lock first, so the next offset read inside it cannot be taken by another
process: offsets stay dense. A writer waits up to `busy_timeout_s` (a publisher's
flush, up to its `timeout_s`) for another process's write.

Failures: every method raises `QueueError` when SQLite fails (a file it cannot open,
a lock not obtained in time, a full disk); a failed write changes nothing.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from scheduler.adapters.embedded.sqlite import immediate
from scheduler.errors import QueueError
from scheduler.model import check_shard_count
from scheduler.ports import HandoffLog, HandoffReader, HandoffRecord, Publisher
from scheduler.settings import KafkaSettings

SCHEMA = """
CREATE TABLE IF NOT EXISTS messages (
    topic           TEXT    NOT NULL,
    "partition"     INTEGER NOT NULL,
    "offset"        INTEGER NOT NULL,
    value           BLOB    NOT NULL,
    published_at_ms INTEGER NOT NULL,
    PRIMARY KEY (topic, "partition", "offset")
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS positions (
    "group"     TEXT    NOT NULL,
    topic       TEXT    NOT NULL,
    "partition" INTEGER NOT NULL,
    next_offset INTEGER NOT NULL,
    PRIMARY KEY ("group", topic, "partition")
) WITHOUT ROWID;
"""

_NEXT_OFFSET = 'SELECT COALESCE(MAX("offset") + 1, 0) FROM messages WHERE topic = ? AND "partition" = ?'
_INSERT = 'INSERT INTO messages (topic, "partition", "offset", value, published_at_ms) VALUES (?, ?, ?, ?, ?)'
_COMMIT = """
INSERT INTO positions ("group", topic, "partition", next_offset) VALUES (?, ?, ?, ?)
ON CONFLICT DO UPDATE SET next_offset = excluded.next_offset
"""
_POSITION = 'SELECT next_offset FROM positions WHERE "group" = ? AND topic = ? AND "partition" = ?'
_FROM = (
    'SELECT "offset", value FROM messages WHERE topic = ? AND "partition" = ? AND "offset" >= ? '
    'ORDER BY "offset" LIMIT ?'
)

READY_PARTITION = 0
"""The partition of every message a publisher writes."""

POLL_INTERVAL_S = 0.02
"""How often a waiting reader looks for records appended by another process (appends
from this process wake it at once)."""


class SqliteQueue:
    """The embedded log; see the module docstring. Thread-safe: one connection under a lock."""

    def __init__(
        self,
        path: str | Path,
        *,
        handoff_topic: str = KafkaSettings().handoff_topic,
        busy_timeout_s: float = 30.0,
    ) -> None:
        if str(path) != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        self.path = str(path)
        self.handoff_topic = handoff_topic
        self._busy_timeout_s = busy_timeout_s
        self._lock = threading.Lock()
        self._appended = threading.Condition()
        try:
            self._db = sqlite3.connect(self.path, timeout=busy_timeout_s, isolation_level=None,
                                       check_same_thread=False)
            for pragma in ("journal_mode=WAL", "synchronous=FULL"):
                self._db.execute(f"PRAGMA {pragma}")
            with self._transaction() as db:
                for statement in SCHEMA.split(";"):
                    if statement.strip():
                        db.execute(statement)
        except (sqlite3.Error, QueueError) as exc:
            raise QueueError(f"cannot open the embedded queue at {path}: {exc}") from exc

    def publisher(self) -> Publisher:
        return SqlitePublisher(self)

    def handoff_log(self, shard_count: int) -> HandoffLog:
        return SqliteHandoffLog(self, shard_count)

    def handoff_reader(self, group: str = "dispatchers") -> HandoffReader:
        return SqliteHandoffReader(self, group)

    def read(self, topic: str) -> list[bytes]:
        """Every value in `topic`, partition by partition, in offset order."""
        rows = self._read('SELECT value FROM messages WHERE topic = ? ORDER BY "partition", "offset"', (topic,))
        return [bytes(value) for (value,) in rows]

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # Operations for the publisher, the hand-off log and its readers.

    def write(self, batches: Iterable[tuple[str, int, Sequence[bytes]]], *, timeout_s: float | None = None) -> None:
        """Append each `(topic, partition, values)` batch at the end of its partition, in
        order, all in one transaction."""
        now_ms = time.time_ns() // 1_000_000
        with self._transaction(timeout_s) as db:
            for topic, partition, values in batches:
                (first,) = db.execute(_NEXT_OFFSET, (topic, partition)).fetchone()
                db.executemany(
                    _INSERT, ((topic, partition, first + n, value, now_ms) for n, value in enumerate(values))
                )
        with self._appended:
            self._appended.notify_all()

    def read_from(self, topic: str, partition: int, offset: int, limit: int) -> list[tuple[int, bytes]]:
        """Up to `limit` (offset, value) pairs of the partition from `offset` on."""
        rows = self._read(_FROM, (topic, partition, offset, limit))
        return [(int(at), bytes(value)) for at, value in rows]

    def position(self, group: str, topic: str, partition: int) -> int | None:
        rows = self._read(_POSITION, (group, topic, partition))
        return int(rows[0][0]) if rows else None

    def commit(self, group: str, topic: str, positions: Mapping[int, int]) -> None:
        with self._transaction() as db:
            db.executemany(_COMMIT, ((group, topic, partition, offset) for partition, offset in positions.items()))

    def wait_for_append(self, timeout_s: float) -> None:
        """Return when this process appends, or after `timeout_s` (capped at the poll
        interval, since other processes' appends wake nobody)."""
        with self._appended:
            self._appended.wait(min(timeout_s, POLL_INTERVAL_S))

    @contextmanager
    def _transaction(self, timeout_s: float | None = None) -> Iterator[sqlite3.Connection]:
        """One write transaction, taking the write lock at once (BEGIN IMMEDIATE); it
        waits up to `timeout_s` (default: `busy_timeout_s`) for another process's."""
        with self._lock:
            try:
                busy_ms = int(1000 * (self._busy_timeout_s if timeout_s is None else timeout_s))
                self._db.execute(f"PRAGMA busy_timeout = {busy_ms}")
                with immediate(self._db) as transaction:
                    yield transaction
            except sqlite3.Error as exc:
                raise QueueError(f"embedded queue at {self.path} failed: {exc}") from exc

    def _read(self, sql: str, parameters: Sequence[object]) -> list[Any]:
        with self._lock:
            try:
                return self._db.execute(sql, parameters).fetchall()
            except sqlite3.Error as exc:
                raise QueueError(f"embedded queue at {self.path} failed: {exc}") from exc


class SqlitePublisher:
    """The `Publisher` of the embedded queue: `publish` keeps values in memory, `flush`
    writes them all in one transaction. A failed flush drops them: the caller publishes
    again what it cannot prove stored. One thread at a time."""

    def __init__(self, queue: SqliteQueue) -> None:
        self._queue = queue
        self._buffer: dict[str, list[bytes]] = {}

    def publish(self, topic: str, values: Sequence[bytes]) -> None:
        self._buffer.setdefault(topic, []).extend(values)

    def flush(self, timeout_s: float) -> None:
        buffer, self._buffer = self._buffer, {}
        if buffer:
            self._queue.write([(topic, READY_PARTITION, values) for topic, values in buffer.items()],
                              timeout_s=timeout_s)

    def close(self) -> None:
        self._buffer = {}


class SqliteHandoffLog:
    """The `HandoffLog` of the embedded queue: partition = shard."""

    def __init__(self, queue: SqliteQueue, shard_count: int) -> None:
        self._queue = queue
        self.shard_count = check_shard_count(shard_count)

    def append(self, batches: Sequence[tuple[int, Sequence[bytes]]]) -> None:
        for shard, _values in batches:
            if not 0 <= shard < self.shard_count:
                raise ValueError(f"shard {shard} is outside 0..{self.shard_count - 1}")
        topic = self._queue.handoff_topic
        if any(values for _shard, values in batches):
            self._queue.write([(topic, shard, values) for shard, values in batches if values])

    def close(self) -> None:
        pass


class SqliteHandoffReader:
    """The `HandoffReader` of the embedded queue: positions live in memory between
    `assign` and `unassign` and are committed to the `positions` table under `group`.
    One thread at a time."""

    def __init__(self, queue: SqliteQueue, group: str) -> None:
        self._queue = queue
        self.group = group
        self._topic = queue.handoff_topic
        self._positions: dict[int, int] = {}
        """Assigned shards and the offset of the next record to return."""
        self._start = 0

    def assign(self, shard: int) -> None:
        """Start reading the shard's partition from its committed position (assigning a
        shard already assigned changes nothing)."""
        if shard < 0:
            raise ValueError(f"shard {shard} is negative")
        if shard not in self._positions:
            self._positions[shard] = self._queue.position(self.group, self._topic, shard) or 0

    def unassign(self, shard: int) -> None:
        self._positions.pop(shard, None)

    @property
    def assigned(self) -> frozenset[int]:
        return frozenset(self._positions)

    def poll(self, max_records: int, timeout_s: float) -> list[HandoffRecord]:
        if max_records < 1:
            raise ValueError(f"max_records must be positive, got {max_records}")
        deadline = time.monotonic() + timeout_s
        while True:
            records = self._read(max_records)
            left = deadline - time.monotonic()
            if records or left <= 0:
                return records
            self._queue.wait_for_append(left)

    def _read(self, max_records: int) -> list[HandoffRecord]:
        """What is there, shard by shard, starting with a different shard each time so
        that a busy shard cannot starve the others."""
        shards = sorted(self._positions)
        if not shards:
            return []
        self._start = (self._start + 1) % len(shards)
        records: list[HandoffRecord] = []
        for shard in shards[self._start:] + shards[:self._start]:
            if len(records) >= max_records:
                break
            rows = self._queue.read_from(self._topic, shard, self._positions[shard], max_records - len(records))
            records += (HandoffRecord(shard, offset, value) for offset, value in rows)
            if rows:
                self._positions[shard] = rows[-1][0] + 1
        return records

    def commit(self, positions: Mapping[int, int]) -> None:
        if positions:
            self._queue.commit(self.group, self._topic, positions)

    def close(self) -> None:
        self._positions.clear()
