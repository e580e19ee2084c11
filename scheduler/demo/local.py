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
        from scheduler.adapters.teardown import remove_deployment

        return remove_deployment(self.cassandra, self.kafka, self.zookeeper)
