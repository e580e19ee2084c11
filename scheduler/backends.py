"""Opens the configured backend's adapters: the task store, and beside it the schedules,
the limits and the producer's hand-off; everything a dispatcher or a worker talks to; the
dead-letter topic. `BackendSettings` says which backend and where its files or servers
are (`scheduler.connecting.backend_settings` resolves them from arguments and
`SCHEDULER_*` variables). The one place that picks drivers, and only when something is
opened: importing this module loads none.

`scheduler.connect` opens a producer's store and hand-off here, and the processes and
commands of `scheduler.cli` open theirs here too, so an application and the CLI wire a
backend the same way. Each `open_*` is a context manager that closes what it opened,
also when opening a later part fails. The backends:

- `embedded`: the SQLite task store (`--db`), a SQLite log beside it (`queue.db`) and a
  SQLite coordinator (`coordinator.db`); processes on one machine share all three.
- `cassandra`: the distributed backend, i.e. Cassandra for tasks, Kafka for the ready
  topics and the hand-off, ZooKeeper for leases.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypeVar, cast

from scheduler.dispatcher.rows import topic_tags
from scheduler.errors import ConfigError, QueueAccessDenied, QueueError, QueueUnavailable
from scheduler.handoff import LogHandoff
from scheduler.ports import (
    Consumer,
    Coordinator,
    CountStore,
    EffectLedger,
    Handoff,
    HandoffReader,
    LimitsStore,
    Publisher,
    ScheduleStore,
    TaskStore,
    TopicPartition,
    TopicScanner,
    WorkflowStore,
)
from scheduler.settings import READY_TOPICS, CassandraSettings, KafkaSettings, ZooKeeperSettings

if TYPE_CHECKING:
    from scheduler.adapters.cassandra.store import CassandraTaskStore

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BackendSettings:
    backend: str
    db: Path
    cassandra: CassandraSettings
    kafka: KafkaSettings
    zookeeper: ZooKeeperSettings

    @property
    def queue_path(self) -> Path:
        return self.db.with_name("queue.db")

    @property
    def coordinator_path(self) -> Path:
        return self.db.with_name("coordinator.db")

    def topics(self) -> dict[int, str]:
        """Wheel tag -> ready topic."""
        return topic_tags({name: self.kafka.ready_topic(name) for name in READY_TOPICS})


@contextmanager
def open_store(settings: BackendSettings) -> Iterator[TaskStore]:
    store: TaskStore
    if settings.backend == "embedded":
        from scheduler.adapters.embedded.store import SqliteTaskStore

        store = SqliteTaskStore(settings.db, shard_count=settings.cassandra.shard_count)
    else:
        from scheduler.adapters.cassandra.store import CassandraTaskStore

        store = CassandraTaskStore.open(settings.cassandra)
    try:
        yield store
    finally:
        store.close()


class _Closable(Protocol):
    def close(self) -> None: ...


C = TypeVar("C", bound=_Closable)


@contextmanager
def _beside(settings: BackendSettings, store: TaskStore, embedded: Callable[[], C],
            cassandra: Callable[[CassandraTaskStore], C]) -> Iterator[C]:
    """A store that lives beside `store`'s tasks: made by `embedded()` on the embedded
    backend, by `cassandra(store)` (its keyspace and session) on Cassandra; closed after.
    The backend is told by the settings, so the embedded one never imports the driver."""
    opened = embedded() if settings.backend == "embedded" else cassandra(cast("CassandraTaskStore", store))
    try:
        yield opened
    finally:
        opened.close()


def open_schedules(settings: BackendSettings, store: TaskStore) -> AbstractContextManager[ScheduleStore]:
    """The recurring schedules of this backend, beside `store`'s tasks (its file, or its
    keyspace and session)."""
    def embedded() -> ScheduleStore:
        from scheduler.adapters.embedded.schedules import SqliteScheduleStore

        return SqliteScheduleStore(settings.db, shard_count=store.shard_count)

    def cassandra(tasks: CassandraTaskStore) -> ScheduleStore:
        from scheduler.adapters.cassandra.schedules import CassandraScheduleStore

        return CassandraScheduleStore.for_store(tasks)

    return _beside(settings, store, embedded, cassandra)


def open_workflows(settings: BackendSettings, store: TaskStore) -> AbstractContextManager[WorkflowStore]:
    """The workflows of this backend, beside `store`'s tasks (its file, or its keyspace
    and session)."""
    def embedded() -> WorkflowStore:
        from scheduler.adapters.embedded.workflows import SqliteWorkflowStore

        return SqliteWorkflowStore(settings.db, retention_s=store.retention_s)

    def cassandra(tasks: CassandraTaskStore) -> WorkflowStore:
        from scheduler.adapters.cassandra.workflows import CassandraWorkflowStore

        return CassandraWorkflowStore.for_store(tasks)

    return _beside(settings, store, embedded, cassandra)


def open_limits(settings: BackendSettings, store: TaskStore) -> AbstractContextManager[LimitsStore]:
    """The fairness limits of this backend, beside `store`'s tasks (its file, or its
    keyspace and session)."""
    def embedded() -> LimitsStore:
        from scheduler.adapters.embedded.limits import SqliteLimitsStore

        return SqliteLimitsStore(settings.db)

    def cassandra(tasks: CassandraTaskStore) -> LimitsStore:
        from scheduler.adapters.cassandra.limits import CassandraLimitsStore

        return CassandraLimitsStore.for_store(tasks)

    return _beside(settings, store, embedded, cassandra)


def open_counts(settings: BackendSettings, store: TaskStore) -> AbstractContextManager[CountStore]:
    """The counts `scheduler status` reads (`scheduler.visibility`): on the embedded
    backend a file of their own beside the tasks (`counts.db`), on Cassandra tables in
    the task store's keyspace, on its session."""
    def embedded() -> CountStore:
        from scheduler.adapters.embedded.counts import SqliteCountStore, counts_path

        return SqliteCountStore(counts_path(settings.db))

    def cassandra(tasks: CassandraTaskStore) -> CountStore:
        from scheduler.adapters.cassandra.counts import CassandraCountStore

        return CassandraCountStore.for_store(tasks)

    return _beside(settings, store, embedded, cassandra)


@contextmanager
def open_handoff(settings: BackendSettings, shard_count: int, *, check: bool = False) -> Iterator[Handoff]:
    """The producer's hand-off to the dispatchers of this backend.

    With `check`, Kafka is asked for its metadata first: `QueueUnavailable` if no broker
    answers. A hand-off topic that is missing, or has another partition count than
    `shard_count`, is logged as a warning and not raised: tasks due later need no
    hand-off, and the dispatchers create the topics when they start."""
    if settings.backend == "embedded":
        from scheduler.adapters.embedded.queue import SqliteQueue

        queue = SqliteQueue(settings.queue_path, handoff_topic=settings.kafka.handoff_topic,
                        dead_letter_topic=settings.kafka.dead_letter_topic)
        try:
            yield LogHandoff(queue.handoff_log(shard_count), shard_count)
        finally:
            queue.close()
    else:
        from scheduler.adapters.kafka.handoff import KafkaHandoffLog

        handoff_log = KafkaHandoffLog(settings.kafka, shard_count)
        try:
            if check:
                try:
                    handoff_log.check()
                except (QueueUnavailable, QueueAccessDenied):
                    raise
                except QueueError as exc:  # the topic is missing or has another partition count
                    log.warning("%s; until it is right, a submit of a task due soon fails with HandoffFailed", exc,
                                extra={"action": "handoff_topic_missing"})
            yield LogHandoff(handoff_log, shard_count)
        finally:
            handoff_log.close()


@dataclass
class DispatcherParts:
    store: TaskStore
    coordinator: Coordinator
    publisher: Publisher
    handoff_reader: HandoffReader
    topics: dict[int, str]
    schedules: ScheduleStore
    handoff: Handoff
    """Where the runs of recurring schedules that fall due soon are handed to their shard's owner."""
    limits: LimitsStore
    """The tenants' weights, caps and rates."""
    counts: CountStore
    """Where the dispatcher's counts and heartbeat go (`scheduler status`)."""
    purgers: dict[str, Callable[[int, int], int]] = field(default_factory=dict)
    """What deletes rows past their retention, by name (`scheduler.dispatcher.purge`): the
    embedded backend's task store, queue and ended workflows. None on Cassandra and Kafka, whose TTLs and
    `retention.ms` expire their own."""


@contextmanager
def open_dispatcher_parts(settings: BackendSettings, member: str) -> Iterator[DispatcherParts]:
    """Everything a dispatcher talks to, checked reachable (`StoreUnavailable`,
    `QueueUnavailable`; the coordinator is checked when the dispatcher joins it)."""
    with ExitStack() as stack:
        store = stack.enter_context(open_store(settings))
        schedules = stack.enter_context(open_schedules(settings, store))
        limits = stack.enter_context(open_limits(settings, store))
        counts = stack.enter_context(open_counts(settings, store))
        handoff = stack.enter_context(open_handoff(settings, store.shard_count))
        coordinator: Coordinator
        publisher: Publisher
        reader: HandoffReader
        purgers: dict[str, Callable[[int, int], int]] = {}
        if settings.backend == "embedded":
            from scheduler.adapters.embedded.coordinator import SqliteCoordinator
            from scheduler.adapters.embedded.queue import SqliteQueue
            from scheduler.adapters.embedded.workflows import SqliteWorkflowStore

            queue = SqliteQueue(settings.queue_path, handoff_topic=settings.kafka.handoff_topic,
                        dead_letter_topic=settings.kafka.dead_letter_topic)
            stack.callback(queue.close)
            publisher = queue.publisher()
            reader = queue.handoff_reader(settings.kafka.dispatcher_group)
            coordinator = SqliteCoordinator(settings.coordinator_path,
                                            session_timeout_s=settings.zookeeper.session_timeout_s)
            workflows = SqliteWorkflowStore(settings.db, retention_s=store.retention_s)
            stack.callback(workflows.close)
            purgers = {"task store": store.purge_expired, "queue": queue.purge_expired,
                       "workflows": workflows.purge_expired}
        else:
            from scheduler.adapters.kafka.handoff import KafkaHandoffReader
            from scheduler.adapters.kafka.publisher import KafkaPublisher
            from scheduler.adapters.kafka.topics import ensure_topics
            from scheduler.adapters.zookeeper.coordinator import ZkCoordinator

            ensure_topics(settings.kafka, shard_count=store.shard_count)
            kafka_publisher = KafkaPublisher(settings.kafka, client_id=member)
            stack.callback(kafka_publisher.close)
            kafka_publisher.check()
            publisher = kafka_publisher
            reader = KafkaHandoffReader(settings.kafka, member=member)
            coordinator = ZkCoordinator(settings.zookeeper)
        stack.callback(reader.close)
        stack.callback(coordinator.close)
        yield DispatcherParts(store, coordinator, publisher, reader, settings.topics(), schedules, handoff, limits,
                              counts, purgers)


POOL_TOPICS = {"default": ("high", "normal", "low"), "long": ("long",)}
"""The ready topics each worker pool consumes (short names)."""


@dataclass
class WorkerParts:
    store: TaskStore
    ledger: EffectLedger
    publisher: Publisher
    handoff: Handoff
    consumer_factory: Callable[[Callable[[list[TopicPartition]], None]], Consumer]
    topics: dict[str, str]
    """Short name -> ready topic, of the pool's topics."""
    dead_letter_topic: str
    counts: CountStore
    """Where the worker's counts and heartbeat go (`scheduler status`)."""
    workflows: WorkflowStore
    """The workflows whose steps the worker runs (`scheduler.workflows`)."""


@contextmanager
def open_worker_parts(settings: BackendSettings, member: str, pool: str,
                      session_timeout_s: float = 10.0) -> Iterator[WorkerParts]:
    """Everything a worker of `pool` talks to, checked reachable."""
    if pool not in POOL_TOPICS:
        raise ConfigError(f"unknown pool {pool!r}: use one of {', '.join(POOL_TOPICS)}")
    topics = {name: settings.kafka.ready_topic(name) for name in POOL_TOPICS[pool]}
    group = settings.kafka.worker_group(pool)
    with ExitStack() as stack:
        store = stack.enter_context(open_store(settings))
        counts = stack.enter_context(open_counts(settings, store))
        workflows = stack.enter_context(open_workflows(settings, store))
        handoff = stack.enter_context(open_handoff(settings, store.shard_count))
        ledger: EffectLedger
        publisher: Publisher
        consumer_factory: Callable[[Callable[[list[TopicPartition]], None]], Consumer]
        if settings.backend == "embedded":
            from scheduler.adapters.embedded.effects import SqliteEffectLedger
            from scheduler.adapters.embedded.queue import SqliteQueue

            queue = SqliteQueue(settings.queue_path, handoff_topic=settings.kafka.handoff_topic,
                        dead_letter_topic=settings.kafka.dead_letter_topic)
            stack.callback(queue.close)
            publisher = queue.publisher()
            sqlite_ledger = SqliteEffectLedger(settings.db, retention_s=store.retention_s)
            stack.callback(sqlite_ledger.close)
            ledger = sqlite_ledger

            def consumer_factory(on_revoked: Callable[[list[TopicPartition]], None]) -> Consumer:
                return queue.consumer(group, list(topics.values()), member=member, on_revoked=on_revoked,
                                      session_timeout_s=session_timeout_s)
        else:
            from scheduler.adapters.cassandra.effects import CassandraEffectLedger
            from scheduler.adapters.cassandra.store import CassandraTaskStore
            from scheduler.adapters.kafka.consumer import KafkaConsumer
            from scheduler.adapters.kafka.publisher import KafkaPublisher
            from scheduler.adapters.kafka.topics import ensure_topics

            assert isinstance(store, CassandraTaskStore)
            ensure_topics(settings.kafka, shard_count=store.shard_count)
            kafka_publisher = KafkaPublisher(settings.kafka, client_id=member)
            stack.callback(kafka_publisher.close)
            kafka_publisher.check()
            publisher = kafka_publisher
            ledger = CassandraEffectLedger.for_store(store, retention_s=store.retention_s)

            def consumer_factory(on_revoked: Callable[[list[TopicPartition]], None]) -> Consumer:
                return KafkaConsumer(settings.kafka, group, list(topics.values()), member=member,
                                     on_revoked=on_revoked, session_timeout_s=session_timeout_s)
        yield WorkerParts(store, ledger, publisher, handoff, consumer_factory, topics,
                          settings.kafka.dead_letter_topic, counts, workflows)


def consumer_lag(settings: BackendSettings) -> dict[str, int]:
    """Ready topic -> messages its worker pool's group has not committed past
    (`QueueError`/`QueueUnavailable` when the queue cannot say)."""
    groups = {settings.kafka.worker_group(pool): [settings.kafka.ready_topic(name) for name in names]
              for pool, names in POOL_TOPICS.items()}
    if settings.backend == "embedded":
        from scheduler.adapters.embedded.queue import SqliteQueue

        if not settings.queue_path.exists():
            return {}
        queue = SqliteQueue(settings.queue_path, handoff_topic=settings.kafka.handoff_topic,
                        dead_letter_topic=settings.kafka.dead_letter_topic)
        try:
            return queue.lag(groups)
        finally:
            queue.close()
    from scheduler.adapters.kafka.lag import consumer_lag as kafka_lag

    return kafka_lag(settings.kafka, groups)


@contextmanager
def open_dead_letters(settings: BackendSettings) -> Iterator[tuple[TopicScanner, Publisher]]:
    """A scanner of the dead-letter topic and a publisher to append replay markers."""
    with ExitStack() as stack:
        scanner: TopicScanner
        publisher: Publisher
        if settings.backend == "embedded":
            from scheduler.adapters.embedded.queue import SqliteQueue

            queue = SqliteQueue(settings.queue_path, handoff_topic=settings.kafka.handoff_topic,
                        dead_letter_topic=settings.kafka.dead_letter_topic)
            stack.callback(queue.close)
            scanner, publisher = queue.scanner(), queue.publisher()
        else:
            from scheduler.adapters.kafka.consumer import KafkaTopicScanner
            from scheduler.adapters.kafka.publisher import KafkaPublisher

            scanner = KafkaTopicScanner(settings.kafka)
            kafka_publisher = KafkaPublisher(settings.kafka, client_id="dlq")
            stack.callback(kafka_publisher.close)
            publisher = kafka_publisher
        yield scanner, publisher
