"""Removing a deployment of the distributed backend: its keyspace, its topics and
consumer groups, its ZooKeeper root. For the demo and the benches, which make one of
their own per run; every step is tried whatever the others did."""

from __future__ import annotations

import time

from scheduler.settings import CassandraSettings, KafkaSettings, ZooKeeperSettings

WORKER_POOLS = ("default", "long")

GONE_TIMEOUT_S = 30.0
"""How long to wait for the brokers' metadata to stop listing the deleted topics."""


def remove_deployment(cassandra: CassandraSettings, kafka: KafkaSettings, zookeeper: ZooKeeperSettings,
                      extra_topics: tuple[str, ...] = ()) -> list[str]:
    """Drop the keyspace, delete the topics (and `extra_topics`), the dispatchers' and
    the worker pools' groups, and the ZooKeeper root; the warnings of whatever could not
    be removed."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient
    from kazoo.client import KazooClient

    from scheduler.adapters.cassandra.connection import DRIVER_ERRORS, connect
    from scheduler.adapters.kafka.security import client_config
    from scheduler.adapters.kafka.topics import delete_topics
    from scheduler.adapters.zookeeper.security import client_options
    from scheduler.errors import SchedulerError

    warnings = []
    cassandra_errors: tuple[type[BaseException], ...] = (*DRIVER_ERRORS, SchedulerError)
    try:
        with connect(cassandra) as connection:
            connection.session.execute(f"DROP KEYSPACE IF EXISTS {cassandra.keyspace}", timeout=120)
    except cassandra_errors as exc:
        warnings.append(f"could not drop keyspace {cassandra.keyspace}: {exc}")
    try:
        delete_topics(kafka)
        admin = AdminClient(client_config(kafka))
        if extra_topics:
            for future in admin.delete_topics(list(extra_topics), operation_timeout=30).values():
                future.result(timeout=60)
        groups = [kafka.worker_group(pool) for pool in WORKER_POOLS]
        for future in admin.delete_consumer_groups(groups, request_timeout=30).values():
            try:
                future.result(timeout=60)
            except KafkaException as exc:
                if exc.args[0].code() != KafkaError.GROUP_ID_NOT_FOUND:  # a pool no worker ran has no group
                    raise
        # Deletion is asynchronous: the metadata lists a topic for a while after the
        # controller accepted its deletion. Done means gone, so wait for that.
        prefix = kafka.topic_prefix + "."
        deadline = time.monotonic() + GONE_TIMEOUT_S
        while left := sorted(name for name in admin.list_topics(timeout=10).topics
                             if name.startswith(prefix) or name in extra_topics):
            if time.monotonic() >= deadline:
                warnings.append(f"topics {', '.join(left)} are still listed {GONE_TIMEOUT_S:.0f} s after their "
                                "deletion")
                break
            time.sleep(0.1)
    except (SchedulerError, KafkaException) as exc:
        warnings.append(f"could not delete the topics {kafka.topic_prefix}.*: {exc}")
    try:
        identity = zookeeper.identity()  # a root made with one is deleted only with it
    except SchedulerError as exc:
        warnings.append(f"could not delete the ZooKeeper root {zookeeper.root}: {exc}")
        return warnings
    client = KazooClient(hosts=zookeeper.hosts, timeout=10, **client_options(identity, zookeeper.tls))
    try:
        client.start(timeout=15)
        if client.exists(zookeeper.root):
            client.delete(zookeeper.root, recursive=True)
    except Exception as exc:  # kazoo raises many unrelated types; this is cleanup
        warnings.append(f"could not delete the ZooKeeper root {zookeeper.root}: {type(exc).__name__} {exc}")
    finally:
        client.stop()
        client.close()
    return warnings
