"""How far a worker pool's consumer group is behind on its ready topics, from the
broker: per topic, the messages between the group's committed offsets and the
partitions' ends (a partition the group never committed counts from its start).

Asked by `scheduler status`, not by the workers: it answers also when every worker of
the pool is down, which is when it matters most. Three requests whatever the backlog:
the topics' metadata, the group's committed offsets, the partitions' start and end.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from confluent_kafka import ConsumerGroupTopicPartitions, KafkaException, TopicPartition
from confluent_kafka.admin import OffsetSpec  # type: ignore[attr-defined]

from scheduler.adapters.kafka.topics import admin_client, list_topics
from scheduler.errors import QueueError
from scheduler.settings import KafkaSettings


def consumer_lag(settings: KafkaSettings, groups: Mapping[str, Sequence[str]]) -> dict[str, int]:
    """Topic -> messages its group (`groups`: group -> its topics) has not committed
    past; a topic that does not exist yet is left out."""
    admin, errors = admin_client(settings)
    timeout = settings.connect_timeout_s
    metadata = list_topics(admin, settings, errors=errors)
    lag: dict[str, int] = {}
    try:
        for group, topics in groups.items():
            partitions = [TopicPartition(topic, p) for topic in topics if topic in metadata.topics
                          for p in metadata.topics[topic].partitions]
            if not partitions:
                continue
            committed_future = admin.list_consumer_group_offsets(
                [ConsumerGroupTopicPartitions(group, partitions)], request_timeout=timeout)[group]
            committed = {(tp.topic, tp.partition): tp.offset for tp in committed_future.result(timeout=timeout).topic_partitions}
            ends = _offsets(admin, partitions, OffsetSpec.latest(), timeout)  # type: ignore[no-untyped-call]
            starts = _offsets(admin, partitions, OffsetSpec.earliest(), timeout)  # type: ignore[no-untyped-call]
            for key, end in ends.items():
                position = committed.get(key, -1)
                begin = starts.get(key, 0)
                lag[key[0]] = lag.get(key[0], 0) + max(end - max(position, begin), 0)
    except KafkaException as exc:
        raise QueueError(f"reading the consumer lag failed: {exc}") from exc
    return lag


def _offsets(admin: object, partitions: Sequence[TopicPartition], spec: object, timeout: float) -> dict[tuple[str, int], int]:
    futures = admin.list_offsets({tp: spec for tp in partitions}, request_timeout=timeout)  # type: ignore[attr-defined]
    return {(tp.topic, tp.partition): future.result(timeout=timeout).offset for tp, future in futures.items()}
