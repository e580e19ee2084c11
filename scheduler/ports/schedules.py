"""The schedule store's port: recurring schedules, one row each in its shard's partition,
the next slot moved only by a fenced conditional write. Kept by two adapters that meet
`tests/contract/test_schedule_store.py`.
"""

from __future__ import annotations

import enum
import uuid
from typing import Protocol

from scheduler.recurring.schedule import Schedule


class AdvanceOutcome(enum.Enum):
    """The answer of `ScheduleStore.advance`."""

    APPLIED = "applied"
    CHANGED = "changed"
    """The stored schedule is not the one read (another creator advanced it first, it was
    paused, or deleted): re-read it, create nothing more now."""
    FENCED = "fenced"
    """A newer lease of the shard has written to its schedules: stop, the shard is not ours."""


class ScheduleStore(Protocol):
    """Durable home of recurring schedules (`scheduler.recurring`), kept by two adapters
    that meet one contract suite (`tests/contract/test_schedule_store.py`).

    Schedules live in the partition of their shard (`Schedule.shard`), so the owner of a
    shard reads its schedules with one partition read. Each partition has a fence like a
    task partition's: `advance` is refused to a token older than one that has advanced
    a schedule of the shard. Every write is conditional and atomic per schedule.
    Failures: `StoreError`, never a driver's exception. Thread-safe.
    """

    @property
    def shard_count(self) -> int: ...

    def create(self, schedule: Schedule) -> bool:
        """Store `schedule` unless one with its id exists; False (nothing changed) if one does."""
        ...

    def get(self, schedule_id: uuid.UUID) -> Schedule | None: ...

    def list_shard(self, shard: int) -> list[Schedule]:
        """Every schedule of `shard` (paused ones too), by id."""
        ...

    def list_all(self, tenant: str | None = None) -> list[Schedule]:
        """Every schedule (of `tenant`, when given), by tenant and name. Reads every shard."""
        ...

    def advance(self, schedule: Schedule, next_slot_ms: int, token: int, *, skipped: int = 0,
                last_skipped_ms: int | None = None) -> AdvanceOutcome:
        """Move the schedule's next slot from `schedule.next_slot_ms` to `next_slot_ms` and
        raise the shard's fence to `token`, all or nothing, if the stored schedule exists,
        is not paused, still has that next slot, and `token` is at least the fence. With
        `skipped` > 0, the same write adds it to the schedule's `skipped` count and records
        `last_skipped_ms` as its last skipped slot."""
        ...

    def pause(self, schedule_id: uuid.UUID) -> bool:
        """Mark the schedule paused; False if there is none or it already was."""
        ...

    def resume(self, schedule_id: uuid.UUID, next_slot_ms: int) -> bool:
        """Unpause the schedule and set its next slot; False if there is none or it was
        not paused."""
        ...

    def delete(self, schedule_id: uuid.UUID) -> bool:
        """Remove the schedule; False if there was none. Runs already created stay."""
        ...

    def close(self) -> None: ...
