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
from scheduler.visibility.labels import TypeLabels
from scheduler.wheel import Entry

__all__ = ["FireBatch", "LONG_TAG", "Row", "SLICE_MS", "Sweep", "priority_of_tag", "rows_from", "should_fire",
           "slice_end", "slice_of", "tag_for", "topic_tags", "type_slot_of_tag"]

SLICE_MS = 1000
"""Width of the slices counted before and after they fire; divides `BUCKET_MS`."""

LONG_TAG = 4
"""The bit of a wheel tag that sends its entry to the `long` ready topic."""

_PRIORITY_BITS = 3
_TYPE_SHIFT = 3

# A wheel tag is one byte that the entry carries through the wheel and the release gate
# to the publisher, so that publishing and counting need no decoding of the message:
#
#     bits 0-1  the priority code (0 high, 1 normal, 2 low)
#     bit  2    LONG_TAG: the long topic (a `--long-types` type), else the priority's
#     bits 3-7  the type's slot in the dispatcher's `TypeLabels` (0: other), for the
#               fired counters by type
#
# e.g. a `normal` task of the first type labelled, not long: 1 | 1 << 3 = 9.


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


def tag_for(task: Task, long_types: frozenset[str], types: TypeLabels | None = None) -> int:
    tag = task.priority.code
    if task.type in long_types:
        tag |= LONG_TAG
    if types is not None:
        tag |= types.slot(task.type) << _TYPE_SHIFT
    return tag


def priority_of_tag(tag: int) -> Priority:
    return Priority.from_code(tag & _PRIORITY_BITS)


def type_slot_of_tag(tag: int) -> int:
    return tag >> _TYPE_SHIFT


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


def rows_from(stored: Iterable[StoredTask], token: int, long_types: frozenset[str],
              types: TypeLabels | None = None) -> list[Row]:
    rows = []
    for item in stored:
        task = item.task
        message = encode_message(task, token) if should_fire(item) else None
        rows.append(Row(task.run_at_ms, task.id.bytes, tag_for(task, long_types, types), message))
    return rows


@dataclass
class FireBatch:
    """What one shard fired in one pass: values per tag, and the shard's fired frontier after."""

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
    run_ats: list[int] = field(default_factory=list)
    """The run_at of every task in `by_tag`, for the fire lateness once it is flushed."""


def topic_tags(topics: dict[str, str]) -> dict[int, str]:
    """Wheel tag -> ready topic name, for every tag `tag_for` can make, from `{short name:
    topic}` for high, normal, low, long."""
    by_code = {Priority.HIGH.code: topics["high"], Priority.NORMAL.code: topics["normal"],
               Priority.LOW.code: topics["low"]}
    return {tag: topics["long"] if tag & LONG_TAG else by_code[tag & _PRIORITY_BITS]
            for tag in range(256) if tag & _PRIORITY_BITS in by_code}
