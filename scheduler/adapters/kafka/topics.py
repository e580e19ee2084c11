"""Creating and removing the scheduler's topics.

`ensure_topics` makes, if they are missing, the four ready topics, the dead-letter topic
and the hand-off topic, and returns once the broker's metadata lists all six. It is
idempotent and safe to run from several processes at once. Topics that exist are left
as they are, except that the hand-off topic must have exactly one partition per shard
(its partition is the shard): another count is a `ConfigError`, raised before anything
is created.

Topics are made with a stated `retention.ms` (`QUEUE_RETENTION_MS`, and
`DEAD_LETTER_RETENTION_MS` for dead letters) rather than whatever the broker's default
is; topics that exist keep theirs (`kafka-configs --alter` changes it).

Topics get the broker's default replication factor (`default.replication.factor`) and
`min.insync.replicas`: with `acks=all`, a message is then acknowledged once every
in-sync replica has it.

Failures: `QueueUnavailable` when no broker answers within `connect_timeout_s`,
`QueueAccessDenied` when the brokers refuse the scheduler's credentials, TLS or ACLs,
`QueueError` when Kafka refuses to create or delete a topic for another reason.
"""

from __future__ import annotations

import concurrent.futures
import logging
import time
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, ClusterMetadata, NewTopic  # type: ignore[attr-defined]

from scheduler.adapters.kafka.errors import ClientErrors
from scheduler.adapters.kafka.security import access_denied, client_config, refusal
from scheduler.errors import ConfigError, QueueError, QueueUnavailable
from scheduler.model import check_shard_count
from scheduler.settings import (
    DEAD_LETTER_RETENTION_MS,
    QUEUE_RETENTION_MS,
    READY_PARTITIONS,
    READY_TOPICS,
    KafkaSettings,
)

log = logging.getLogger(__name__)

WATERMARK_RETRY_S = 0.2
"""Pause between asks for a partition's watermarks while it has no leader."""
LEADER_PATIENCE_S = 60.0
"""How long a broker that answers may say a topic's partitions have no leader yet before
a scan gives up. A broker on a busy disk makes a new topic's partitions, or loads them
after a restart, over seconds; it is reachable all the while, so this is not the connect
timeout."""
_NO_LEADER_YET = frozenset({
    KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.REPLICA_NOT_AVAILABLE,
    KafkaError.OFFSET_NOT_AVAILABLE,  # a new leader whose high watermark has not caught up
    # The client's metadata names no leader (-1) for the partition: librdkafka answers
    # this without asking a broker. Only partitions just listed are asked, so it is no
    # partition that does not exist.
    KafkaError._UNKNOWN_PARTITION,
    KafkaError.UNKNOWN_TOPIC_OR_PART,  # a broker whose metadata is behind the one that listed it
})
METADATA_REFRESH_S = 2.0
"""The longest a fresh ask for a topic's leaders may take between two asks for a
partition's watermarks (its answer only refreshes what the client knows)."""

REFUSAL_CHECK_S = 0.5
"""How often a metadata request that has no answer yet looks for a refusal among the
client's errors: a refused login makes librdkafka retry until the request times out."""

USE_BROKER_DEFAULT = -1
"""Replication factor -1: the broker's `default.replication.factor`."""


def wanted_topics(settings: KafkaSettings, *, shard_count: int, ready_partitions: int) -> dict[str, int]:
    """Every topic of a deployment and its partition count."""
    topics = {settings.ready_topic(name): ready_partitions for name in READY_TOPICS}
    topics[settings.dead_letter_topic] = ready_partitions
    topics[settings.handoff_topic] = shard_count
    return topics


def retention_ms(settings: KafkaSettings, topic: str) -> int:
    """The `retention.ms` a topic of the deployment is made with."""
    return DEAD_LETTER_RETENTION_MS if topic == settings.dead_letter_topic else QUEUE_RETENTION_MS


def ensure_topics(settings: KafkaSettings, *, shard_count: int, ready_partitions: int = READY_PARTITIONS) -> None:
    """Create whichever of the scheduler's topics are missing; see the module docstring."""
    check_shard_count(shard_count)
    if ready_partitions < 1:
        raise ConfigError(f"ready topics need at least one partition, got {ready_partitions}")
    wanted = wanted_topics(settings, shard_count=shard_count, ready_partitions=ready_partitions)
    admin, errors = admin_client(settings)
    existing = _partition_counts(admin, settings, errors)
    _check_handoff(settings, existing, shard_count)
    missing = [
        NewTopic(name, num_partitions=count, replication_factor=USE_BROKER_DEFAULT,
                 config={"retention.ms": str(retention_ms(settings, name))})
        for name, count in wanted.items()
        if name not in existing
    ]
    if missing:
        futures = admin.create_topics(
            missing, request_timeout=settings.connect_timeout_s, operation_timeout=settings.connect_timeout_s
        )
        for name, future in futures.items():
            _wait(future, settings, f"create topic {name}", tolerate=KafkaError.TOPIC_ALREADY_EXISTS, errors=errors)
            log.info("created topic %s", name, extra={"action": "kafka.topic.create", "topic": name})
    # Creation is asynchronous: wait until the broker's metadata shows every topic, so
    # that a producer started next finds them.
    deadline = time.monotonic() + settings.connect_timeout_s
    while True:
        existing = _partition_counts(admin, settings, errors)
        _check_handoff(settings, existing, shard_count)
        absent = sorted(name for name in wanted if name not in existing)
        if not absent:
            return
        if time.monotonic() >= deadline:
            raise QueueError(
                f"topics {', '.join(absent)} were created on Kafka at {settings.bootstrap} but its metadata "
                f"still does not list them after {settings.connect_timeout_s} s; run ensure_topics again"
            )
        time.sleep(0.05)


def delete_topics(settings: KafkaSettings) -> None:
    """Delete the deployment's topics and the dispatchers' committed positions (the
    consumer group), whichever exist. Everything waiting in them is lost: for tests and
    for tearing a deployment down."""
    admin, errors = admin_client(settings)
    existing = _partition_counts(admin, settings, errors)
    names = [
        name
        for name in wanted_topics(settings, shard_count=1, ready_partitions=1)
        if name in existing
    ]
    if names:
        futures = admin.delete_topics(names, request_timeout=settings.connect_timeout_s,
                                      operation_timeout=settings.connect_timeout_s)
        for name, future in futures.items():
            _wait(future, settings, f"delete topic {name}", tolerate=KafkaError.UNKNOWN_TOPIC_OR_PART, errors=errors)
    group = settings.dispatcher_group
    # The group's coordinator may be moving or loading (or, on a new cluster, the
    # offsets topic still being made): asked again while the broker says so.
    deadline = time.monotonic() + settings.connect_timeout_s
    while True:
        futures = admin.delete_consumer_groups([group], request_timeout=settings.connect_timeout_s)
        try:
            _wait(futures[group], settings, f"delete consumer group {group}", tolerate=KafkaError.GROUP_ID_NOT_FOUND,
                  errors=errors)
            return
        except QueueError as exc:
            cause = exc.__cause__.args[0] if isinstance(exc.__cause__, KafkaException) and exc.__cause__.args else None
            moving = isinstance(cause, KafkaError) and cause.code() in COORDINATOR_MOVING
            if not moving or time.monotonic() >= deadline:
                raise
        time.sleep(COORDINATOR_RETRY_S)


COORDINATOR_MOVING = frozenset({KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_NOT_AVAILABLE,
                                KafkaError.COORDINATOR_LOAD_IN_PROGRESS})
"""Answers about a consumer group's coordinator that a moment's wait resolves."""

COORDINATOR_RETRY_S = 0.2


def admin_client(settings: KafkaSettings) -> tuple[AdminClient, ClientErrors]:
    """An admin client of the brokers, connected as the settings say, and its errors."""
    errors = ClientErrors("admin client", "kafka.admin", log)
    # The logger keeps librdkafka's own log lines (one per refused connection) off stderr.
    config: dict[str, Any] = {**client_config(settings), "logger": log, "error_cb": errors}
    admin = AdminClient(config)
    errors.serve = lambda: admin.poll(0)
    return admin, errors


def _partition_counts(admin: AdminClient, settings: KafkaSettings, errors: ClientErrors) -> dict[str, int]:
    """Partition count of every topic the broker lists (topics in error left out)."""
    metadata = list_topics(admin, settings, errors=errors)
    return {name: len(topic.partitions) for name, topic in metadata.topics.items() if topic.error is None}


def list_topics(client: Any, settings: KafkaSettings, timeout_s: float | None = None, *,
                errors: ClientErrors | None = None) -> ClusterMetadata:
    """The cluster's metadata through `client` (admin, producer or consumer), or
    `QueueUnavailable` naming the bootstrap address if no broker answers in time. With
    the client's `errors`, a refusal (credentials, TLS) is `QueueAccessDenied` as soon
    as librdkafka reports it, rather than a timeout."""
    timeout = settings.connect_timeout_s if timeout_s is None else timeout_s
    deadline = time.monotonic() + timeout
    what = "fetch the cluster's metadata"
    while True:
        remaining = deadline - time.monotonic()
        step = remaining if errors is None else min(remaining, REFUSAL_CHECK_S)
        try:
            metadata: ClusterMetadata = client.list_topics(timeout=max(step, 0.01))
            if errors is not None:
                errors.succeeded()
            return metadata
        except KafkaException as exc:
            if errors is not None:
                errors.raise_denied(settings, what)
            error = exc.args[0] if exc.args else None
            if (refused := refusal(error)) is not None:
                raise access_denied(settings, refused, error, what) from exc
            if errors is None or time.monotonic() >= deadline:
                raise unavailable(settings, timeout, exc) from exc


def leader_deadline_from_now(settings: KafkaSettings) -> float:
    """The `time.monotonic()` until which `watermark_offsets` waits out partitions
    without a leader: `LEADER_PATIENCE_S` from now, never less than the connect timeout."""
    return time.monotonic() + max(settings.connect_timeout_s, LEADER_PATIENCE_S)


def watermark_offsets(consumer: Any, settings: KafkaSettings, topic: str, partition: int, *,
                      leader_deadline: float | None = None) -> tuple[int, int]:
    """The (low, high) watermarks of one partition, asked of its leader.

    A partition can be without a leader that serves it, just after its topic was made or
    while a broker that led it restarts; the answer is then `NOT_LEADER_FOR_PARTITION`,
    `LEADER_NOT_AVAILABLE` or the like, asked again, after the topic's metadata is fetched
    afresh (a client can keep asking a broker that no longer or not yet leads it), until
    `leader_deadline` (a `time.monotonic()` value; by default `LEADER_PATIENCE_S` from now:
    a scan of many partitions passes one deadline for them all). A refusal is
    `QueueAccessDenied`; no answer within `connect_timeout_s`, or any other error,
    `QueueUnavailable`."""
    started = time.monotonic()
    if leader_deadline is None:
        leader_deadline = leader_deadline_from_now(settings)
    while True:
        try:
            low, high = consumer.get_watermark_offsets(
                TopicPartition(topic, partition), timeout=settings.connect_timeout_s
            )
            return int(low), int(high)
        except KafkaException as exc:
            error = exc.args[0] if exc.args else None
            if (refused := refusal(error)) is not None:
                raise access_denied(settings, refused, error, f"read the offsets of {topic}") from exc
            if not (isinstance(error, KafkaError) and error.code() in _NO_LEADER_YET):
                raise unavailable(settings, settings.connect_timeout_s, error) from exc
            if time.monotonic() + WATERMARK_RETRY_S >= leader_deadline:
                raise QueueUnavailable(
                    f"partition {partition} of {topic} on Kafka at {settings.bootstrap} still had no leader that "
                    f"serves it after {time.monotonic() - started:.0f} s ({error}): check the brokers' logs for "
                    "that partition"
                ) from exc
        time.sleep(WATERMARK_RETRY_S)
        try:  # ask for the topic's leaders afresh: the answer came from what the client last knew
            consumer.list_topics(topic, timeout=METADATA_REFRESH_S)
        except KafkaException:
            pass  # the next ask says what is wrong


def unavailable(settings: KafkaSettings, timeout_s: float, cause: object) -> QueueUnavailable:
    hint = ("" if settings.tls is not None and settings.username is not None else
            " If its brokers take only TLS or SASL connections, set SCHEDULER_KAFKA_TLS_CA and "
            "SCHEDULER_KAFKA_USERNAME/_PASSWORD_FILE: a plain connection to such a listener is dropped unanswered.")
    return QueueUnavailable(
        f"cannot reach Kafka at {settings.bootstrap} within {timeout_s} s ({cause}). Is it running? For the "
        "local cluster run `python deploy/local/cluster.py start`; elsewhere set SCHEDULER_KAFKA_BOOTSTRAP." + hint
    )


def _check_handoff(settings: KafkaSettings, existing: dict[str, int], shard_count: int) -> None:
    count = existing.get(settings.handoff_topic)
    if count is not None and count != shard_count:
        raise ConfigError(
            f"the hand-off topic {settings.handoff_topic} has {count} partitions but the scheduler runs "
            f"{shard_count} shards: its partition is the shard, so the two must be equal. Use the shard count "
            "the topics were made for, or another topic prefix (SCHEDULER_TOPIC_PREFIX); Kafka cannot take "
            "partitions away from a topic."
        )


def _wait(future: concurrent.futures.Future[None], settings: KafkaSettings, what: str, *, tolerate: int,
          errors: ClientErrors) -> None:
    """The outcome of one admin operation; the error code `tolerate` counts as done."""
    try:
        future.result(timeout=2 * settings.connect_timeout_s)
    except concurrent.futures.TimeoutError as exc:
        errors.raise_denied(settings, what)
        raise unavailable(settings, 2 * settings.connect_timeout_s, f"no answer to: {what}") from exc
    except KafkaException as exc:
        error = exc.args[0] if exc.args else None
        if isinstance(error, KafkaError):
            if error.code() == tolerate:
                return
            if (refused := refusal(error)) is not None:
                raise access_denied(settings, refused, error.str(), what) from exc
            if error.code() in (KafkaError._TRANSPORT, KafkaError._TIMED_OUT, KafkaError._ALL_BROKERS_DOWN):
                errors.raise_denied(settings, what)
                raise unavailable(settings, settings.connect_timeout_s, error) from exc
        raise QueueError(f"Kafka at {settings.bootstrap} refused to {what}: {error or exc}") from exc
