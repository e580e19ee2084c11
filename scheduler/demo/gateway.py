"""The demo's SMS provider: a SQLite file that every worker process shares.

Like a real SMS API with idempotency keys, it sends a key at most once: a request
whose key it has seen is acknowledged and counted as absorbed, not sent again. So a
batch that a worker re-runs after a crash costs the recipients nothing. Numbers in
`UNREACHABLE` fail every time with a transient error, as a provider's upstream
outage would, so the demo's one doomed task exhausts its retries.

It also notes when each handler started, for the demo's lateness figures.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

UNREACHABLE = "+910000000000"
SEND_LATENCY_S = 0.001
"""What the fake provider takes per message, so a batch of 500 takes half a second."""


class GatewayError(Exception):
    """The provider could not deliver; worth retrying later."""


class Sms(NamedTuple):
    key: str
    """The idempotency key: the same for every attempt of the same message."""
    tenant: str
    to: str
    text: str


class Start(NamedTuple):
    task: str
    attempt: int
    tenant: str
    type: str
    run_at_ms: int
    started_ms: int
    pid: int


class Totals(NamedTuple):
    sent: int
    absorbed: int
    rejected: int


SCHEMA = (
    "CREATE TABLE IF NOT EXISTS sent (key TEXT PRIMARY KEY, tenant TEXT NOT NULL, recipient TEXT NOT NULL, "
    "body TEXT NOT NULL, sent_ms INTEGER NOT NULL) WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL) WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS starts (task TEXT NOT NULL, attempt INTEGER NOT NULL, tenant TEXT NOT NULL, "
    "type TEXT NOT NULL, run_at_ms INTEGER NOT NULL, started_ms INTEGER NOT NULL, pid INTEGER NOT NULL)",
)


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class Gateway:
    """One per process; each thread gets its own connection (a shared one would let one
    thread's rollback undo another's sends)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._local = threading.local()
        self._connections: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        for statement in SCHEMA:
            self._db.execute(statement)

    @property
    def _db(self) -> sqlite3.Connection:
        db: sqlite3.Connection | None = getattr(self._local, "db", None)
        if db is None:
            db = sqlite3.connect(self.path, timeout=30, isolation_level=None, check_same_thread=False)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            self._local.db = db
            with self._lock:
                self._connections.append(db)
        return db

    def send(self, messages: Sequence[Sms]) -> int:
        """Send each message whose key is new; returns how many were absorbed as repeats.
        Raises `GatewayError`, having sent nothing of the request, if a number is unreachable."""
        if any(message.to == UNREACHABLE for message in messages):
            self._count("rejected", 1)
            raise GatewayError(f"provider: {UNREACHABLE} unreachable (carrier timeout)")
        time.sleep(SEND_LATENCY_S * len(messages))
        sent_ms = now_ms()
        with self._db:
            self._db.execute("BEGIN IMMEDIATE")
            before = self._db.total_changes
            self._db.executemany("INSERT OR IGNORE INTO sent VALUES (?, ?, ?, ?, ?)",
                                 [(m.key, m.tenant, m.to, m.text, sent_ms) for m in messages])
            absorbed = len(messages) - (self._db.total_changes - before)
            if absorbed:
                self._add("absorbed", absorbed)
        return absorbed

    def note_start(self, start: Start) -> None:
        self._db.execute("INSERT INTO starts VALUES (?, ?, ?, ?, ?, ?, ?)", start)

    def totals(self) -> Totals:
        counters = dict(self._db.execute("SELECT name, value FROM counters"))
        (sent,) = self._db.execute("SELECT count(*) FROM sent").fetchone()
        return Totals(sent, counters.get("absorbed", 0), counters.get("rejected", 0))

    def sent_by_tenant(self) -> dict[str, int]:
        return dict(self._db.execute("SELECT tenant, count(*) FROM sent GROUP BY tenant"))

    def sent_per_task(self) -> dict[str, int]:
        """SMS sent per task (a key is `<task id>:<effect>`)."""
        return dict(self._db.execute("SELECT substr(key, 1, instr(key, ':') - 1), count(*) FROM sent GROUP BY 1"))

    def sent_times(self, tenant: str) -> list[int]:
        """When each of the tenant's SMS was sent (ms), in order."""
        return [at for (at,) in self._db.execute("SELECT sent_ms FROM sent WHERE tenant = ? ORDER BY sent_ms",
                                                 (tenant,))]

    def sent_keys(self) -> set[str]:
        return {key for (key,) in self._db.execute("SELECT key FROM sent")}

    def starts(self) -> list[Start]:
        return [Start(*row) for row in self._db.execute("SELECT * FROM starts ORDER BY started_ms")]

    def close(self) -> None:
        with self._lock:
            for db in self._connections:
                db.close()
            self._connections.clear()

    def _count(self, name: str, by: int) -> None:
        with self._db:
            self._add(name, by)

    def _add(self, name: str, by: int) -> None:
        self._db.execute("INSERT INTO counters VALUES (?, ?) ON CONFLICT(name) DO UPDATE SET value = value + ?",
                         (name, by, by))
