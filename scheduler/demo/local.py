"""`scheduler demo --backend local`: the same story on the real Cassandra, Kafka and
ZooKeeper (the local cluster of `deploy/local`, or the servers `SCHEDULER_*` names),
in a keyspace, topic prefix and ZooKeeper root of the demo's own, removed afterwards
unless kept."""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from scheduler.settings import CassandraSettings, KafkaSettings, ZooKeeperSettings, environment

LEASE_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class LocalDeployment:
    cassandra: CassandraSettings
    kafka: KafkaSettings
    zookeeper: ZooKeeperSettings

    @classmethod
    def fresh(cls) -> LocalDeployment:
        tag = secrets.token_hex(4)
        return cls(CassandraSettings.from_env(keyspace=f"demo_{tag}"),
                   KafkaSettings.from_env(topic_prefix=f"demo-{tag}"),
                   ZooKeeperSettings.from_env(root=f"/demo_{tag}", session_timeout_s=LEASE_TIMEOUT_S))

    def env(self) -> dict[str, str]:
        """What the demo's processes read to find this deployment."""
        return environment(self.cassandra, self.kafka, self.zookeeper)

    def create(self) -> None:
        """The keyspace and tables, and the topics (so workers can join before the
        dispatchers have created them)."""
        from scheduler.adapters.cassandra import schema
        from scheduler.adapters.cassandra.connection import connect
        from scheduler.adapters.kafka.topics import ensure_topics

        with connect(self.cassandra) as connection:
            schema.apply(connection, self.cassandra)
        ensure_topics(self.kafka, shard_count=self.cassandra.shard_count)

    def remove(self) -> list[str]:
        """Drop the keyspace, the topics and groups, the ZooKeeper root; the warnings of
        whatever could not be removed (removal goes on past a failure)."""
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import AdminClient
        from kazoo.client import KazooClient

        from scheduler.adapters.cassandra.connection import DRIVER_ERRORS, connect
        from scheduler.adapters.kafka.topics import delete_topics
        from scheduler.errors import SchedulerError

        warnings = []
        cassandra_errors: tuple[type[BaseException], ...] = (*DRIVER_ERRORS, SchedulerError)
        try:
            with connect(self.cassandra) as connection:
                connection.session.execute(f"DROP KEYSPACE IF EXISTS {self.cassandra.keyspace}", timeout=120)
        except cassandra_errors as exc:
            warnings.append(f"could not drop keyspace {self.cassandra.keyspace}: {exc}")
        try:
            delete_topics(self.kafka)
            admin = AdminClient({"bootstrap.servers": self.kafka.bootstrap})
            groups = [self.kafka.worker_group(pool) for pool in ("default", "long")]
            for future in admin.delete_consumer_groups(groups, request_timeout=30).values():
                try:
                    future.result(timeout=60)
                except KafkaException:
                    pass  # a pool no worker ran has no group
        except (SchedulerError, KafkaException) as exc:
            warnings.append(f"could not delete topics {self.kafka.topic_prefix}.*: {exc}")
        client = KazooClient(hosts=self.zookeeper.hosts, timeout=10)
        try:
            client.start(timeout=15)
            if client.exists(self.zookeeper.root):
                client.delete(self.zookeeper.root, recursive=True)
        except Exception as exc:  # kazoo raises many unrelated types; this is cleanup
            warnings.append(f"could not delete the ZooKeeper root {self.zookeeper.root}: {exc}")
        finally:
            client.stop()
            client.close()
        return warnings
