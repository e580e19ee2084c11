"""`SqliteEffectLedger`: the `EffectLedger` port on the embedded backend, table `effects`
in the same SQLite file as the task store.

One row per `(scope, effect_key)`: its owner, its state ('claimed' or 'done') and
`expires_ms`, when a claim runs out or a done record's retention ends. A row whose
`expires_ms` has passed counts as absent. Each operation is one `BEGIN IMMEDIATE`
transaction, so a claim's read and write are one step for every thread and process
using the file:

- `claim`: a live done record is `DONE`; a live claim of the same owner `CLAIMED` (not
  extended); a live claim of another owner `BUSY`; otherwise the row is (re)written as
  the caller's claim until now + `ttl_s`.
- `done`: the row becomes a done record kept for the retention, or the longer `keep_s`
  the caller asks, whoever held the claim (the effect did happen), unless a live done
  record is there already (it keeps its first time and end).
- `release`: deletes the row only if it is the caller's claim, never a done record.

These are the Cassandra ledger's rules (`scheduler.adapters.cassandra.effects`), held to
the same contract suite. Expired rows are deleted now and then, in a claim's
transaction (at most every `PURGE_INTERVAL_S`, `PURGE_ROWS` at a time), so the table
holds about one retention's worth of done records.

Time is the wall clock in milliseconds (processes on one machine share it), injectable
as `clock_ms` for tests. The ledger has its own connection to the file: its calls never
wait for the task store's lock in the same process, and SQLite serialises the writes.
"""

from __future__ import annotations

import math
import sqlite3
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

from scheduler.adapters.embedded.sqlite import create_tables, immediate, locked_transaction, open_db
from scheduler.errors import StoreError
from scheduler.ports import EffectClaim

DEFAULT_RETENTION_S = 7 * 24 * 3600.0
"""How long a done record is kept (then the effect's key may run again)."""

PURGE_INTERVAL_S = 60.0
PURGE_ROWS = 1000

SCHEMA = """
CREATE TABLE IF NOT EXISTS effects (
    scope       TEXT    NOT NULL,
    effect_key  TEXT    NOT NULL,
    owner       TEXT    NOT NULL,
    state       TEXT    NOT NULL,   -- 'claimed' or 'done'
    recorded_ms INTEGER NOT NULL,   -- when it was claimed, then when it was recorded done
    expires_ms  INTEGER NOT NULL,   -- the row counts as absent from this time on
    PRIMARY KEY (scope, effect_key)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS effects_by_expiry ON effects (expires_ms);
"""

_CLAIMED = "claimed"
_DONE = "done"


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


class SqliteEffectLedger:
    """The embedded `EffectLedger`, in the SQLite file at `path` (usually the task
    store's; `":memory:"` for a private, throw-away ledger). Thread-safe."""

    def __init__(
        self,
        path: str | Path,
        *,
        retention_s: float = DEFAULT_RETENTION_S,
        synchronous: str = "FULL",
        busy_timeout_s: float = 30.0,
        clock_ms: Callable[[], int] = wall_clock_ms,
    ) -> None:
        if synchronous not in ("FULL", "NORMAL"):
            raise ValueError(f"synchronous must be FULL or NORMAL, got {synchronous!r}")
        self._retention_ms = _duration_ms(retention_s, "retention_s")
        self._clock_ms = clock_ms
        self._lock = threading.Lock()
        self._next_purge_ms = 0
        try:
            self._db = open_db(path, busy_timeout_s=busy_timeout_s,
                               pragmas=("journal_mode=WAL", f"synchronous={synchronous}"))
            with immediate(self._db) as db:
                create_tables(db, SCHEMA)
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open the effect ledger at {path}: {exc}") from exc
        self.path = str(path)

    def _transaction(self) -> AbstractContextManager[sqlite3.Connection]:
        return locked_transaction(self._lock, self._db, "effect ledger")

    def claim(self, scope: str, key: str, owner: str, ttl_s: float) -> EffectClaim:
        _check_names(scope, key, owner)
        ttl_ms = _duration_ms(ttl_s, "ttl_s")
        with self._transaction() as db:
            now = self._clock_ms()
            row = db.execute(
                "SELECT owner, state FROM effects WHERE scope = ? AND effect_key = ? AND expires_ms > ?",
                (scope, key, now),
            ).fetchone()
            if row is not None:
                holder, state = row
                if state == _DONE:
                    return EffectClaim.DONE
                return EffectClaim.CLAIMED if holder == owner else EffectClaim.BUSY
            db.execute(
                "INSERT OR REPLACE INTO effects (scope, effect_key, owner, state, recorded_ms, expires_ms) "
                "VALUES (?, ?, ?, 'claimed', ?, ?)",
                (scope, key, owner, now, now + ttl_ms),
            )
            self._purge(db, now)
            return EffectClaim.CLAIMED

    def done(self, scope: str, key: str, owner: str, keep_s: float = 0.0) -> None:
        _check_names(scope, key, owner)
        keep_ms = max(self._retention_ms, _duration_ms(keep_s, "keep_s") if keep_s else 0)
        with self._transaction() as db:
            now = self._clock_ms()
            db.execute(
                "INSERT INTO effects (scope, effect_key, owner, state, recorded_ms, expires_ms) "
                "VALUES (?, ?, ?, 'done', ?, ?) "
                "ON CONFLICT (scope, effect_key) DO UPDATE SET owner = excluded.owner, state = 'done', "
                "recorded_ms = excluded.recorded_ms, expires_ms = excluded.expires_ms "
                "WHERE state != 'done' OR expires_ms <= ?",
                (scope, key, owner, now, now + keep_ms, now),
            )

    def release(self, scope: str, key: str, owner: str) -> None:
        _check_names(scope, key, owner)
        with self._transaction() as db:
            db.execute(
                "DELETE FROM effects WHERE scope = ? AND effect_key = ? AND owner = ? AND state = 'claimed'",
                (scope, key, owner),
            )

    def purge(self, limit: int = PURGE_ROWS) -> int:
        """Delete up to `limit` expired rows now; how many were deleted."""
        with self._transaction() as db:
            return self._delete_expired(db, self._clock_ms(), limit)

    def _purge(self, db: sqlite3.Connection, now: int) -> None:
        if now >= self._next_purge_ms:
            self._next_purge_ms = now + int(PURGE_INTERVAL_S * 1000)
            self._delete_expired(db, now, PURGE_ROWS)

    @staticmethod
    def _delete_expired(db: sqlite3.Connection, now: int, limit: int) -> int:
        cursor = db.execute(
            "DELETE FROM effects WHERE (scope, effect_key) IN "
            "(SELECT scope, effect_key FROM effects WHERE expires_ms <= ? LIMIT ?)",
            (now, limit),
        )
        return cursor.rowcount

    def close(self) -> None:
        with self._lock:
            self._db.close()


def _duration_ms(seconds: float, name: str) -> int:
    if not seconds > 0 or not math.isfinite(seconds):
        raise ValueError(f"{name} must be a positive number of seconds, got {seconds!r}")
    return max(1, math.ceil(seconds * 1000))


def _check_names(scope: str, key: str, owner: str) -> None:
    """Both ledgers refuse empty names alike: an empty scope, key or owner is a caller's
    mistake (a tenant, an effect and an attempt all have names), better told at once."""
    for name, value in (("scope", scope), ("key", key), ("owner", owner)):
        if not isinstance(value, str) or not value:
            raise ValueError(f"an effect's {name} must be a non-empty string, got {value!r}")
