"""What passes between a shard's reads, its state and the fire loop: rows reduced to
what the wheel needs, the batch one firing pass yields, what a sweep counts, and the
arithmetic of one-second slices and wheel tags.

Values and pure functions only: `scheduler.dispatcher.shard` keeps each owned shard's
state; the loop's parts (`reading`, `firing`) make these and hand them to it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from scheduler.fairness.gate import Waiting
from scheduler.model import Priority, Task, encode_message
from scheduler.ports import StoredTask, TaskStatus
from scheduler.wheel import Entry

__all__ = ["FireBatch", "LONG_TAG", "Row", "SLICE_MS", "Sweep", "rows_from", "should_fire", "slice_end", "slice_of",
           "tag_for", "topic_tags"]

SLICE_MS = 1000
"""Width of the slices counted before and after they fire; divides `BUCKET_MS`."""

LONG_TAG = 3
"""Wheel tag of the `long` ready topic; priorities use their codes 0, 1, 2."""


@dataclass(frozen=True)
class Sweep:
    """What one sweep counts: `buckets` of the shard, rows at or before `through_ms`, and
    after `after_ms` (a recent sweep) or whole (a full sweep: None)."""

    through_ms: int
    buckets: list[int]
    after_ms: int | None


def slice_of(run_at_ms: int) -> int:
    return run_at_ms // SLICE_MS


def slice_end(k: int) -> int:
    return k * SLICE_MS + SLICE_MS - 1


def tag_for(task: Task, long_types: frozenset[str]) -> int:
    return LONG_TAG if task.type in long_types else task.priority.code


def should_fire(stored: StoredTask) -> bool:
    """A row fires unless it is finished, or some report already covers its attempt (it
    was fired before, by a previous owner whose cursor lagged)."""
    if stored.status is TaskStatus.SCHEDULED:
        return True
    if stored.status.finished:
        return False
    return stored.status_attempt < stored.task.attempt


@dataclass
class Row:
    """A row read from the store, reduced to what the wheel needs; `message` is None for
    a row that must not fire (it still counts as handled)."""

    run_at_ms: int
    id: bytes
    tag: int
    message: bytes | None
    letter: bytes | None = None
    """For a row that could not be read: its dead letter (`message` is then None)."""


def rows_from(stored: Iterable[StoredTask], token: int, long_types: frozenset[str]) -> list[Row]:
    rows = []
    for item in stored:
        task = item.task
        message = encode_message(task, token) if should_fire(item) else None
        rows.append(Row(task.run_at_ms, task.id.bytes, tag_for(task, long_types), message))
    return rows


@dataclass
class FireBatch:
    """What one shard fired in one pass: values per tag, and the wheel's frontier after."""

    by_tag: dict[int, list[bytes]]
    fired_through_ms: int
    count: int
    skipped_cancelled: int
    duplicates: int = 0
    gated: list[Entry] | None = None
    """With a release gate: the due entries, for the gate to admit (`by_tag` is empty)."""
    released: list[Waiting] | None = None
    """For a batch the gate let out: what to settle with it once the queue acknowledged."""
    released_at_ms: int | None = None
    """...and the moment it was let out, which its messages are stamped with."""
    floor_ms: int | None = None
    """The earliest run_at in the batch: the cursor stays below it until it is acknowledged."""
    dead_letters: list[bytes] = field(default_factory=list)
    """Dead letters of rows that could not be read, for the dead-letter topic."""


def topic_tags(topics: dict[str, str]) -> dict[int, str]:
    """Wheel tag -> ready topic name, from `{short name: topic}` for high, normal, low, long."""
    return {Priority.HIGH.code: topics["high"], Priority.NORMAL.code: topics["normal"],
            Priority.LOW.code: topics["low"], LONG_TAG: topics["long"]}
