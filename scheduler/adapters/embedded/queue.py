"""`SqliteQueue`: the embedded backend's log, one SQLite file shared by the processes of
one machine, with Kafka's shape: topics of partitions of messages at dense offsets,
committed positions per (group, topic, partition), and consumer groups.

    messages  (topic, partition, offset) -> value, published_at_ms (or the publisher's stamp)
    positions (group, topic, partition)  -> next_offset
    members   (group, member)            -> topics, expires_ms
    owners    (group, topic, partition)  -> member (NULL: free), generation

Example: three values published to `scheduler.ready.high` by a new publisher, then one
hand-off record for shard 5, then a dispatcher commits having handled it:

    messages  ('scheduler.ready.high', 0..2, 0)  ('scheduler.handoff', 5, 0)
    positions ('dispatchers', 'scheduler.handoff', 5) -> 1

It offers what the dispatcher needs: a `Publisher`, and the hand-off log, whose
partition is the shard, with its `HandoffReader`. `read` returns a whole topic, for
tests and the demo; `scanner` does the same as a `TopicScanner`.

Partitions of the ready topics: each has `ready_partitions` (`READY_PARTITIONS`, 8, as
`ensure_topics` makes them on Kafka), so that the members of a worker pool's group share a priority.
Kafka's publisher sends keyless messages, and librdkafka's sticky partitioner fills one
batch per partition before moving to the next, because a broker request costs per
batch. Here a flush is one transaction whatever partitions it touches, so stickiness
buys nothing; the publisher deals each topic's messages round-robin over its
partitions instead, carrying on from where its previous flush stopped, so that every
partition (and so every member) gets an even share even of a small burst. Messages
are not keyed by task: the publisher sees encoded bytes, and nothing downstream needs
the copies of one task in one partition (on Kafka they are not either). Order holds
within a partition only, as on Kafka. Any other topic a publisher writes (the
dead-letter topic: read whole, by no group) keeps partition 0, so its letters keep
their names (`partition:offset`) and their order.

Files written before ready topics had partitions need nothing done: their messages,
positions and owners of partition 0 stay valid; partition 0 takes new messages like
the others, and the group rule below deals every partition that has messages, so what
was waiting in partition 0 is still consumed, from its committed position. A consumer
of that older version deals the new partitions too (its rule never assumed one).

Consumer groups (`consumer`, the workers' `Consumer`) emulate Kafka's across the
processes sharing the file. A member is live while its `expires_ms` (its last heartbeat
plus its session timeout, on the wall clock: the only clock the processes share) is
ahead of the clock; it heartbeats from `poll`, at most every `REBALANCE_INTERVAL_S`, and
in the same transaction it
- deletes the members that expired, and frees (member NULL) every partition held by a
  member that is no longer in `members`;
- computes the group's rule: every partition that has messages, of any topic a live
  member subscribes to, sorted by (topic, partition), is dealt round-robin to the live
  members subscribed to its topic, in sorted order of their names. Every member
  computes the same answer from the same rows; the rule is not sticky (a member joining
  or leaving may move partitions that stay with live members);
- takes each free partition that the rule gives it, raising the partition's
  `generation`; a partition that another live member holds is never taken: that member
  gives it up in its own next poll (after `on_revoked`), or expires.
A partition held by this member that the rule gives to another is reported to
`on_revoked` and then freed; one whose row no longer shows this member and the
generation it took it with was taken while this member was not polling (it expired):
it leaves the assignment and is reported to `on_revoked` too.

Commit fencing: `commit` writes a position only if, inside its transaction, the owner
row still shows this member and the generation it took the partition with. A member
whose partition was taken (it stopped polling past its session timeout) cannot move the
new owner's position, even if it took the partition back since (the generation differs:
an owner row is freed, never deleted, so generations only grow).
As in Kafka, a commit may move a position backwards: it records what it is given.

Retention: a message is kept `retention_s` after its stamp (`published_at_ms`), consumed
or not: 7 days by default, and 30 for the dead-letter topic, as `ensure_topics` makes
the Kafka topics (`settings.QUEUE_RETENTION_MS`, `DEAD_LETTER_RETENTION_MS`).
`purge_expired` deletes expired messages from the start of each partition, a bounded
number a call, and stops in a partition at its first message not expired (as Kafka
deletes whole segments from the oldest). It never deletes a partition's last message:
offsets are dense from the largest one stored, and the group rule deals the partitions
that have messages, so an emptied partition would start its offsets again at 0, below
every committed position, and its next messages would never be read. A reader whose
position is before the first message kept reads from that message on.

Durability: every write is one `BEGIN IMMEDIATE` transaction committed with
`synchronous=FULL` (the WAL is fsynced before it returns). `BEGIN IMMEDIATE` takes the
write lock first, so the next offset read inside it cannot be taken by another
process: offsets stay dense. A writer waits up to `busy_timeout_s` (a publisher's
flush, up to its `timeout_s`) for another process's write.

Failures: every method raises `QueueError` when SQLite fails (a file it cannot open,
a lock not obtained in time, a full disk); a failed write changes nothing.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from scheduler.adapters.embedded.sqlite import create_tables, immediate, open_db
from scheduler.errors import QueueError
from scheduler.model import check_shard_count
from scheduler.ports import (
    Consumer,
    Delivery,
    HandoffLog,
    HandoffReader,
    HandoffRecord,
    Publisher,
    TopicPartition,
    TopicScanner,
)
from scheduler.settings import (
    DEAD_LETTER_RETENTION_MS,
    QUEUE_RETENTION_MS,
    READY_PARTITIONS,
    READY_TOPICS,
    KafkaSettings,
)

log = logging.getLogger(__name__)

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
CREATE TABLE IF NOT EXISTS members (
    "group"    TEXT    NOT NULL,
    member     TEXT    NOT NULL,
    topics     TEXT    NOT NULL,
    expires_ms INTEGER NOT NULL,
    PRIMARY KEY ("group", member)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS owners (
    "group"     TEXT    NOT NULL,
    topic       TEXT    NOT NULL,
    "partition" INTEGER NOT NULL,
    member      TEXT,
    generation  INTEGER NOT NULL,
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
_FROM_WITH_TIME = (
    'SELECT "offset", value, published_at_ms FROM messages WHERE topic = ? AND "partition" = ? AND "offset" >= ? '
    'ORDER BY "offset" LIMIT ?'
)
_SCAN = (
    'SELECT "partition", "offset", value, published_at_ms FROM messages WHERE topic = ? '
    'ORDER BY "partition", "offset" LIMIT ?'
)
_NEXT_PARTITION = 'SELECT MIN("partition") FROM messages WHERE topic = ? AND "partition" > ?'
_NEXT_TOPIC = "SELECT MIN(topic) FROM messages WHERE topic > ?"
_OLDEST = (
    'SELECT "offset", published_at_ms FROM messages WHERE topic = ? AND "partition" = ? '
    'ORDER BY "offset" LIMIT ?'
)
_DELETE_BEFORE = 'DELETE FROM messages WHERE topic = ? AND "partition" = ? AND "offset" < ?'
_HEARTBEAT = """
INSERT INTO members ("group", member, topics, expires_ms) VALUES (?, ?, ?, ?)
ON CONFLICT DO UPDATE SET topics = excluded.topics, expires_ms = excluded.expires_ms
"""
_EXPIRE = 'DELETE FROM members WHERE "group" = ? AND expires_ms <= ?'
_FREE_ORPHANS = """
UPDATE owners SET member = NULL
WHERE "group" = ? AND member IS NOT NULL AND member NOT IN (SELECT member FROM members WHERE "group" = ?)
"""
_MEMBERS = 'SELECT member, topics FROM members WHERE "group" = ? ORDER BY member'
_OWNERS = 'SELECT topic, "partition", member, generation FROM owners WHERE "group" = ?'
_OWNER = 'SELECT member, generation FROM owners WHERE "group" = ? AND topic = ? AND "partition" = ?'
_TAKE = """
INSERT INTO owners ("group", topic, "partition", member, generation) VALUES (?, ?, ?, ?, ?)
ON CONFLICT DO UPDATE SET member = excluded.member, generation = excluded.generation
"""
_FREE = (
    'UPDATE owners SET member = NULL '
    'WHERE "group" = ? AND topic = ? AND "partition" = ? AND member = ? AND generation = ?'
)
_LEAVE_OWNERS = 'UPDATE owners SET member = NULL WHERE "group" = ? AND member = ?'
_LEAVE = 'DELETE FROM members WHERE "group" = ? AND member = ?'

OTHER_PARTITION = 0
"""The partition of every message a publisher writes to a topic that is not a ready topic."""

_READY_SUFFIXES = tuple(f".ready.{name}" for name in READY_TOPICS)

POLL_INTERVAL_S = 0.02
"""How often a waiting reader looks for records appended by another process (appends
from this process wake it at once)."""

RETENTION_S = QUEUE_RETENTION_MS // 1000
"""How long a message is kept after its stamp, as on the Kafka topics (see the module docstring)."""
DEAD_LETTER_RETENTION_S = DEAD_LETTER_RETENTION_MS // 1000

REBALANCE_INTERVAL_S = 0.2
"""How often a polling consumer heartbeats and applies the group's rule (more often
with a session timeout under four times this)."""


class SqliteQueue:
    """The embedded log; see the module docstring. Thread-safe: one connection under a lock."""

    def __init__(
        self,
        path: str | Path,
        *,
        handoff_topic: str = KafkaSettings().handoff_topic,
        ready_partitions: int = READY_PARTITIONS,
        busy_timeout_s: float = 30.0,
        retention_s: int = RETENTION_S,
        dead_letter_topic: str = KafkaSettings().dead_letter_topic,
        dead_letter_retention_s: int = DEAD_LETTER_RETENTION_S,
    ) -> None:
        if ready_partitions < 1:
            raise ValueError(f"ready topics need at least one partition, got {ready_partitions}")
        if retention_s < 1 or dead_letter_retention_s < 1:
            raise ValueError(f"retentions must be positive, got {retention_s} and {dead_letter_retention_s}")
        self.retention_s = retention_s
        self.dead_letter_topic = dead_letter_topic
        self.dead_letter_retention_s = dead_letter_retention_s
        self.path = str(path)
        self.handoff_topic = handoff_topic
        self.ready_partitions = ready_partitions
        self._busy_timeout_s = busy_timeout_s
        self._lock = threading.Lock()
        self._appended = threading.Condition()
        try:
            self._db = open_db(path, busy_timeout_s=busy_timeout_s, pragmas=("journal_mode=WAL", "synchronous=FULL"))
            with self._transaction() as db:
                create_tables(db, SCHEMA)
        except (sqlite3.Error, QueueError) as exc:
            raise QueueError(f"cannot open the embedded queue at {path}: {exc}") from exc

    def publisher(self) -> Publisher:
        return SqlitePublisher(self)

    def partitions_of(self, topic: str) -> int:
        """How many partitions the publisher spreads `topic` over: `ready_partitions` for a
        ready topic (a name ending `.ready.<priority>`, whatever the prefix), else 1."""
        return self.ready_partitions if topic.endswith(_READY_SUFFIXES) else 1

    def handoff_log(self, shard_count: int) -> HandoffLog:
        return SqliteHandoffLog(self, shard_count)

    def handoff_reader(self, group: str = "dispatchers") -> HandoffReader:
        return SqliteHandoffReader(self, group)

    def consumer(
        self,
        group: str,
        topics: Sequence[str],
        *,
        member: str,
        on_revoked: Callable[[list[TopicPartition]], None] | None = None,
        session_timeout_s: float = 10.0,
    ) -> Consumer:
        """A member of consumer group `group` reading `topics`; see the module docstring.
        `member` must be unique among the group's live members."""
        return SqliteConsumer(self, group, topics, member=member, on_revoked=on_revoked,
                              session_timeout_s=session_timeout_s)

    def scanner(self) -> TopicScanner:
        return SqliteScanner(self)

    def read(self, topic: str) -> list[bytes]:
        """Every value in `topic`, partition by partition, in offset order."""
        rows = self._read('SELECT value FROM messages WHERE topic = ? ORDER BY "partition", "offset"', (topic,))
        return [bytes(value) for (value,) in rows]

    def purge_expired(self, now_ms: int, limit: int) -> int:
        """Delete up to `limit` messages stamped more than `retention_s` before `now_ms`
        (Kafka's rule), oldest first in each partition (see the module docstring); return
        how many. One short transaction: a seek or two per partition, and at most `limit`
        messages read besides."""
        if limit < 1:
            raise ValueError(f"limit must be positive, got {limit}")
        removed = 0
        with self._transaction() as db:
            topic: str | None = ""
            while removed < limit and (topic := db.execute(_NEXT_TOPIC, (topic,)).fetchone()[0]) is not None:
                kept_s = self.dead_letter_retention_s if topic == self.dead_letter_topic else self.retention_s
                for partition in _partitions(db, topic):
                    if removed >= limit:
                        break
                    removed += _purge_partition(db, topic, partition, now_ms - kept_s * 1000, limit - removed)
        return removed

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # Operations for the publisher, the hand-off log and its readers.

    def write(self, batches: Iterable[tuple[str, int, Sequence[bytes]]], *, timeout_s: float | None = None,
              stamps: Sequence[int | None] | None = None) -> None:
        """Append each `(topic, partition, values)` batch at the end of its partition, in
        order, all in one transaction; stamped now, or with the batch's `stamps` entry."""
        now_ms = time.time_ns() // 1_000_000
        with self._transaction(timeout_s) as db:
            for index, (topic, partition, values) in enumerate(batches):
                stamp = stamps[index] if stamps is not None else None
                at_ms = now_ms if stamp is None else stamp
                (first,) = db.execute(_NEXT_OFFSET, (topic, partition)).fetchone()
                db.executemany(
                    _INSERT, ((topic, partition, first + n, value, at_ms) for n, value in enumerate(values))
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

    def lag(self, groups: Mapping[str, Sequence[str]]) -> dict[str, int]:
        """Topic -> messages its group (`groups`: group -> its topics) has not committed
        past, as `scheduler.adapters.kafka.lag.consumer_lag` answers for Kafka."""
        lag: dict[str, int] = {}
        for group, topics in groups.items():
            for topic in topics:
                rows = self._read(
                    'SELECT COUNT(*) FROM messages m LEFT JOIN positions p ON p."group" = ? AND p.topic = m.topic '
                    'AND p."partition" = m."partition" WHERE m.topic = ? AND m."offset" >= coalesce(p.next_offset, 0)',
                    (group, topic))
                if rows and rows[0][0]:
                    lag[topic] = int(rows[0][0])
        return lag

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
    writes them all in one transaction, a ready topic's values dealt round-robin over
    its partitions (see the module docstring). A failed flush drops them: the caller
    publishes again what it cannot prove stored. One thread at a time.

    Example, 8 partitions: a flush of 3 values of `scheduler.ready.normal` puts them in
    partitions 0, 1, 2; the next flush's 10 values go to 3..7, then 0..4; the next
    flush starts at 5."""

    def __init__(self, queue: SqliteQueue) -> None:
        self._queue = queue
        self._buffer: dict[tuple[str, int | None], list[bytes]] = {}
        self._turn: dict[str, int] = {}
        """Per topic: the partition that its next value goes to."""

    def publish(self, topic: str, values: Sequence[bytes], timestamp_ms: int | None = None) -> None:
        self._buffer.setdefault((topic, timestamp_ms), []).extend(values)

    def flush(self, timeout_s: float) -> None:
        buffer, self._buffer = self._buffer, {}
        if not buffer:
            return
        batches: list[tuple[str, int, Sequence[bytes]]] = []
        stamps: list[int | None] = []
        turns = dict(self._turn)
        for (topic, stamp), values in buffer.items():
            count = self._queue.partitions_of(topic)
            if count == 1:
                batches.append((topic, OTHER_PARTITION, values))
                stamps.append(stamp)
                continue
            first = turns.get(topic, 0)
            for n in range(min(count, len(values))):
                partition = (first + n) % count
                batches.append((topic, partition, values[n::count]))
                stamps.append(stamp)
            turns[topic] = (first + len(values)) % count
        self._queue.write(batches, timeout_s=timeout_s, stamps=stamps)
        self._turn = turns  # only once stored: a failed flush's values, published again, are dealt the same

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
        moved: dict[int, int] = {}
        for shard in shards[self._start:] + shards[:self._start]:
            if len(records) >= max_records:
                break
            rows = self._queue._read(_FROM_WITH_TIME, (self._topic, shard, self._positions[shard],
                                                       max_records - len(records)))
            records += (HandoffRecord(shard, int(offset), bytes(value), int(stamp)) for offset, value, stamp in rows)
            if rows:
                moved[shard] = int(rows[-1][0]) + 1
        # Only now, with every read done: a read that fails part-way moves no position, so
        # the records read before it are returned by the next poll, never skipped.
        self._positions.update(moved)
        return records

    def commit(self, positions: Mapping[int, int]) -> None:
        if positions:
            self._queue.commit(self.group, self._topic, positions)

    def close(self) -> None:
        self._positions.clear()


class SqliteConsumer:
    """The `Consumer` of the embedded queue: one member of a consumer group; see the
    module docstring for the group's rule and commit fencing. Partitions held live in
    memory with the generation they were taken with and the offset of the next message
    to return, which starts at the group's committed position (0 if none). One thread
    at a time."""

    def __init__(
        self,
        queue: SqliteQueue,
        group: str,
        topics: Sequence[str],
        *,
        member: str,
        on_revoked: Callable[[list[TopicPartition]], None] | None = None,
        session_timeout_s: float = 10.0,
    ) -> None:
        if not topics:
            raise ValueError("a consumer needs at least one topic")
        if any("\n" in topic for topic in topics):
            raise ValueError(f"topic names cannot hold a line break: {list(topics)}")
        if session_timeout_s <= 0:
            raise ValueError(f"the session timeout must be positive, got {session_timeout_s}")
        self._queue = queue
        self.group = group
        self.member = member
        self._topics = sorted(set(topics))
        self._on_revoked = on_revoked
        self._session_ms = int(session_timeout_s * 1000)
        self._rebalance_every_s = min(REBALANCE_INTERVAL_S, session_timeout_s / 4)
        self._next_rebalance = 0.0
        """`time.monotonic()` of the next heartbeat; the first poll joins at once."""
        self._generations: dict[TopicPartition, int] = {}
        """Partitions held, with the generation each was taken with."""
        self._next: dict[TopicPartition, int] = {}
        """Offset of the next message to return, per partition held."""
        self._paused: set[str] = set()
        self._start = 0
        self._closed = False

    def poll(self, max_records: int, timeout_s: float) -> list[Delivery]:
        if max_records < 1:
            raise ValueError(f"max_records must be positive, got {max_records}")
        self._check_open()
        deadline = time.monotonic() + timeout_s
        while True:
            if time.monotonic() >= self._next_rebalance:
                self._rebalance()
            deliveries = self._read(max_records)
            left = deadline - time.monotonic()
            if deliveries or left <= 0:
                return deliveries
            self._queue.wait_for_append(left)

    def pause(self, topics: Sequence[str]) -> None:
        self._paused.update(topics)

    def resume(self, topics: Sequence[str]) -> None:
        self._paused.difference_update(topics)

    def assignment(self) -> set[TopicPartition]:
        return set(self._generations)

    def lag(self) -> dict[TopicPartition, int]:
        """One index seek per partition held (the end of its log)."""
        self._check_open()
        lag: dict[TopicPartition, int] = {}
        for tp, position in list(self._next.items()):
            (end,) = self._queue._read(_NEXT_OFFSET, tp)[0]
            lag[tp] = max(int(end) - position, 0)
        return lag

    def commit(self, positions: Mapping[TopicPartition, int]) -> None:
        self._check_open()
        held = {tp: offset for tp, offset in positions.items() if tp in self._generations}
        if not held:
            return
        dropped: list[TopicPartition] = []
        with self._queue._transaction() as db:
            for (topic, partition), offset in held.items():
                if db.execute(_OWNER, (self.group, topic, partition)).fetchone() == (
                        self.member, self._generations[(topic, partition)]):
                    db.execute(_COMMIT, (self.group, topic, partition, offset))
                else:
                    dropped.append((topic, partition))
        if dropped:
            log.info("commit of %s by %s dropped: another member took them; they will be delivered again",
                     dropped, self.member, extra={"action": "queue.consumer.commit_dropped"})

    def close(self) -> None:
        """Leave the group and free every partition held, at once (no commit, no
        `on_revoked`). The queue itself stays open."""
        if self._closed:
            return
        self._closed = True
        self._generations.clear()
        self._next.clear()
        with self._queue._transaction() as db:
            db.execute(_LEAVE_OWNERS, (self.group, self.member))
            db.execute(_LEAVE, (self.group, self.member))

    def _rebalance(self) -> None:
        """Heartbeat and apply the group's rule: report and drop what was lost, report
        and free what the rule gives to others, then add what was taken."""
        mine, held, taken = self._sync()
        self._next_rebalance = time.monotonic() + self._rebalance_every_s
        lost = [tp for tp, generation in self._generations.items() if held.get(tp) != generation]
        self._forget(lost)
        give_up = [tp for tp in self._generations if tp not in mine]
        try:
            if self._on_revoked is not None and (lost or give_up):
                self._on_revoked(sorted(lost + give_up))
        finally:
            if give_up:
                with self._queue._transaction() as db:
                    for tp in give_up:
                        db.execute(_FREE, (self.group, *tp, self.member, self._generations[tp]))
                self._forget(give_up)
        for tp, (generation, offset) in taken.items():
            self._generations[tp] = generation
            self._next[tp] = offset

    def _sync(self) -> tuple[set[TopicPartition], dict[TopicPartition, int], dict[TopicPartition, tuple[int, int]]]:
        """One transaction: heartbeat, expire the dead, and take the free partitions that
        are this member's share. Returns its share, the partitions whose rows show this
        member (with their generation) and those taken now (generation, start offset)."""
        group, me = self.group, self.member
        now_ms = time.time_ns() // 1_000_000
        with self._queue._transaction() as db:
            db.execute(_HEARTBEAT, (group, me, "\n".join(self._topics), now_ms + self._session_ms))
            db.execute(_EXPIRE, (group, now_ms))
            db.execute(_FREE_ORPHANS, (group, group))
            members = [(name, frozenset(topics.split("\n"))) for name, topics in db.execute(_MEMBERS, (group,))]
            topics = sorted(set().union(*(subscribed for _name, subscribed in members)))
            rule = deal([(topic, partition) for topic in topics for partition in _partitions(db, topic)], members)
            mine = {tp for tp, owner in rule.items() if owner == me}
            held: dict[TopicPartition, int] = {}
            taken: dict[TopicPartition, tuple[int, int]] = {}
            rows = {(topic, partition): (member, generation) for topic, partition, member, generation
                    in db.execute(_OWNERS, (group,))}
            for tp in sorted(mine | {tp for tp, (member, _g) in rows.items() if member == me}):
                member, generation = rows.get(tp, (None, 0))
                if member == me and self._generations.get(tp) == generation:
                    held[tp] = generation  # ours all along (given up after on_revoked if not in `mine`)
                elif tp in mine and member in (None, me):
                    # Free, or left as ours by an earlier life of this member name: take
                    # it afresh, so that the earlier life's commits are fenced off.
                    db.execute(_TAKE, (group, *tp, me, generation + 1))
                    (position,) = db.execute(_POSITION, (group, *tp)).fetchone() or (0,)
                    held[tp] = generation + 1
                    taken[tp] = (generation + 1, int(position))
                elif member == me:
                    db.execute(_FREE, (group, *tp, me, generation))
        return mine, held, taken

    def _forget(self, partitions: Iterable[TopicPartition]) -> None:
        for tp in partitions:
            self._generations.pop(tp, None)
            self._next.pop(tp, None)

    def _read(self, max_records: int) -> list[Delivery]:
        """What is there in the unpaused partitions held, starting with a different one
        each time so that a busy partition cannot starve the others."""
        readable = sorted(tp for tp in self._next if tp[0] not in self._paused)
        if not readable:
            return []
        self._start = (self._start + 1) % len(readable)
        deliveries: list[Delivery] = []
        for topic, partition in readable[self._start:] + readable[:self._start]:
            if len(deliveries) >= max_records:
                break
            rows = self._queue._read(
                _FROM_WITH_TIME, (topic, partition, self._next[(topic, partition)], max_records - len(deliveries))
            )
            deliveries += (Delivery(topic, partition, int(at), bytes(value), int(stamp)) for at, value, stamp in rows)
            if rows:
                self._next[(topic, partition)] = int(rows[-1][0]) + 1
        return deliveries

    def _check_open(self) -> None:
        if self._closed:
            raise QueueError(f"the consumer {self.member} of group {self.group} is closed")


def deal(
    partitions: Sequence[TopicPartition], members: Sequence[tuple[str, frozenset[str]]]
) -> dict[TopicPartition, str]:
    """The group's rule: partitions, in sorted order, dealt round-robin to the members
    (in the order given) subscribed to each one's topic."""
    owners: dict[TopicPartition, str] = {}
    turn = 0
    for tp in sorted(partitions):
        candidates = [name for name, topics in members if tp[0] in topics]
        if candidates:
            owners[tp] = candidates[turn % len(candidates)]
            turn += 1
    return owners


def _partitions(db: sqlite3.Connection, topic: str) -> list[int]:
    """The partitions of `topic` that have messages: one index seek per partition."""
    found: list[int] = []
    while (row := db.execute(_NEXT_PARTITION, (topic, found[-1] if found else -1)).fetchone()) and row[0] is not None:
        found.append(int(row[0]))
    return found


def _purge_partition(db: sqlite3.Connection, topic: str, partition: int, cutoff_ms: int, limit: int) -> int:
    """Delete the partition's first messages stamped before `cutoff_ms`, up to `limit`
    and never its last message (the end of its offsets); how many went."""
    oldest = db.execute(_OLDEST, (topic, partition, limit + 1)).fetchall()
    end = 0
    for offset, stamp in oldest[:-1]:  # the last one read stays: the next one, or the partition's last
        if stamp >= cutoff_ms:
            break
        end = int(offset) + 1
    if end == 0:
        return 0
    return int(db.execute(_DELETE_BEFORE, (topic, partition, end)).rowcount)


class SqliteScanner:
    """The `TopicScanner` of the embedded queue: the messages table, read directly."""

    def __init__(self, queue: SqliteQueue) -> None:
        self._queue = queue

    def scan(self, topic: str, *, limit: int | None = None) -> list[Delivery]:
        """Up to `limit` messages of `topic` in (partition, offset) order."""
        if limit is not None and limit < 0:
            raise ValueError(f"limit must not be negative, got {limit}")
        rows = self._queue._read(_SCAN, (topic, -1 if limit is None else limit))
        return [Delivery(topic, int(partition), int(offset), bytes(value), int(stamp))
                for partition, offset, value, stamp in rows]
