"""`CassandraWorkflowStore`: the `WorkflowStore` port on Cassandra (table `workflows`).

A workflow is one partition `(tenant, workflow)`: its record in static columns
(definition, state, created_ms, ended_ms), one row per member that ended (`kind = 'm'`)
and one row per claim (`kind = 'c'`), so every state change and every claim of a
workflow goes through Paxos on the same partition and is ordered against the others.

Plain reads and writes are made at the connection's consistency, but never weaker than
LOCAL_QUORUM (`_WEAK`): two members of a join that end together each write, then read
the other's row, and one of them must see both. The lightweight transactions (at the
connection's serial consistency, LOCAL_SERIAL):

- `create`: `INSERT ... IF NOT EXISTS` of the static columns only;
- `transition`: `UPDATE ... USING TTL ? SET state = ?, ended_ms = ?, definition = ?,
  created_ms = ? IF state IN ?`, on the static columns: every one of them, so that the
  record ends with the TTL the new state gives it (below);
- `claim`: `UPDATE ... SET run_at_ms = ? WHERE ... AND kind = 'c' AND step = ? AND idx = ?
  IF run_at_ms = null AND state = ?`: the claim row's cell and the partition's static
  state in one condition, all or nothing. A refusal answers with both, so the caller
  learns the claim that holds (its run_at) or that the state is not `when`.

The other writes are plain: `record_member` writes member rows and `mark_created` the
claim's `created` cell, cells no transaction writes, so no cell mixes client and Paxos
timestamps. That is also why a claim does not write `created = false`: an absent cell
reads as false. Reads that must see the outcome of a transaction (the stored record
after a refused create, `created` after a refused claim) are made at the serial
consistency, which completes any transaction still in flight on the partition.

An answer that times out may or may not have been applied; it is a `StoreError`.
Repeating the call is safe: a claim then returns the claim that holds (the caller's own
if it was applied), a transition the state the workflow has.

How long a workflow is kept: nothing of it has a TTL while it runs, whatever its steps
take. The state change that ends it writes its record with the TTL of
`retention.workflow_kept_s` (the retention; a failed one, which a replay may open
again, the dead letters' 30 days and a day), and then its member and claim rows again
with that TTL (`_keep_rows`); opening a failed one again writes them all with none. The
claims' `run_at_ms`, set by a transaction, is written again by a plain write: a writer
whose clock is behind the ballot's leaves that cell without a TTL (a leak, never a
change: the value is the same).

A member's "no error" is written as '' rather than null (a null would be a tombstone
per member) and read back as None.

Done wins: a member that ended done has `done_ms` (and its result) set, cells that only
a done end writes; a dead or cancelled end of another copy of the same member (two
copies run at once after a rebalance) writes only `outcome` and its own cells, so it
never undoes the done, whatever the order of the writes or the writers' clocks, and a
dead-letter replay that succeeds reads as done even if its writer's clock is behind.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from cassandra import ConsistencyLevel
from cassandra.cluster import NoHostAvailable
from cassandra.query import UNSET_VALUE, BatchStatement, BatchType

from scheduler.adapters.cassandra.connection import (
    DRIVER_ERRORS,
    CassandraConnection,
    answer_column,
    prepare_for_table,
    run_prepared,
)
from scheduler.adapters.cassandra.refusals import raise_if_denied
from scheduler.errors import StoreError, StoreUnavailable
from scheduler.model import TaskId
from scheduler.ports import Claim, Member, MemberOutcome, WorkflowRecord, WorkflowState
from scheduler.retention import DEFAULT_RETENTION_S, LAST_EXPIRY_S, workflow_kept_s
from scheduler.settings import check_keyspace

if TYPE_CHECKING:
    from scheduler.adapters.cassandra.store import CassandraTaskStore

_KEY = "tenant = ? AND workflow = ?"
_MEMBER = "outcome, task_id, attempt, finished_ms, error"
_MEMBER_READ = f"{_MEMBER}, done_ms"
_RECORD = "definition, state, created_ms, ended_ms"

_QUERIES = {
    "create": "INSERT INTO {keyspace}.workflows (tenant, workflow, definition, state, created_ms, ended_ms) "
              "VALUES (?, ?, ?, ?, ?, ?) IF NOT EXISTS",
    "read": f"SELECT {_RECORD} FROM {{keyspace}}.workflows WHERE {_KEY} LIMIT 1",
    "state": f"SELECT state FROM {{keyspace}}.workflows WHERE {_KEY} LIMIT 1",
    "member": f"SELECT {_MEMBER_READ}, result FROM {{keyspace}}.workflows "
              f"WHERE {_KEY} AND kind = 'm' AND step = ? AND idx = ?",
    "record_done": "INSERT INTO {keyspace}.workflows "
                   f"(tenant, workflow, kind, step, idx, {_MEMBER}, result, done_ms) "
                   "VALUES (?, ?, 'm', ?, ?, ?, ?, ?, ?, ?, ?, ?)",
    "record_member": "INSERT INTO {keyspace}.workflows "
                     f"(tenant, workflow, kind, step, idx, {_MEMBER}) "
                     "VALUES (?, ?, 'm', ?, ?, ?, ?, ?, ?, ?)",
    "members": f"SELECT step, idx, {_MEMBER_READ} FROM {{keyspace}}.workflows WHERE {_KEY} AND kind = 'm'",
    "members_of": f"SELECT step, idx, {_MEMBER_READ} FROM {{keyspace}}.workflows "
                  f"WHERE {_KEY} AND kind = 'm' AND step IN ?",
    "members_at": f"SELECT step, idx, {_MEMBER_READ} FROM {{keyspace}}.workflows "
                  f"WHERE {_KEY} AND kind = 'm' AND step = ? AND idx IN ?",
    "results": f"SELECT idx, result FROM {{keyspace}}.workflows WHERE {_KEY} AND kind = 'm' AND step = ?",
    "claim": f"UPDATE {{keyspace}}.workflows SET run_at_ms = ? WHERE {_KEY} AND kind = 'c' AND step = ? AND idx = ? "
             "IF run_at_ms = null AND state = ?",
    "claims": f"SELECT step, idx, run_at_ms, created FROM {{keyspace}}.workflows WHERE {_KEY} AND kind = 'c'",
    "mark_created": f"UPDATE {{keyspace}}.workflows SET created = true "
                    f"WHERE {_KEY} AND kind = 'c' AND step = ? AND idx = ?",
    "transition": f"UPDATE {{keyspace}}.workflows USING TTL ? SET state = ?, ended_ms = ?, definition = ?, "
                  f"created_ms = ? WHERE {_KEY} IF state IN ?",
    "rows": f"SELECT kind, step, idx, {_MEMBER}, result, done_ms, run_at_ms, created FROM {{keyspace}}.workflows "
            f"WHERE {_KEY}",
    "keep_member": "INSERT INTO {keyspace}.workflows "
                   f"(tenant, workflow, kind, step, idx, {_MEMBER}, result, done_ms) "
                   "VALUES (?, ?, 'm', ?, ?, ?, ?, ?, ?, ?, ?, ?) USING TTL ?",
    "keep_claim": f"UPDATE {{keyspace}}.workflows USING TTL ? SET run_at_ms = ?, created = ? "
                  f"WHERE {_KEY} AND kind = 'c' AND step = ? AND idx = ?",
}

_SERIAL_QUERIES = {
    "read_serial": f"SELECT {_RECORD} FROM {{keyspace}}.workflows WHERE {_KEY} LIMIT 1",
    "claimed_serial": f"SELECT run_at_ms, created FROM {{keyspace}}.workflows "
                      f"WHERE {_KEY} AND kind = 'c' AND step = ? AND idx = ?",
}
"""Reads made at the serial consistency (see the module's docstring)."""

_WHAT = "workflow store"
_KEEP_BATCH = 100
"""Rows a batch of `_keep_rows` writes again: one partition's, so one replica set."""
_WEAK = (ConsistencyLevel.ANY, ConsistencyLevel.ONE, ConsistencyLevel.TWO, ConsistencyLevel.THREE,
         ConsistencyLevel.LOCAL_ONE)
"""Levels whose reads may miss an acknowledged write: the workflow store's reads and
writes are made at LOCAL_QUORUM instead (a join fires only if one of the members that
end together sees the other's end)."""


class CassandraWorkflowStore:
    """The distributed `WorkflowStore`, on a task store's session
    (`CassandraWorkflowStore.for_store`). Thread-safe (the driver's session is)."""

    def __init__(self, connection: CassandraConnection, keyspace: str, *,
                 retention_s: int = DEFAULT_RETENTION_S) -> None:
        check_keyspace(keyspace)
        self._retention_s = retention_s
        self._session = connection.session
        self.keyspace = keyspace
        self._q = prepare_for_table(self._session, {**_QUERIES, **_SERIAL_QUERIES}, keyspace, _WHAT, "workflows")
        default = connection.cluster.profile_manager.default
        serial = default.serial_consistency_level or ConsistencyLevel.LOCAL_SERIAL
        for name in _SERIAL_QUERIES:
            self._q[name].consistency_level = serial  # inherited by every statement bound from it
        if default.consistency_level in _WEAK:
            for name in _QUERIES:  # a join needs reads that see every write acknowledged before them
                self._q[name].consistency_level = ConsistencyLevel.LOCAL_QUORUM

    @classmethod
    def for_store(cls, store: CassandraTaskStore) -> CassandraWorkflowStore:
        """A workflow store in the task store's keyspace, on its session (closing it does
        nothing; it is unusable once the task store is closed)."""
        return cls(store.connection, store.keyspace, retention_s=store.retention_s)

    def _run(self, name: str, values: tuple[object, ...]) -> Any:
        return run_prepared(self._session, self._q, name, values, _WHAT)

    def create(self, record: WorkflowRecord) -> WorkflowRecord:
        ended = UNSET_VALUE if record.ended_ms is None else record.ended_ms
        result = self._run("create", (record.tenant, record.workflow_id, record.definition, record.state.value,
                                      record.created_ms, ended))
        if result.was_applied:
            return record
        stored = self._run("read_serial", (record.tenant, record.workflow_id)).one()
        if stored is None or stored[1] is None:  # nothing deletes a workflow, so this is a damaged partition
            raise StoreError(f"workflow {record.tenant}/{record.workflow_id} exists but has no record")
        return _record(record.tenant, record.workflow_id, stored)

    def read(self, tenant: str, workflow_id: str) -> WorkflowRecord | None:
        row = self._run("read", (tenant, workflow_id)).one()
        return _record(tenant, workflow_id, row) if row is not None and row[1] is not None else None

    def start_check(self, tenant: str, workflow_id: str, step: str, index: int
                    ) -> tuple[WorkflowState | None, Member | None, bytes | None]:
        # The member first, the state last: the state read is the one a cancel races, so
        # it is made as close to the handler's start as this check allows.
        row = self._run("member", (tenant, workflow_id, step, index)).one()
        state = self._state(tenant, workflow_id)
        if state is None:
            return None, None, None
        if row is None or row[0] is None:
            return state, None, None
        member = _member((step, index, *row[:6]))
        return state, member, None if row[6] is None else bytes(row[6])

    def _state(self, tenant: str, workflow_id: str) -> WorkflowState | None:
        row = self._run("state", (tenant, workflow_id)).one()
        return None if row is None or row[0] is None else WorkflowState(row[0])

    def record_member(self, tenant: str, workflow_id: str, member: Member, result: bytes | None) -> None:
        row = (tenant, workflow_id, member.step, member.index, member.outcome.value, member.task_id.uuid,
               member.attempt, member.finished_ms, member.error or "")
        if member.outcome is MemberOutcome.DONE:
            self._run("record_done", (*row, result, member.finished_ms))
        else:
            self._run("record_member", row)

    def members(self, tenant: str, workflow_id: str, steps: tuple[str, ...] | None = None) -> list[Member]:
        if steps is None:
            rows = self._run("members", (tenant, workflow_id))
        elif not steps:
            return []
        else:
            rows = self._run("members_of", (tenant, workflow_id, sorted(set(steps))))
        return [_member(row) for row in rows if row[2] is not None]

    def members_at(self, tenant: str, workflow_id: str, step: str, indexes: Sequence[int]) -> list[Member]:
        wanted = sorted(set(indexes))
        if not wanted:
            return []
        rows = self._run("members_at", (tenant, workflow_id, step, wanted))
        return [_member(row) for row in rows if row[2] is not None]

    def results(self, tenant: str, workflow_id: str, step: str) -> dict[int, bytes]:
        rows = self._run("results", (tenant, workflow_id, step))
        return {index: bytes(result) for index, result in rows if result is not None}

    def claim(self, tenant: str, workflow_id: str, step: str, index: int, run_at_ms: int,
              when: WorkflowState) -> Claim | None:
        result = self._run("claim", (run_at_ms, tenant, workflow_id, step, index, when.value))
        if result.was_applied:
            return Claim(step, index, run_at_ms, False, won=True)
        held = answer_column(result, "run_at_ms")
        if held is None:
            return None  # unclaimed, so the state is not `when` (or there is no workflow)
        row = self._run("claimed_serial", (tenant, workflow_id, step, index)).one()
        created = row is not None and row[0] == held and bool(row[1])
        return Claim(step, index, held, created)

    def claims(self, tenant: str, workflow_id: str) -> list[Claim]:
        rows = self._run("claims", (tenant, workflow_id))
        return [Claim(step, index, run_at_ms, bool(created))
                for step, index, run_at_ms, created in rows if run_at_ms is not None]

    def mark_created(self, tenant: str, workflow_id: str, step: str, index: int) -> None:
        self._run("mark_created", (tenant, workflow_id, step, index))

    def transition(self, tenant: str, workflow_id: str, from_states: tuple[WorkflowState, ...],
                   to: WorkflowState, at_ms: int) -> WorkflowState | None:
        if not from_states:
            return self._state(tenant, workflow_id)  # nothing to move from (and CQL refuses IN ())
        stored = self.read(tenant, workflow_id)
        if stored is None:
            return None
        ended = None if to is WorkflowState.RUNNING else at_ms
        ttl = 0 if to is WorkflowState.RUNNING else _ttl(
            workflow_kept_s(self._retention_s, reopenable=to is WorkflowState.FAILED))
        result = self._run("transition", (ttl, to.value, ended, stored.definition, stored.created_ms, tenant,
                                          workflow_id, [s.value for s in from_states]))
        if result.was_applied:
            self._keep_rows(tenant, workflow_id, ttl)
            return to
        state = answer_column(result, "state")
        return None if state is None else WorkflowState(state)

    def _keep_rows(self, tenant: str, workflow_id: str, ttl: int) -> None:
        """Write the workflow's member and claim rows again with `ttl` (0: none), the TTL
        its state change gave its record, so they end together. Unlogged batches of one
        partition. A member that ends later writes its row with no TTL (a step still
        running when its workflow was cancelled): that row outlives the workflow, the
        one leak there is, against rows of a running workflow that could expire."""
        batch: BatchStatement | None = None
        for row in self._run("rows", (tenant, workflow_id)):
            kind, step, index, *cells = row
            if kind is None:
                continue  # the record alone: no member or claim yet
            if batch is None:
                batch = BatchStatement(batch_type=BatchType.UNLOGGED,
                                       consistency_level=self._q["keep_member"].consistency_level)
            values = [UNSET_VALUE if cell is None else cell for cell in cells]
            if kind == "m":
                batch.add(self._q["keep_member"], (tenant, workflow_id, step, index, *values[:7], ttl))
            else:
                batch.add(self._q["keep_claim"], (ttl, values[7], values[8], tenant, workflow_id, step, index))
            if len(batch) >= _KEEP_BATCH:
                self._execute_batch(batch)
                batch = None
        if batch is not None:
            self._execute_batch(batch)

    def _execute_batch(self, batch: BatchStatement) -> None:
        try:
            self._session.execute(batch)
        except NoHostAvailable as exc:
            raise StoreUnavailable(f"no Cassandra node could take the {_WHAT}'s rows' TTL: {exc}") from exc
        except DRIVER_ERRORS as exc:
            raise_if_denied(exc, self._session, f"the {_WHAT}'s rows' TTL")
            raise StoreError(f"{_WHAT} rows' TTL failed: {type(exc).__name__}: {exc}") from exc

    def close(self) -> None:
        """Nothing: the session is the task store's."""


def _ttl(seconds: int) -> int:
    """The TTL of cells that must outlive `seconds` (a second more: Cassandra counts a TTL
    from the start of the second it was written in); 0, none, for cells that would end
    after Cassandra's last expiry time (`retention.LAST_EXPIRY_S`)."""
    ttl = seconds + 1
    return 0 if time.time() + ttl > LAST_EXPIRY_S else ttl


def _record(tenant: str, workflow_id: str, row: Any) -> WorkflowRecord:
    definition, state, created_ms, ended_ms = row
    return WorkflowRecord(tenant, workflow_id, bytes(definition), WorkflowState(state), created_ms, ended_ms)


def _member(row: Any) -> Member:
    step, index, outcome, task_id, attempt, finished_ms, error, done_ms = row
    if done_ms is not None:  # done once is done: a later dead or cancelled copy does not undo it
        return Member(step, index, MemberOutcome.DONE, TaskId.from_uuid(task_id), attempt, done_ms)
    return Member(step, index, MemberOutcome(outcome), TaskId.from_uuid(task_id), attempt, finished_ms,
                  error or None)

