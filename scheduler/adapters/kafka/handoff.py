"""The hand-off log on Kafka: the hand-off topic, partition = shard.

`KafkaHandoffLog` is the write side, used by producers (the SDK) for tasks and cancels
due soon: an idempotent `acks=all` producer; `append` returns once every value is
acknowledged, so a task whose hand-off returned cannot be lost by the broker.

`KafkaHandoffReader` is the read side, one per dispatcher. It never subscribes: the
coordinator's leases decide who owns a shard, so the reader is told (`assign`,
`unassign`) and uses manual assignment. Positions are committed explicitly, per shard,
under the consumer group `settings.dispatcher_group` that all dispatchers share; groups
whose members only commit (no subscription) accept commits from any member, so two
readers commit their own shards without interfering, and a new owner's `assign` starts
at what the previous owner committed (from the start of the partition if nobody did).

A shard's life in one reader:

    unassigned --assign--> reading --unassign--> unassigned
                              |  poll: records at and after the position, in order
                              |  commit: the position a next owner starts from

Failures: `QueueError` from `append` when a record is refused or not acknowledged within
`timeout_s` (it may still be stored: appending again makes a duplicate, which the
dispatcher merges by task id); `QueueError` from `poll` when Kafka reports an error for
the topic or a partition (records read before the error are returned first and the
error is raised by the next poll); after one, unassign and assign the shard again to
resume from its committed position. `QueueError` from `commit` when the group
coordinator refuses or cannot be reached. A reader assigned a shard of a topic that does
not exist is not told: it waits in silence, so `check` the topic at start.

`poll` returns as soon as the first record is there (with what else has been fetched),
not after its whole timeout.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

from confluent_kafka import (
    OFFSET_STORED,
    TIMESTAMP_NOT_AVAILABLE,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)

from scheduler.adapters.kafka.errors import ClientErrors
from scheduler.adapters.kafka.security import access_denied, client_config, refusal, topics_missing
from scheduler.adapters.kafka.topics import list_topics
from scheduler.errors import ConfigError, QueueError
from scheduler.model import check_shard_count
from scheduler.ports import HandoffRecord
from scheduler.settings import KafkaSettings

log = logging.getLogger(__name__)

POLL_INTERVAL_S = 0.01
"""How long `append` waits for delivery reports at a time: another thread's `append`
may serve this one's reports, so the wait is short and re-checked."""

PROBE_TIMEOUT_S = 1.0
"""How long the reader's metadata probe of a standing refusal waits (`ClientErrors.
refused_still`): it runs on the fire loop. A probe that a slow broker leaves unanswered
reports the refusal for that tick only; the next ticks read as usual."""


class _Deliveries:
    """The delivery reports of one `append` (served by whichever thread polls)."""

    def __init__(self, expected: int) -> None:
        self.expected = expected
        self.reports: list[KafkaError | None] = []  # list.append is atomic

    def delivered(self, error: KafkaError | None, _message: Message) -> None:
        self.reports.append(error)

    @property
    def pending(self) -> int:
        return self.expected - len(self.reports)


class KafkaHandoffLog:
    """The `HandoffLog` on Kafka. Thread-safe: appends from many threads share one producer."""

    def __init__(self, settings: KafkaSettings, shard_count: int, *, timeout_s: float = 10.0) -> None:
        self.settings = settings
        self.shard_count = check_shard_count(shard_count)
        self._timeout_s = timeout_s
        self._errors = ClientErrors("hand-off producer", "kafka.handoff", log)
        config: dict[str, Any] = {
            **client_config(settings),
            "client.id": "scheduler-handoff",
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 0,
            "error_cb": self._errors,
            "logger": log,
        }
        try:
            self._producer = Producer(config)
        except KafkaException as exc:
            raise ConfigError(f"cannot configure the hand-off producer: {exc}") from exc
        self._errors.serve = lambda: self._serve(0)

    def _serve(self, timeout_s: float) -> None:
        """Serve delivery reports and errors; a fatal error raised from them is kept."""
        try:
            self._producer.poll(timeout_s)
        except (KafkaException, SystemError) as exc:
            if not self._errors.note_raised(exc):
                raise

    def append(self, batches: Sequence[tuple[int, Sequence[bytes]]]) -> None:
        for shard, _values in batches:
            if not 0 <= shard < self.shard_count:
                raise ValueError(f"shard {shard} is outside 0..{self.shard_count - 1}")
        topic = self.settings.handoff_topic
        deliveries = _Deliveries(sum(len(values) for _shard, values in batches))
        if not deliveries.pending:
            return
        try:
            for shard, values in batches:
                for value in values:
                    self._produce(topic, value, shard, deliveries)
        except (KafkaException, SystemError) as exc:
            if not self._errors.note_raised(exc):
                # `produce` says only "fatal error"; the refusal behind it (no producer id
                # for a user that may write to no topic) reaches `error_cb` when served.
                self._errors.raise_denied(self.settings, f"write to {topic}")
                raise QueueError(f"Kafka refused a hand-off record: {exc.args[0] if exc.args else exc}") from exc
        what = f"write to {topic}"
        deadline = time.monotonic() + self._timeout_s
        while deliveries.pending:
            if self._errors.fatal is not None:
                if self._errors.denied is not None:
                    self._errors.raise_denied(self.settings, what)
                raise QueueError(f"the hand-off producer failed for good ({self._errors.fatal}); make a new one")
            if time.monotonic() >= deadline:
                self._errors.raise_denied(self.settings, what)
                raise QueueError(
                    f"{deliveries.pending} of {deliveries.expected} hand-off records are still unacknowledged "
                    f"after {self._timeout_s} s (last error from Kafka at {self.settings.bootstrap}: "
                    f"{self._errors.last or 'none'})"
                )
            self._serve(POLL_INTERVAL_S)
        refused = [error for error in deliveries.reports if error is not None and refusal(error) is not None]
        if refused:
            raise access_denied(self.settings, refusal(refused[0]) or "topic", refused[0].str(), what)
        errors = {str(error) for error in deliveries.reports if error is not None}
        if errors:
            raise QueueError(f"hand-off records were not stored: {'; '.join(sorted(errors))}")
        self._errors.succeeded()

    def _produce(self, topic: str, value: bytes, shard: int, deliveries: _Deliveries) -> None:
        deadline = time.monotonic() + self._timeout_s
        while True:
            try:
                self._producer.produce(topic, value, partition=shard, on_delivery=deliveries.delivered)
                return
            except BufferError:
                if time.monotonic() >= deadline:
                    raise QueueError(
                        f"the hand-off producer's buffer stayed full for {self._timeout_s} s"
                    ) from None
                self._serve(0.05)

    def check(self, timeout_s: float | None = None) -> None:
        """`QueueUnavailable` if no broker answers; `QueueAccessDenied` if the brokers
        refuse this client; `QueueError` if the hand-off topic is missing or does not have
        one partition per shard."""
        metadata = list_topics(self._producer, self.settings, timeout_s, errors=self._errors)
        topic = metadata.topics.get(self.settings.handoff_topic)
        if topic is None or topic.error is not None:
            raise topics_missing(self.settings, [self.settings.handoff_topic])
        if len(topic.partitions) != self.shard_count:
            raise QueueError(
                f"the hand-off topic {self.settings.handoff_topic} has {len(topic.partitions)} partitions, "
                f"not one per shard ({self.shard_count})"
            )

    def close(self) -> None:
        """Release the client. Records not yet acknowledged belong to an `append` that
        failed; they are dropped."""
        self._producer.purge()
        try:
            self._producer.flush(0)
        except (KafkaException, SystemError):
            pass  # a fatal error (a refused producer id, say): nothing is left to send anyway
        self._producer.close()



class KafkaHandoffReader:
    """The `HandoffReader` on Kafka; see the module docstring. One thread at a time."""

    def __init__(self, settings: KafkaSettings, *, member: str) -> None:
        self.settings = settings
        self.member = member
        self._topic = settings.handoff_topic
        self._assigned: set[int] = set()
        self._pending_error: QueueError | None = None
        self._errors = ClientErrors("hand-off consumer", "kafka.handoff.consumer", log)
        config: dict[str, Any] = {
            **client_config(settings),
            "client.id": member,
            "group.id": settings.dispatcher_group,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            # Client-level errors (a broker that went away) go to the callback and are
            # retried by librdkafka; only partition errors come out of poll.
            "error_cb": self._errors,
            "logger": log,
        }
        try:
            self._consumer = Consumer(config)
        except KafkaException as exc:
            raise ConfigError(f"cannot configure the hand-off consumer: {exc}") from exc

    def assign(self, shard: int) -> None:
        """Start reading the shard's partition from its committed position (assigning a
        shard already assigned changes nothing)."""
        if shard < 0:
            raise ValueError(f"shard {shard} is negative")
        if shard in self._assigned:
            return
        try:
            self._consumer.incremental_assign([TopicPartition(self._topic, shard, OFFSET_STORED)])
        except KafkaException as exc:
            raise QueueError(f"cannot assign hand-off shard {shard}: {exc.args[0]}") from exc
        self._assigned.add(shard)

    def unassign(self, shard: int) -> None:
        if shard not in self._assigned:
            return
        self._assigned.discard(shard)
        try:
            self._consumer.incremental_unassign([TopicPartition(self._topic, shard)])
        except KafkaException as exc:
            raise QueueError(f"cannot unassign hand-off shard {shard}: {exc.args[0]}") from exc

    @property
    def assigned(self) -> frozenset[int]:
        return frozenset(self._assigned)

    def check(self, timeout_s: float | None = None) -> None:
        """`QueueUnavailable` if no broker answers; `QueueError` if the hand-off topic is
        missing (a reader assigned a shard of a missing topic would wait in silence)."""
        metadata = list_topics(self._consumer, self.settings, timeout_s, errors=self._errors)
        topic = metadata.topics.get(self._topic)
        if topic is None or topic.error is not None:
            raise topics_missing(self.settings, [self._topic])

    def poll(self, max_records: int, timeout_s: float) -> list[HandoffRecord]:
        if max_records < 1:
            raise ValueError(f"max_records must be positive, got {max_records}")
        if self._pending_error is not None:
            error, self._pending_error = self._pending_error, None
            raise error
        deadline = time.monotonic() + timeout_s
        while True:
            # `consume(n, timeout)` waits the whole timeout unless n messages come, so
            # wait for the first with `poll`, then take what is already fetched.
            self._check_fatal()
            try:
                first = self._consumer.poll(max(0.0, deadline - time.monotonic()))
                if first is None:
                    return []
                messages = [first]
                if max_records > 1:
                    messages += self._consumer.consume(max_records - 1, 0)
            except KafkaException as exc:
                raise QueueError(f"reading the hand-off topic {self._topic} failed: {exc.args[0]}") from exc
            records = self._records(messages)
            if records:
                self._errors.succeeded()
                return records
            if self._pending_error is not None:
                error, self._pending_error = self._pending_error, None
                raise error
            if time.monotonic() >= deadline:
                return []

    def _records(self, messages: list[Message]) -> list[HandoffRecord]:
        """The records of assigned shards; the first error is kept for `poll` to raise."""
        records: list[HandoffRecord] = []
        for message in messages:
            error = message.error()
            if error is not None:
                refused = refusal(error)
                if refused is not None and self._pending_error is None:
                    self._pending_error = access_denied(self.settings, refused, error.str(), f"read {self._topic}")
                elif error.code() != KafkaError._PARTITION_EOF and self._pending_error is None:
                    self._pending_error = QueueError(
                        f"reading the hand-off topic {self._topic} (partition {message.partition()}) "
                        f"failed: {error}"
                    )
                continue
            shard, offset = message.partition(), message.offset()
            if shard in self._assigned and offset is not None:
                kind, stamp = message.timestamp()
                records.append(HandoffRecord(shard, offset, message.value() or b"",
                                             stamp if kind != TIMESTAMP_NOT_AVAILABLE else None))
        return records

    def commit(self, positions: Mapping[int, int]) -> None:
        if not positions:
            return
        offsets = [TopicPartition(self._topic, shard, offset) for shard, offset in positions.items()]
        try:
            results = self._consumer.commit(offsets=offsets, asynchronous=False)
        except KafkaException as exc:
            error = exc.args[0] if exc.args else None
            if (refused := refusal(error)) is not None:
                raise access_denied(self.settings, refused, error,
                                    f"commit positions of group {self.settings.dispatcher_group}") from exc
            raise QueueError(f"committing hand-off positions {dict(positions)} failed: {exc.args[0]}") from exc
        failed = [f"shard {result.partition}: {result.error}" for result in results if result.error is not None]
        if failed:
            raise QueueError(f"committing hand-off positions failed for {'; '.join(failed)}")
        self._errors.succeeded()

    def close(self) -> None:
        self._assigned.clear()
        self._consumer.close()

    def _check_fatal(self) -> None:
        # Checked on every tick of the fire loop: the probe is short, made at most once a
        # connect timeout, and one left unanswered does not stop the next ticks reading.
        if self._errors.refused_still(self.settings.connect_timeout_s,
                                      lambda timeout_s: self._consumer.list_topics(timeout=timeout_s),
                                      probe_timeout_s=min(PROBE_TIMEOUT_S, self.settings.connect_timeout_s),
                                      unanswered_stands=False):
            self._errors.raise_denied(self.settings, f"read {self._topic}")
        if self._errors.fatal is not None:
            raise QueueError(f"the hand-off consumer failed for good ({self._errors.fatal}); make a new one")

