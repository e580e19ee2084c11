"""The workers' ports: consuming the ready topics, scanning dead letters, and the
effect ledger behind `ctx.once`."""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from typing import NamedTuple, Protocol


class Delivery(NamedTuple):
    """One message read from a topic by a consumer-group member. (A named tuple, not a
    frozen dataclass: a worker makes one per message, and a tuple is made 3x faster.)"""

    topic: str
    partition: int
    offset: int
    value: bytes
    timestamp_ms: int
    """The record's timestamp: when the queue stored the message, or the moment its
    publisher stamped on it (a task the fairness gate let out: its release)."""


TopicPartition = tuple[str, int]


class Consumer(Protocol):
    """A member of a consumer group reading some topics (Kafka: a subscribed consumer
    with auto-commit off; embedded: a member of the queue's own group table).

    The group spreads the topics' partitions over its live members; a member that dies
    (stops polling past the session timeout) loses its partitions, and whoever gets them
    next starts at the last committed position, so whatever was read but not committed is
    delivered again. Each topic's partitions are spread over the members (not just the
    total count), so a burst on one topic reaches every member. `poll` is the only place
    the assignment changes: partitions taken away (with Kafka's eager protocol, all of
    them, before a new assignment) are reported to `on_revoked` from inside `poll`, before anyone else can read
    them, so the caller can commit what it finished; commits for partitions no longer
    assigned are ignored (Kafka refuses them) and their messages will be delivered again.

    Not thread-safe: one thread polls, pauses, resumes and commits.
    """

    def poll(self, max_records: int, timeout_s: float) -> list[Delivery]:
        """Up to `max_records` messages of assigned, unpaused partitions, in offset order
        within each partition; waits up to `timeout_s` for the first. Must be called at
        least every few seconds even when paused, to stay in the group. `QueueError` if
        the queue fails."""
        ...

    def pause(self, topics: Sequence[str]) -> None:
        """Stop fetching `topics` (already-fetched messages may still come once)."""
        ...

    def resume(self, topics: Sequence[str]) -> None:
        ...

    def assignment(self) -> set[TopicPartition]:
        """The partitions this member holds now."""
        ...

    def lag(self) -> dict[TopicPartition, int]:
        """For each partition held, the messages after this member's fetch position: what
        the queue holds that this member has not received yet (what it received and has
        not finished is the caller's to count). Must be cheap enough to call every few
        seconds: it answers from what the client already knows where it can, so a
        partition it cannot tell about yet is left out, and a paused one may read low."""
        ...

    def commit(self, positions: Mapping[TopicPartition, int]) -> None:
        """Record, for each partition, the offset of the next message to deliver
        (synchronously). Positions of partitions not assigned to this member are dropped.
        `QueueError` if the commit fails."""
        ...

    def close(self) -> None:
        """Leave the group (its partitions go to other members at once); no commit."""
        ...


class TopicScanner(Protocol):
    """Reads a whole topic without joining any group: dead letters, for `dlq list`."""

    def scan(self, topic: str, *, limit: int | None = None) -> list[Delivery]:
        """Every message of `topic` (up to `limit`, oldest first within each partition),
        as of the call."""
        ...


class EffectClaim(enum.Enum):
    """The answer of `EffectLedger.claim`."""

    CLAIMED = "claimed"
    """The caller holds the claim: it runs the effect, then calls `done` (or `release`
    if the effect failed)."""
    DONE = "done"
    """The effect is recorded as done: skip it."""
    BUSY = "busy"
    """Another attempt holds an unexpired claim (it is running the effect now, or died
    doing so and its claim has not expired): try again later."""


class EffectLedger(Protocol):
    """Which side effects have happened, keyed by `(scope, key)` (scope: the tenant), so a
    repeated attempt skips the effects an earlier one completed. See
    `scheduler.worker.context.Context.once` for what this can and cannot guarantee.

    A claim expires `ttl_s` after it is taken unless marked done; a done record is kept
    for the `keep_s` its `done` asks, and at least the ledger's retention (the store's),
    after which the key may run again.
    """

    def claim(self, scope: str, key: str, owner: str, ttl_s: float) -> EffectClaim:
        """Take the claim for `(scope, key)` unless it is done or claimed by another owner
        (an atomic insert-if-absent). Re-claiming one's own claim answers `CLAIMED`."""
        ...

    def done(self, scope: str, key: str, owner: str, keep_s: float = 0.0) -> None:
        """Record the effect as done (durable on return), kept at least `keep_s` and at
        least the ledger's retention (`scheduler.retention.effect_kept_s` is what a task's
        attempt needs). Recording a done record again keeps its first time and end."""
        ...

    def release(self, scope: str, key: str, owner: str) -> None:
        """Drop `owner`'s claim (the effect failed and may be tried again); no error if the
        claim is gone or another's."""
        ...
