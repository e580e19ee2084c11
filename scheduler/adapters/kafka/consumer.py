"""The workers' side of Kafka: `KafkaConsumer`, a member of a consumer group reading the
ready topics, and `KafkaTopicScanner`, which reads a whole topic (dead letters) without
joining any group.

`KafkaConsumer` subscribes with the `roundrobin` assignor, which deals the partitions
of all subscribed topics, in order, to the members in turn, so every topic is spread
evenly: two workers of the default pool each get half of `high`, half of `normal` and
half of `low`. (`cooperative-sticky` balances only the total count, and was seen to give
one worker all of `normal` and the other all of `high`: a burst of one priority then
ran on one worker.) It is an eager protocol: a rebalance revokes every partition from
every member (`on_revoked` hears of all of them) and assigns anew; what was settled is
committed in the callback and the rest is delivered again. Offsets are never stored or committed automatically:
`commit` writes exactly the positions it is given, synchronously.

Group membership and the session: librdkafka heartbeats from a background thread, so
a member that merely stops calling `poll` would keep its partitions for
`max.poll.interval.ms`. The `Consumer` port says a member that stops polling past the
session timeout loses its partitions, so `max.poll.interval.ms` is set to the session
timeout: librdkafka then leaves the group by itself when `poll` is not called in time,
and the next `poll` reports the partitions as lost (to `on_revoked`) and joins again.
Heartbeats go every tenth of the session timeout (at most 3 s), so that a rebalance,
which waits for every member's next heartbeat, completes quickly.

Rebalance callbacks run inside `poll` (librdkafka serves them there): that is where
the port says the assignment changes. `on_revoked` is called while the revoked
partitions are still assigned, so a commit made from it is accepted; partitions *lost*
(the session expired) are dropped from the assignment before `on_revoked` hears of
them, since Kafka would refuse their commits anyway. `close` leaves the group without
calling `on_revoked`: the caller that closes knows.

Failures: `QueueUnavailable` from the constructor (and from `scan`) when no broker
answers within `connect_timeout_s`; `QueueError` from `poll` after a fatal client error,
and from `commit` when the group coordinator refuses it for a reason other than a
rebalance (a commit refused because the group is rebalancing, or because this member
is no longer in the generation, is logged and dropped: those messages are delivered
again to whoever owns the partitions next). Errors Kafka reports for a partition or a
subscribed topic (a topic that does not exist yet) are logged; librdkafka retries.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from confluent_kafka import (
    TIMESTAMP_NOT_AVAILABLE,
    KafkaError,
    KafkaException,
    Message,
)
from confluent_kafka import (
    Consumer as ClientConsumer,
)
from confluent_kafka import (
    TopicPartition as KafkaPartition,
)

from scheduler.adapters.kafka.errors import ClientErrors
from scheduler.adapters.kafka.security import access_denied, client_config, refusal
from scheduler.adapters.kafka.topics import leader_deadline_from_now, list_topics, watermark_offsets
from scheduler.errors import ConfigError, QueueError
from scheduler.ports import Delivery, TopicPartition
from scheduler.settings import KafkaSettings

log = logging.getLogger(__name__)

REBALANCE_REFUSALS = frozenset({
    KafkaError.REBALANCE_IN_PROGRESS,
    KafkaError.ILLEGAL_GENERATION,
    KafkaError.UNKNOWN_MEMBER_ID,
    KafkaError._ASSIGNMENT_LOST,
})
"""Commit refusals that mean "this member's hold on the partitions is changing or gone":
not failures of the queue. The messages are delivered again to the next owner."""

MIN_HEARTBEAT_MS = 100
MAX_HEARTBEAT_MS = 3000


class KafkaConsumer:
    """The `Consumer` port on Kafka; see the module docstring. One thread at a time.

    `session_timeout_s` must lie within the broker's `group.min.session.timeout.ms` and
    `group.max.session.timeout.ms` (6 s and 30 min by default); outside them the broker
    refuses to let the member join, and `poll` raises `ConfigError` (librdkafka would
    retry the join for ever, and the worker would sit idle, looking healthy).
    """

    def __init__(
        self,
        settings: KafkaSettings,
        group: str,
        topics: Sequence[str],
        *,
        member: str,
        on_revoked: Callable[[list[TopicPartition]], None] | None = None,
        session_timeout_s: float = 10.0,
    ) -> None:
        if not topics:
            raise ValueError("a consumer needs at least one topic")
        self.settings = settings
        self.group = group
        self.member = member
        self.session_timeout_s = session_timeout_s
        self._on_revoked = on_revoked
        self._assigned: set[TopicPartition] = set()
        self._paused: set[str] = set()
        self._closed = False
        self._errors = ClientErrors("consumer", "kafka.consumer", log)
        self._last_error: str | None = None
        session_ms = int(session_timeout_s * 1000)
        config: dict[str, Any] = {
            **client_config(settings),
            "group.id": group,
            "client.id": member,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "earliest",
            "partition.assignment.strategy": "roundrobin",
            "session.timeout.ms": session_ms,
            "max.poll.interval.ms": session_ms,
            "heartbeat.interval.ms": max(MIN_HEARTBEAT_MS, min(MAX_HEARTBEAT_MS, session_ms // 10)),
            "error_cb": self._errors,
            "logger": log,
        }
        try:
            self._consumer = ClientConsumer(config)
        except (KafkaException, ValueError, TypeError) as exc:
            raise ConfigError(f"cannot configure the Kafka consumer of group {group}: {exc}") from exc
        # Not subscribed yet: polling serves callbacks and cannot take a message.
        self._errors.serve = lambda: self._consumer.poll(0)
        try:
            # QueueUnavailable or QueueAccessDenied now, rather than silence in poll
            list_topics(self._consumer, settings, errors=self._errors)
            self._errors.serve = None
            try:
                self._consumer.subscribe(
                    list(topics), on_assign=self._assigned_cb, on_revoke=self._revoked_cb, on_lost=self._lost_cb
                )
            except KafkaException as exc:
                raise QueueError(f"cannot subscribe to {', '.join(topics)}: {exc.args[0]}") from exc
        except BaseException:
            self._consumer.close()
            raise

    def poll(self, max_records: int, timeout_s: float) -> list[Delivery]:
        if max_records < 1:
            raise ValueError(f"max_records must be positive, got {max_records}")
        self._check_usable()
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                # `consume(n, timeout)` waits the whole timeout unless n messages come,
                # so wait for the first with `poll`, then take what is already fetched.
                first = self._consumer.poll(max(0.0, deadline - time.monotonic()))
                messages = [first] if first is not None else []
                if first is not None and max_records > 1:
                    messages += self._consumer.consume(max_records - 1, 0)
            except KafkaException as exc:
                error = exc.args[0] if exc.args else None
                if (refused := refusal(error)) is not None:
                    raise access_denied(self.settings, refused, error, f"consume as group {self.group}") from exc
                raise QueueError(f"consuming for group {self.group} failed: {exc.args[0]}") from exc
            self._check_usable()
            deliveries = self._deliveries(messages)
            if deliveries:
                self._errors.succeeded()
            if deliveries or time.monotonic() >= deadline:
                return deliveries

    def _deliveries(self, messages: Iterable[Message]) -> list[Delivery]:
        deliveries: list[Delivery] = []
        for message in messages:
            error = message.error()
            if error is not None:
                self._message_error(error)
                continue
            topic, partition, offset = message.topic(), message.partition(), message.offset()
            if topic is None or partition is None or offset is None or (topic, partition) not in self._assigned:
                continue  # fetched before its partition was revoked
            kind, stamp = message.timestamp()
            deliveries.append(Delivery(topic, partition, offset, message.value() or b"",
                                       stamp if kind != TIMESTAMP_NOT_AVAILABLE else 0))
        return deliveries

    def _message_error(self, error: KafkaError) -> None:
        if error.code() == KafkaError._PARTITION_EOF:
            return
        if (refused := refusal(error)) is not None:
            # librdkafka would retry for ever; the worker would sit idle, looking healthy.
            raise access_denied(self.settings, refused, error.str(), f"consume as group {self.group}")
        if error.fatal():
            raise QueueError(f"the consumer of group {self.group} failed for good ({error}); make a new one")
        if error.code() == KafkaError.INVALID_SESSION_TIMEOUT:
            # librdkafka would retry the join for ever; no retry can succeed.
            raise ConfigError(
                f"the broker refuses the session timeout of group {self.group} ({self.session_timeout_s:g} s): it "
                "must lie within the broker's group.min.session.timeout.ms (6 s by default) and "
                "group.max.session.timeout.ms")
        if error.str() != self._last_error:  # librdkafka repeats it on every retry
            log.warning("consumer of group %s: %s", self.group, error, extra={"action": "kafka.consumer.error"})
        self._last_error = error.str()

    def pause(self, topics: Sequence[str]) -> None:
        self._paused.update(topics)
        self._pause_resume(self._consumer.pause, topics, "pause")

    def resume(self, topics: Sequence[str]) -> None:
        self._paused.difference_update(topics)
        self._pause_resume(self._consumer.resume, topics, "resume")

    def _pause_resume(self, action: Callable[[list[KafkaPartition]], None], topics: Sequence[str], what: str) -> None:
        self._check_usable()
        partitions = [KafkaPartition(topic, partition) for topic, partition in self._assigned if topic in topics]
        if not partitions:
            return
        try:
            action(partitions)
        except KafkaException as exc:
            raise QueueError(f"cannot {what} {', '.join(topics)}: {exc.args[0]}") from exc

    def assignment(self) -> set[TopicPartition]:
        return set(self._assigned)

    def lag(self) -> dict[TopicPartition, int]:
        """From librdkafka's own knowledge, with no request to a broker: each partition's
        fetch position (`position`) and the high watermark that came with its last fetch
        response (`get_watermark_offsets(cached=True)`). A partition with neither yet
        (nothing fetched since it was assigned) is left out; a paused one is fetched no
        more, so its watermark, and its lag, stay where they were when it was paused."""
        self._check_usable()
        held = [KafkaPartition(topic, partition) for topic, partition in sorted(self._assigned)]
        if not held:
            return {}
        try:
            positions = self._consumer.position(held)
        except KafkaException as exc:
            raise QueueError(f"reading the positions of group {self.group} failed: {exc.args[0]}") from exc
        lag: dict[TopicPartition, int] = {}
        for tp in positions:
            if tp.offset < 0:  # no position yet (OFFSET_INVALID)
                continue
            try:
                _low, high = self._consumer.get_watermark_offsets(tp, cached=True)
            except KafkaException:
                continue
            if high >= 0:
                lag[(tp.topic, tp.partition)] = max(high - tp.offset, 0)
        return lag

    def commit(self, positions: Mapping[TopicPartition, int]) -> None:
        self._check_usable()
        offsets = [
            KafkaPartition(topic, partition, offset)
            for (topic, partition), offset in positions.items()
            if (topic, partition) in self._assigned
        ]
        if not offsets:
            return
        try:
            results = self._consumer.commit(offsets=offsets, asynchronous=False)
        except KafkaException as exc:
            error = exc.args[0] if exc.args else None
            if isinstance(error, KafkaError) and error.code() in REBALANCE_REFUSALS:
                self._dropped(offsets, error)
                return
            if (denied := refusal(error)) is not None:
                raise access_denied(self.settings, denied, error, f"commit positions of group {self.group}") from exc
            raise QueueError(f"committing positions of group {self.group} failed: {error or exc}") from exc
        failed = [(result, result.error) for result in results if result.error is not None]
        refused = [
            f"{tp.topic}[{tp.partition}]: {error}" for tp, error in failed if error.code() not in REBALANCE_REFUSALS
        ]
        for _tp, error in failed:
            if (denied := refusal(error)) is not None:
                raise access_denied(self.settings, denied, error.str(), f"commit positions of group {self.group}")
        if refused:
            raise QueueError(f"committing positions of group {self.group} failed for {'; '.join(refused)}")
        if failed:
            self._dropped([tp for tp, _error in failed], failed[0][1])
        else:
            self._errors.succeeded()

    def _dropped(self, offsets: list[KafkaPartition], error: KafkaError) -> None:
        log.info(
            "commit of %s by %s dropped (%s): a rebalance took them; they will be delivered again",
            ", ".join(f"{tp.topic}[{tp.partition}]@{tp.offset}" for tp in offsets), self.member, error,
            extra={"action": "kafka.consumer.commit_dropped"},
        )

    def close(self) -> None:
        """Leave the group at once (no commit, no `on_revoked`)."""
        if self._closed:
            return
        self._closed = True
        try:
            self._consumer.close()
        except KafkaException as exc:
            raise QueueError(f"closing the consumer of group {self.group} failed: {exc.args[0]}") from exc
        finally:
            self._assigned.clear()

    # Rebalance callbacks, run by librdkafka inside `poll` (and `close`).

    def _assigned_cb(self, consumer: ClientConsumer, partitions: list[KafkaPartition]) -> None:
        consumer.assign(partitions)  # eager: the whole new assignment
        self._assigned = {(tp.topic, tp.partition) for tp in partitions}
        paused = [tp for tp in partitions if tp.topic in self._paused]
        if paused:
            consumer.pause(paused)

    def _revoked_cb(self, consumer: ClientConsumer, partitions: list[KafkaPartition]) -> None:
        """Tell the caller while the partitions are still assigned (its commits count),
        then give them up, even if the caller's callback raised."""
        taken = sorted((tp.topic, tp.partition) for tp in partitions)
        try:
            if self._on_revoked is not None and taken and not self._closed:
                self._on_revoked(taken)
        finally:
            self._assigned.difference_update(taken)
            consumer.unassign()

    def _lost_cb(self, consumer: ClientConsumer, partitions: list[KafkaPartition]) -> None:
        """The session expired: others may own the partitions already, so they leave the
        assignment (their commits would be refused) before the caller hears of them."""
        lost = sorted((tp.topic, tp.partition) for tp in partitions)
        self._assigned.difference_update(lost)
        log.warning("%s lost %s: its session expired", self.member, lost, extra={"action": "kafka.consumer.lost"})
        try:
            if self._on_revoked is not None and lost and not self._closed:
                self._on_revoked(lost)
        finally:
            consumer.unassign()

    def _check_usable(self) -> None:
        if self._closed:
            raise QueueError(f"the consumer of group {self.group} is closed")
        if self._errors.refused_still(self.settings.connect_timeout_s,
                                      lambda timeout_s: self._consumer.list_topics(timeout=timeout_s)):
            self._errors.raise_denied(self.settings, f"consume as group {self.group}")
        if self._errors.fatal is not None:
            raise QueueError(
                f"the consumer of group {self.group} failed for good ({self._errors.fatal}); make a new one"
            )


class KafkaTopicScanner:
    """The `TopicScanner` on Kafka: each `scan` opens a consumer of a throwaway group,
    assigns every partition of the topic from its low watermark, reads up to the high
    watermarks taken at the start, and closes. It never commits, so no group's
    positions change.

    With `limit`, each partition is read up to `limit` messages and the result is the
    first `limit` in (partition, offset) order, as the embedded scanner returns them.
    """

    def __init__(self, settings: KafkaSettings, *, timeout_s: float = 30.0) -> None:
        self.settings = settings
        self.timeout_s = timeout_s
        """How long one scan may take to read up to the watermarks."""

    def scan(self, topic: str, *, limit: int | None = None) -> list[Delivery]:
        if limit is not None and limit < 0:
            raise ValueError(f"limit must not be negative, got {limit}")
        errors = ClientErrors("scanner", "kafka.scanner", log)
        config: dict[str, Any] = {
            **client_config(self.settings),
            "error_cb": errors,
            # Never joined nor committed to (partitions are assigned by hand): a name of
            # its own only so that no other group's state can be touched.
            "group.id": f"{self.settings.topic_prefix}.scan.{uuid.uuid4().hex}",
            "client.id": "scheduler-scanner",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            # End of a partition reached: it is done even if its last offsets before the
            # high watermark are not messages (transaction markers).
            "enable.partition.eof": True,
            "logger": log,
        }
        consumer = ClientConsumer(config)
        errors.serve = lambda: consumer.poll(0)  # only before the partitions are assigned
        try:
            return self._scan(consumer, topic, limit, errors)
        except KafkaException as exc:
            error = exc.args[0] if exc.args else None
            if (refused := refusal(error)) is not None:
                raise access_denied(self.settings, refused, error, f"read {topic}") from exc
            raise QueueError(f"scanning {topic} on Kafka at {self.settings.bootstrap} failed: {exc.args[0]}") from exc
        finally:
            consumer.close()

    def _scan(self, consumer: ClientConsumer, topic: str, limit: int | None, errors: ClientErrors) -> list[Delivery]:
        metadata = list_topics(consumer, self.settings, errors=errors).topics.get(topic)
        errors.serve = None
        if metadata is None or metadata.error is not None or limit == 0:
            return []
        ends: dict[int, int] = {}
        starts: list[KafkaPartition] = []
        leader_deadline = leader_deadline_from_now(self.settings)  # one for all its partitions
        for number in sorted(metadata.partitions):
            low, high = watermark_offsets(consumer, self.settings, topic, number, leader_deadline=leader_deadline)
            if limit is not None:
                high = min(high, low + limit)
            if high > low:
                ends[number] = high
                starts.append(KafkaPartition(topic, number, low))
        if not starts:
            return []
        consumer.assign(starts)
        deliveries: list[Delivery] = []
        reading = set(ends)
        deadline = time.monotonic() + self.timeout_s
        while reading:
            if time.monotonic() >= deadline:
                raise QueueError(f"scanning {topic} did not reach its end within {self.timeout_s} s")
            for message in consumer.consume(1000, 0.1):
                error, partition, offset = message.error(), message.partition(), message.offset()
                if partition is None or partition not in reading:
                    continue
                if error is not None:
                    if (refused := refusal(error)) is not None:
                        raise access_denied(self.settings, refused, error.str(), f"read {topic}")
                    if error.code() != KafkaError._PARTITION_EOF:
                        raise QueueError(f"scanning {topic} failed: {error}")
                    reading.discard(partition)
                    continue
                if offset is None or offset >= ends[partition]:
                    reading.discard(partition)
                    continue
                kind, stamp = message.timestamp()
                deliveries.append(Delivery(topic, partition, offset, message.value() or b"",
                                           stamp if kind != TIMESTAMP_NOT_AVAILABLE else 0))
                if offset + 1 >= ends[partition]:
                    reading.discard(partition)
        deliveries.sort(key=lambda delivery: (delivery.partition, delivery.offset))
        return deliveries if limit is None else deliveries[:limit]
