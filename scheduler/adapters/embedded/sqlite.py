"""What the embedded adapters share about SQLite: how a file is opened, and one write
transaction done right.

`BEGIN IMMEDIATE` takes the write lock at once, so a read-then-write inside the
transaction never interleaves with another process's write. A failure anywhere,
including in `COMMIT` itself, rolls back; the caller sees the original error, raised
as `sqlite3.Error` for it to translate into its own.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from scheduler.errors import StoreError


def open_db(path: str | Path, *, busy_timeout_s: float, pragmas: Iterable[str]) -> sqlite3.Connection:
    """A connection to the file at `path` (its folder made if missing; `":memory:"`
    for a private database) in autocommit mode, so that every write goes through
    `immediate`, usable from any thread under the caller's own lock, with `pragmas`
    set. A writer waits up to `busy_timeout_s` for another process's write lock."""
    if str(path) != ":memory:":
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(str(path), timeout=busy_timeout_s, isolation_level=None, check_same_thread=False)
    for pragma in pragmas:
        db.execute(f"PRAGMA {pragma}")
    return db


def open_store_file(path: str | Path, schema: str, what: str, *, busy_timeout_s: float,
                    added_columns: Sequence[tuple[str, str, str]] = ()) -> sqlite3.Connection:
    """A durable connection (WAL, full sync) to the store file at `path`, with the tables
    of `schema` created and the `added_columns` (`(table, column, definition)`: columns
    added after files were made without them) added where missing, in one transaction;
    `StoreError` naming `what` if the file cannot be opened."""
    try:
        db = open_db(path, busy_timeout_s=busy_timeout_s, pragmas=("journal_mode=WAL", "synchronous=FULL"))
        with immediate(db) as opened:
            create_tables(opened, schema)
            for table, column, definition in added_columns:
                if column not in {row[1] for row in opened.execute(f"PRAGMA table_info({table})")}:
                    opened.execute(f"ALTER TABLE {table} ADD COLUMN {column} {definition}")
    except sqlite3.Error as exc:
        raise StoreError(f"cannot open the {what} at {path}: {exc}") from exc
    return db


def create_tables(db: sqlite3.Connection, schema: str) -> None:
    """Run each `;`-separated statement of `schema` (inside the caller's transaction)."""
    for statement in schema.split(";"):
        if statement.strip():
            db.execute(statement)


@contextmanager
def immediate(db: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """One write transaction on `db` (opened with `isolation_level=None`)."""
    db.execute("BEGIN IMMEDIATE")
    try:
        yield db
        db.execute("COMMIT")
    except BaseException:
        if db.in_transaction:  # also after a failed COMMIT
            try:
                db.execute("ROLLBACK")
            except sqlite3.Error:
                pass  # the original failure is the one to report
        raise


@contextmanager
def locked_transaction(lock: threading.Lock, db: sqlite3.Connection, what: str) -> Iterator[sqlite3.Connection]:
    """`immediate` on a connection shared by this process's threads (under `lock`), any
    SQLite failure raised as `StoreError` naming `what`."""
    with lock:
        try:
            with immediate(db) as transaction:
                yield transaction
        except sqlite3.Error as exc:
            raise StoreError(f"{what} failed: {exc}") from exc
