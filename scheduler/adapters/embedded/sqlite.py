"""What the embedded adapters share about SQLite: one write transaction done right.

`BEGIN IMMEDIATE` takes the write lock at once, so a read-then-write inside the
transaction never interleaves with another process's write. A failure anywhere,
including in `COMMIT` itself, rolls back; the caller sees the original error, raised
as `sqlite3.Error` for it to translate into its own.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager


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
