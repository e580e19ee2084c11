"""`CassandraScheduleStore`: the `ScheduleStore` port on Cassandra (table `schedules`).

A schedule's row sits in the partition of its shard, so `list_shard` is one partition
read. Every write is a lightweight transaction (Paxos, LOCAL_SERIAL), so no write here
mixes client and Paxos timestamps:

- `create`: `INSERT ... IF NOT EXISTS`;
- `advance`: `UPDATE ... SET next_slot = ?, fence = ? IF next_slot = ? AND paused =
  false AND created_at = ? AND fence <= ?`, one row and the partition's static fence,
  all or nothing (`created_at` tells a schedule deleted and added again under the same
  name, whose first slot may equal the old one's, from the one that was read). The
  fence is null until the first advance in the partition and null compares false, so
  when the answer shows a null fence the advance is tried again with `fence = null`
  (CQL has no OR in IF), as the task partitions' fence is;
  An advance past skipped slots (`scheduler.recurring.runner`) also sets `skipped` and
  `last_skipped` in the same write;
- `pause`, `resume`, `delete`: conditional on the row (`IF paused = ...`, `IF EXISTS`).

An answer that times out may or may not have been applied; it is a `StoreError`, and
the caller's next pass re-reads the schedule (an advance that did apply then shows as
the new next slot; creating its runs again writes the same rows).
"""

from __future__ import annotations

import logging
import uuid
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from cassandra.query import UNSET_VALUE

from scheduler.adapters.cassandra.connection import (
    CassandraConnection,
    answer_column,
    prepare_for_table,
    run_prepared,
)
from scheduler.model import Priority
from scheduler.ports import AdvanceOutcome
from scheduler.recurring.schedule import MisfirePolicy, Schedule, TaskTemplate, readable, schedule_shard
from scheduler.settings import check_keyspace

if TYPE_CHECKING:
    from scheduler.adapters.cassandra.store import CassandraTaskStore

_COLUMNS = ("tenant, name, cron, zone, type, payload, priority, max_attempts, misfire, grace_s, jitter_s, "
            "next_slot, paused, created_at, skipped, last_skipped")
_ADVANCE = "UPDATE {{keyspace}}.schedules SET next_slot = ?, fence = ?{skips} WHERE shard = ? AND schedule_id = ? "
_READ_AS = "IF next_slot = ? AND paused = false AND created_at = ? AND "

_QUERIES = {
    "create": f"INSERT INTO {{keyspace}}.schedules (shard, schedule_id, {_COLUMNS}) "
              "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) IF NOT EXISTS",
    "get": f"SELECT {_COLUMNS} FROM {{keyspace}}.schedules WHERE shard = ? AND schedule_id = ?",
    "list_shard": f"SELECT {_COLUMNS} FROM {{keyspace}}.schedules WHERE shard = ?",
    # Advances, and advances that also count skipped slots (kept apart so that an
    # advance without a skip writes no null, i.e. no tombstone, into last_skipped).
    "advance": _ADVANCE.format(skips="") + _READ_AS + "fence <= ?",
    "advance_first": _ADVANCE.format(skips="") + _READ_AS + "fence = null",
    "advance_skipping": _ADVANCE.format(skips=", skipped = ?, last_skipped = ?") + _READ_AS + "fence <= ?",
    "advance_first_skipping": _ADVANCE.format(skips=", skipped = ?, last_skipped = ?") + _READ_AS + "fence = null",
    "pause": "UPDATE {keyspace}.schedules SET paused = true WHERE shard = ? AND schedule_id = ? IF paused = false",
    "resume": "UPDATE {keyspace}.schedules SET paused = false, next_slot = ? WHERE shard = ? AND schedule_id = ? "
              "IF paused = true",
    "delete": "DELETE FROM {keyspace}.schedules WHERE shard = ? AND schedule_id = ? IF EXISTS",
}

log = logging.getLogger(__name__)


class CassandraScheduleStore:
    """The distributed `ScheduleStore`, on a task store's session
    (`CassandraScheduleStore.for_store`). Thread-safe (the driver's session is)."""

    def __init__(self, connection: CassandraConnection, keyspace: str, shard_count: int) -> None:
        check_keyspace(keyspace)
        self._session = connection.session
        self._shard_count = shard_count
        self.keyspace = keyspace
        self._q = prepare_for_table(self._session, _QUERIES, keyspace, "schedule store", "schedules")

    @classmethod
    def for_store(cls, store: CassandraTaskStore) -> CassandraScheduleStore:
        """A schedule store in the task store's keyspace, on its session (closing it does
        nothing; it is unusable once the task store is closed)."""
        return cls(store.connection, store.keyspace, store.shard_count)

    @property
    def shard_count(self) -> int:
        return self._shard_count

    def _run(self, name: str, values: tuple[object, ...]) -> Any:
        return run_prepared(self._session, self._q, name, values, "schedule store")

    def _key(self, schedule_id: uuid.UUID) -> tuple[int, uuid.UUID]:
        return schedule_shard(schedule_id, self._shard_count), schedule_id

    def create(self, schedule: Schedule) -> bool:
        template = schedule.template
        result = self._run("create", (
            *self._key(schedule.id), schedule.tenant, schedule.name, schedule.cron, schedule.zone, template.type,
            template.payload, template.priority.code, template.max_attempts, schedule.misfire.value,
            schedule.grace_s, schedule.jitter_s, schedule.next_slot_ms, schedule.paused, schedule.created_ms,
            schedule.skipped, UNSET_VALUE if schedule.last_skipped_ms is None else schedule.last_skipped_ms,
        ))
        return bool(result.was_applied)

    def get(self, schedule_id: uuid.UUID) -> Schedule | None:
        row = self._run("get", self._key(schedule_id)).one()
        return _schedule(row) if row is not None and row[0] is not None else None

    def list_shard(self, shard: int) -> list[Schedule]:
        rows = self._run("list_shard", (shard,))
        return readable((row for row in rows if row[0] is not None), _schedule, log)  # a fence alone is no schedule

    def list_all(self, tenant: str | None = None) -> list[Schedule]:
        found = [s for shard in range(self._shard_count) for s in self.list_shard(shard)]
        if tenant is not None:
            found = [s for s in found if s.tenant == tenant]
        return sorted(found, key=lambda s: (s.tenant, s.name))

    def advance(self, schedule: Schedule, next_slot_ms: int, token: int, *, skipped: int = 0,
                last_skipped_ms: int | None = None) -> AdvanceOutcome:
        key = self._key(schedule.id)
        read = (schedule.next_slot_ms, schedule.created_ms)
        # The count is written whole: the condition on the next slot read also holds the
        # count read (only an advance changes it, and every advance moves the next slot).
        skips: tuple[object, ...] = ()
        suffix = ""
        if skipped:
            skips = (schedule.skipped + skipped, last_skipped_ms)
            suffix = "_skipping"
        result = self._run("advance" + suffix, (next_slot_ms, token, *skips, *key, *read, token))
        for _ in range(3):
            if result.was_applied:
                return AdvanceOutcome.APPLIED
            fence = answer_column(result, "fence")
            if fence is not None and fence > token:
                return AdvanceOutcome.FENCED
            stored, created = answer_column(result, "next_slot"), answer_column(result, "created_at")
            if (stored is None or _ms(stored) != schedule.next_slot_ms or answer_column(result, "paused") is not False
                    or created is None or _ms(created) != schedule.created_ms):
                return AdvanceOutcome.CHANGED  # moved on, paused, or deleted (and perhaps added again)
            # The row is as read: the fence was null, or was raised to <= token in between.
            name = ("advance_first" if fence is None else "advance") + suffix
            conditions = read if fence is None else (*read, token)
            result = self._run(name, (next_slot_ms, token, *skips, *key, *conditions))
        return AdvanceOutcome.APPLIED if result.was_applied else AdvanceOutcome.CHANGED

    def pause(self, schedule_id: uuid.UUID) -> bool:
        return bool(self._run("pause", self._key(schedule_id)).was_applied)

    def resume(self, schedule_id: uuid.UUID, next_slot_ms: int) -> bool:
        return bool(self._run("resume", (next_slot_ms, *self._key(schedule_id))).was_applied)

    def delete(self, schedule_id: uuid.UUID) -> bool:
        return bool(self._run("delete", self._key(schedule_id)).was_applied)

    def close(self) -> None:
        """Nothing: the session is the task store's."""


def _ms(moment: datetime) -> int:
    """Milliseconds of a timestamp the driver returns (naive, UTC)."""
    return (moment - _EPOCH) // _ONE_MS


_EPOCH = datetime(1970, 1, 1)
_ONE_MS = timedelta(milliseconds=1)


def _schedule(row: Any) -> Schedule:
    (tenant, name, cron, zone, type_, payload, priority, max_attempts, misfire, grace_s, jitter_s, next_slot,
     paused, created_at, skipped, last_skipped) = row
    return Schedule(
        tenant=tenant, name=name, cron=cron, zone=zone,
        template=TaskTemplate(type_, bytes(payload or b"\xc0"), Priority.from_code(priority), max_attempts),
        misfire=MisfirePolicy(misfire), grace_s=grace_s, jitter_s=jitter_s, next_slot_ms=_ms(next_slot),
        created_ms=_ms(created_at), paused=bool(paused), skipped=skipped or 0,
        last_skipped_ms=None if last_skipped is None else _ms(last_skipped),
    )

