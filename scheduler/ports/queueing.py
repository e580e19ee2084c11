"""Queueing's ports: the producer's hand-off, the ready topics that workers consume, and
the dispatchers' hand-off log (Kafka, or the embedded SQLite log)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from scheduler.model import Task, TaskId


class Handoff(Protocol):
    """Where the producer hands tasks that fall due soon, and cancels of them, so the
    shard's owner learns of them at once (the dispatcher consumes it). Called after the
    store acknowledged the write; must return only once the hand-off is durable, and
    raise if it is not. A task due now may already be behind the dispatcher's cursor
    when it is stored, so for such a task the hand-off is what makes it fire: the
    producer treats a failed hand-off as a failed submit."""

    def submitted(self, tasks: Sequence[Task]) -> None: ...

    def cancelled(self, task_id: TaskId) -> None: ...

    def completed(self, task_ids: Sequence[bytes]) -> None:
        """Workers: these attempts (16-byte task ids) finished (done, stored for a retry,
        dead, or skipped), so the dispatcher that released them frees their places under
        their tenant's concurrency cap. Best effort: a completion lost is a place freed
        later, by the dispatcher's hold timeout."""



class Publisher(Protocol):
    """Publishes fired tasks' messages to the ready topics (`high`, `normal`, `low`,
    `long`). Kafka: an idempotent producer with `acks=all`, batched."""

    def publish(self, topic: str, values: Sequence[bytes], timestamp_ms: int | None = None) -> None:
        """Queue `values` for `topic` (the queue picks partitions). Returns at once unless
        the local buffer is full, then waits for room. `QueueError` if refused.
        `timestamp_ms` stamps the messages (Kafka: their CreateTime) with the moment the
        dispatcher released them, rather than when they were handed to the client."""
        ...

    def flush(self, timeout_s: float) -> None:
        """Return once every value published so far is durably stored; `QueueError` if
        any was not, or if `timeout_s` passed first. After an error the caller publishes
        again what it cannot prove stored (duplicates are allowed, loss is not)."""
        ...

    def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class HandoffRecord:
    """One message read from the hand-off log: the partition is the shard, `offset` its
    position there."""

    shard: int
    offset: int
    value: bytes
    timestamp_ms: int | None = None
    """When the writer appended it, by the writer's clock (Kafka: the record's CreateTime):
    how the dispatcher measures the writers' clocks against its own."""


class HandoffLog(Protocol):
    """The write side of the hand-off log: one partition per shard (Kafka: the hand-off
    topic, partition = shard), durable on return."""

    def append(self, batches: Sequence[tuple[int, Sequence[bytes]]]) -> None:
        """Append each `(shard, values)` batch to the shard's partition, in order; return
        once all are durable (one flush for all), `QueueError` if any is not."""
        ...

    def close(self) -> None: ...


class HandoffReader(Protocol):
    """The read side of the hand-off log, for the owner of some shards. Positions are
    committed per shard under one name shared by all dispatchers, so a new owner resumes
    where the last owner committed (and from the start of the partition if nobody ever
    committed): what the last owner read but did not commit is read again."""

    def assign(self, shard: int) -> None:
        """Start reading the shard's partition from its committed position."""
        ...

    def unassign(self, shard: int) -> None:
        """Stop reading the shard's partition; records not yet polled are dropped."""
        ...

    def poll(self, max_records: int, timeout_s: float) -> list[HandoffRecord]:
        """Up to `max_records` records of assigned shards, in order within each shard;
        waits up to `timeout_s` for the first. `QueueError` if the log fails."""
        ...

    def commit(self, positions: Mapping[int, int]) -> None:
        """Record, for each shard, the offset of the next record to read (one past the last
        one whose effect is safe). Synchronous; `QueueError` if it fails."""
        ...

    def close(self) -> None: ...
