"""`SqliteWorkflowStore`: the `WorkflowStore` port on the embedded backend, tables
`workflows`, `workflow_members` and `workflow_claims` in the task store's SQLite file.

Each conditional write (`create`, `claim`, `transition`) is one `BEGIN IMMEDIATE`
transaction, so its read and its write are one step for every thread and process using
the file: the same conditions as the Cassandra adapter's lightweight transactions
(`scheduler.adapters.cassandra.workflows`), held to the same contract suite. A claim
and a state change of one workflow are therefore ordered, whichever comes first.

A workflow that ended is kept `retention.workflow_kept_s` after its end, and after any
member that ends later (a step still running when it was cancelled): its row in
`workflow_ends` says until when, and `purge_expired` (the dispatcher's purge pass)
deletes the workflow with its members and claims once that has passed. A workflow
opened again (a failed one whose dead member was replayed) loses that row: nothing of a
running workflow expires.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from scheduler.adapters.embedded.sqlite import locked_transaction, open_store_file
from scheduler.errors import StoreError
from scheduler.model import TaskId
from scheduler.ports import Claim, Member, MemberOutcome, WorkflowRecord, WorkflowState
from scheduler.retention import DEFAULT_RETENTION_S, workflow_kept_s

SCHEMA = """
CREATE TABLE IF NOT EXISTS workflows (
    tenant      TEXT    NOT NULL,
    workflow_id TEXT    NOT NULL,
    definition  BLOB    NOT NULL,
    state       TEXT    NOT NULL,   -- running, succeeded, failed, cancelled
    created_ms  INTEGER NOT NULL,
    ended_ms    INTEGER,            -- when the state last became terminal
    PRIMARY KEY (tenant, workflow_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS workflow_members (
    tenant      TEXT    NOT NULL,
    workflow_id TEXT    NOT NULL,
    step        TEXT    NOT NULL,
    idx         INTEGER NOT NULL,
    outcome     TEXT    NOT NULL,   -- done, dead, cancelled
    task_id     BLOB    NOT NULL,
    attempt     INTEGER NOT NULL,
    finished_ms INTEGER NOT NULL,
    error       TEXT,
    result      BLOB,
    PRIMARY KEY (tenant, workflow_id, step, idx)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS workflow_claims (
    tenant      TEXT    NOT NULL,
    workflow_id TEXT    NOT NULL,
    step        TEXT    NOT NULL,
    idx         INTEGER NOT NULL,   -- the member, or -1 (WHOLE) for a whole step
    run_at_ms   INTEGER NOT NULL,
    created     INTEGER NOT NULL,   -- every task of the unit is stored
    PRIMARY KEY (tenant, workflow_id, step, idx)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS workflow_ends (
    tenant        TEXT    NOT NULL,
    workflow_id   TEXT    NOT NULL,
    kept_until_ms INTEGER NOT NULL, -- the ended workflow is removed from this time on
    PRIMARY KEY (tenant, workflow_id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS workflow_ends_by_time ON workflow_ends (kept_until_ms);
"""

_KEY = "tenant = ? AND workflow_id = ?"
_MEMBER = "step, idx, outcome, task_id, attempt, finished_ms, error"
_WHAT = "workflow store"


class SqliteWorkflowStore:
    """The embedded `WorkflowStore`, in the SQLite file at `path` (usually the task
    store's). Thread-safe; processes sharing the file see one store."""

    def __init__(self, path: str | Path, *, retention_s: int = DEFAULT_RETENTION_S,
                 busy_timeout_s: float = 30.0) -> None:
        self._retention_s = retention_s
        self._lock = threading.Lock()
        self._db = open_store_file(path, SCHEMA, _WHAT, busy_timeout_s=busy_timeout_s)
        self.path = str(path)

    def _transaction(self) -> AbstractContextManager[sqlite3.Connection]:
        return locked_transaction(self._lock, self._db, _WHAT)

    def _read(self, sql: str, parameters: Sequence[object]) -> list[Any]:
        with self._lock:
            try:
                return self._db.execute(sql, parameters).fetchall()
            except sqlite3.Error as exc:
                raise StoreError(f"{_WHAT} failed: {exc}") from exc

    def create(self, record: WorkflowRecord) -> WorkflowRecord:
        key = (record.tenant, record.workflow_id)
        with self._transaction() as db:
            db.execute(
                "INSERT OR IGNORE INTO workflows (tenant, workflow_id, definition, state, created_ms, ended_ms) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (*key, record.definition, record.state.value, record.created_ms, record.ended_ms),
            )
            row = db.execute(f"SELECT definition, state, created_ms, ended_ms FROM workflows WHERE {_KEY}",
                             key).fetchone()
        return _record(*key, row)

    def read(self, tenant: str, workflow_id: str) -> WorkflowRecord | None:
        rows = self._read(f"SELECT definition, state, created_ms, ended_ms FROM workflows WHERE {_KEY}",
                          (tenant, workflow_id))
        return _record(tenant, workflow_id, rows[0]) if rows else None

    def start_check(self, tenant: str, workflow_id: str, step: str, index: int
                    ) -> tuple[WorkflowState | None, Member | None, bytes | None]:
        rows = self._read(
            f"SELECT w.state, {', '.join('m.' + c.strip() for c in _MEMBER.split(','))}, m.result "
            "FROM workflows w LEFT JOIN workflow_members m "
            "ON m.tenant = w.tenant AND m.workflow_id = w.workflow_id AND m.step = ? AND m.idx = ? "
            "WHERE w.tenant = ? AND w.workflow_id = ?",
            (step, index, tenant, workflow_id),
        )
        if not rows:
            return None, None, None
        state, *member, result = rows[0]
        if member[2] is None:  # no outcome: the member has not ended
            return WorkflowState(state), None, None
        return WorkflowState(state), _member(member), None if result is None else bytes(result)

    def record_member(self, tenant: str, workflow_id: str, member: Member, result: bytes | None) -> None:
        with self._transaction() as db:
            db.execute(
                f"INSERT INTO workflow_members (tenant, workflow_id, {_MEMBER}, result) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT DO UPDATE SET outcome = excluded.outcome, task_id = excluded.task_id, "
                "attempt = excluded.attempt, finished_ms = excluded.finished_ms, error = excluded.error, "
                "result = excluded.result "
                # Done wins: another copy's dead or cancelled end never undoes a done one.
                "WHERE workflow_members.outcome != 'done' OR excluded.outcome = 'done'",
                (tenant, workflow_id, member.step, member.index, member.outcome.value, member.task_id.bytes,
                 member.attempt, member.finished_ms, member.error or None, result),
            )
            # A member ending after its workflow (one still running when it was cancelled)
            # keeps the workflow the retention from its end.
            db.execute(f"UPDATE workflow_ends SET kept_until_ms = max(kept_until_ms, ?) WHERE {_KEY}",
                       (member.finished_ms + self._retention_s * 1000, tenant, workflow_id))

    def members(self, tenant: str, workflow_id: str, steps: tuple[str, ...] | None = None) -> list[Member]:
        sql = f"SELECT {_MEMBER} FROM workflow_members WHERE {_KEY}"
        parameters: list[object] = [tenant, workflow_id]
        if steps is not None:
            wanted = sorted(set(steps))
            sql += f" AND step IN ({', '.join('?' * len(wanted))})"
            parameters += wanted
        return [_member(row) for row in self._read(sql + " ORDER BY step, idx", parameters)]

    def members_at(self, tenant: str, workflow_id: str, step: str, indexes: Sequence[int]) -> list[Member]:
        wanted = sorted(set(indexes))
        if not wanted:
            return []
        sql = (f"SELECT {_MEMBER} FROM workflow_members WHERE {_KEY} AND step = ? "
               f"AND idx IN ({', '.join('?' * len(wanted))}) ORDER BY idx")
        return [_member(row) for row in self._read(sql, [tenant, workflow_id, step, *wanted])]

    def results(self, tenant: str, workflow_id: str, step: str) -> dict[int, bytes]:
        rows = self._read(f"SELECT idx, result FROM workflow_members WHERE {_KEY} AND step = ? "
                          "AND result IS NOT NULL ORDER BY idx", (tenant, workflow_id, step))
        return {index: bytes(result) for index, result in rows}

    def claim(self, tenant: str, workflow_id: str, step: str, index: int, run_at_ms: int,
              when: WorkflowState) -> Claim | None:
        unit = (tenant, workflow_id, step, index)
        with self._transaction() as db:
            held = db.execute(f"SELECT run_at_ms, created FROM workflow_claims WHERE {_KEY} AND step = ? AND idx = ?",
                              unit).fetchone()
            if held is not None:
                return Claim(step, index, held[0], bool(held[1]))
            state = db.execute(f"SELECT state FROM workflows WHERE {_KEY}", unit[:2]).fetchone()
            if state is None or state[0] != when.value:
                return None
            db.execute("INSERT INTO workflow_claims (tenant, workflow_id, step, idx, run_at_ms, created) "
                       "VALUES (?, ?, ?, ?, ?, 0)", (*unit, run_at_ms))
            return Claim(step, index, run_at_ms, False, won=True)

    def claims(self, tenant: str, workflow_id: str) -> list[Claim]:
        rows = self._read(f"SELECT step, idx, run_at_ms, created FROM workflow_claims WHERE {_KEY} "
                          "ORDER BY step, idx", (tenant, workflow_id))
        return [Claim(step, index, run_at_ms, bool(created)) for step, index, run_at_ms, created in rows]

    def mark_created(self, tenant: str, workflow_id: str, step: str, index: int) -> None:
        with self._transaction() as db:
            db.execute(f"UPDATE workflow_claims SET created = 1 WHERE {_KEY} AND step = ? AND idx = ?",
                       (tenant, workflow_id, step, index))

    def transition(self, tenant: str, workflow_id: str, from_states: tuple[WorkflowState, ...],
                   to: WorkflowState, at_ms: int) -> WorkflowState | None:
        key = (tenant, workflow_id)
        with self._transaction() as db:
            row = db.execute(f"SELECT state FROM workflows WHERE {_KEY}", key).fetchone()
            if row is None:
                return None
            state = WorkflowState(row[0])
            if state not in from_states:
                return state
            ended = None if to is WorkflowState.RUNNING else at_ms
            db.execute(f"UPDATE workflows SET state = ?, ended_ms = ? WHERE {_KEY}", (to.value, ended, *key))
            if to is WorkflowState.RUNNING:
                db.execute(f"DELETE FROM workflow_ends WHERE {_KEY}", key)
            else:
                kept_s = workflow_kept_s(self._retention_s, reopenable=to is WorkflowState.FAILED)
                db.execute("INSERT OR REPLACE INTO workflow_ends (tenant, workflow_id, kept_until_ms) "
                           "VALUES (?, ?, ?)", (*key, at_ms + kept_s * 1000))
            return to

    def purge_expired(self, now_ms: int, limit: int) -> int:
        """Delete up to `limit` rows of the workflows whose keep ended by `now_ms` (a
        workflow's members and claims first, its record last, so a purge cut short by
        `limit` goes on where it stopped); return how many rows went. One short
        transaction, like the task store's purge."""
        if limit < 1:
            raise ValueError(f"limit must be positive, got {limit}")
        removed = 0
        with self._transaction() as db:
            ended = db.execute("SELECT tenant, workflow_id FROM workflow_ends WHERE kept_until_ms <= ? "
                               "ORDER BY kept_until_ms LIMIT ?", (now_ms, limit)).fetchall()
            for key in ended:
                for table in ("workflow_members", "workflow_claims"):
                    removed += db.execute(
                        f"DELETE FROM {table} WHERE (tenant, workflow_id, step, idx) IN "
                        f"(SELECT tenant, workflow_id, step, idx FROM {table} WHERE {_KEY} LIMIT ?)",
                        (*key, limit - removed),
                    ).rowcount
                    if removed >= limit:
                        return removed
                removed += db.execute(f"DELETE FROM workflows WHERE {_KEY}", key).rowcount
                db.execute(f"DELETE FROM workflow_ends WHERE {_KEY}", key)
                if removed >= limit:
                    break
        return removed

    def close(self) -> None:
        with self._lock:
            self._db.close()


def _record(tenant: str, workflow_id: str, row: Sequence[Any]) -> WorkflowRecord:
    definition, state, created_ms, ended_ms = row
    return WorkflowRecord(tenant, workflow_id, bytes(definition), WorkflowState(state), created_ms, ended_ms)


def _member(row: Sequence[Any]) -> Member:
    step, index, outcome, task_id, attempt, finished_ms, error = row
    return Member(step, index, MemberOutcome(outcome), TaskId.from_bytes(bytes(task_id)), attempt, finished_ms,
                  error or None)
