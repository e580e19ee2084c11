"""Kafka on the secure cluster refuses whoever it should, says so clearly, and loses or
half-writes nothing.

SASL_SSL with SCRAM-SHA-512 and a client certificate required; ACLs with nothing
allowed unless granted: `scheduler` may do what the scheduler does, `reader` may read
and not write, a user made by a test may do nothing. Each test uses a topic prefix of
its own, removed afterwards as the scheduler.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialAlteration,
    UserScramCredentialDeletion,
    UserScramCredentialUpsertion,
)

from scheduler.adapters.kafka.consumer import KafkaConsumer
from scheduler.adapters.kafka.publisher import KafkaPublisher
from scheduler.adapters.kafka.security import client_config
from scheduler.adapters.kafka.topics import delete_topics, ensure_topics
from scheduler.adapters.teardown import remove_deployment
from scheduler.errors import QueueAccessDenied, QueueError
from scheduler.settings import READY_TOPICS, CassandraSettings, KafkaSettings, TlsFiles, ZooKeeperSettings
from tests.cluster import unique_name
from tests.secure_cluster import SecureCluster
from tests.support import wait_until
from tests.workers import APP

pytestmark = [pytest.mark.integration, pytest.mark.local_cluster, pytest.mark.secure, pytest.mark.timeout(180)]

SHARDS = 4


@pytest.fixture
def kafka(secure_cluster: SecureCluster) -> Iterator[KafkaSettings]:
    """The scheduler's settings on the secure cluster, with a topic prefix of this test's own."""
    settings = dataclasses.replace(secure_cluster.kafka, topic_prefix=unique_name("k"))
    yield settings
    delete_topics(settings)


def as_user(settings: KafkaSettings, secure_cluster: SecureCluster, user: str) -> KafkaSettings:
    return dataclasses.replace(settings, username=user, password_file=secure_cluster.password_file(f"kafka-{user}"))


def wrong_password(tmp_path: Path) -> Path:
    path = tmp_path / "wrong.password"
    path.write_text("not-the-password\n")
    path.chmod(0o600)
    return path


def end_offsets(settings: KafkaSettings, topic: str) -> list[int]:
    consumer = Consumer({**client_config(settings), "group.id": unique_name("offsets"), "log_level": 0})
    try:
        partitions = consumer.list_topics(topic, timeout=30).topics[topic].partitions
        return [consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] for p in sorted(partitions)]
    finally:
        consumer.close()


def existing_topics(settings: KafkaSettings) -> list[str]:
    from confluent_kafka.admin import AdminClient

    topics = AdminClient(client_config(settings)).list_topics(timeout=30).topics
    return sorted(name for name in topics if name.startswith(settings.topic_prefix + "."))


def read_all(settings: KafkaSettings, topic: str, expected: int) -> list[bytes]:
    consumer = KafkaConsumer(settings, f"{settings.topic_prefix}.workers.{settings.username}", [topic],
                             member=f"test-{settings.username}")
    values: list[bytes] = []
    try:
        def got_all() -> bool:
            values.extend(delivery.value for delivery in consumer.poll(100, 0.5))
            return len(values) >= expected

        wait_until(got_all, timeout_s=60, what=f"{expected} messages read from {topic} as {settings.username}")
        consumer.commit({(d.topic, d.partition): d.offset + 1 for d in consumer.poll(100, 0.1)} or {})
    finally:
        consumer.close()
    return values


def test_a_wrong_password_is_refused_and_nothing_is_made(kafka: KafkaSettings, tmp_path: Path) -> None:
    wrong = dataclasses.replace(kafka, password_file=wrong_password(tmp_path))
    with pytest.raises(QueueAccessDenied) as refused:
        ensure_topics(wrong, shard_count=SHARDS)
    message = str(refused.value)
    assert f"Kafka at {kafka.bootstrap} refused the SASL authentication of user 'scheduler'" in message
    assert "SCHEDULER_KAFKA_PASSWORD_FILE" in message
    assert "not-the-password" not in message
    assert existing_topics(kafka) == []


def test_a_client_without_a_certificate_is_refused(kafka: KafkaSettings) -> None:
    assert kafka.tls is not None
    no_certificate = dataclasses.replace(kafka, tls=TlsFiles(kafka.tls.ca))
    with pytest.raises(QueueAccessDenied, match="refused the TLS handshake .*SCHEDULER_KAFKA_TLS_CERT"):
        ensure_topics(no_certificate, shard_count=SHARDS)
    assert existing_topics(kafka) == []


def test_brokers_signed_by_another_ca_are_not_trusted(kafka: KafkaSettings) -> None:
    assert kafka.tls is not None and kafka.tls.cert is not None
    # The client's own certificate is no CA: nothing the brokers show chains up to it.
    untrusted = dataclasses.replace(kafka, tls=dataclasses.replace(kafka.tls, ca=kafka.tls.cert))
    with pytest.raises(QueueAccessDenied, match="TLS handshake .*certificate verify failed.*SCHEDULER_KAFKA_TLS_CA"):
        ensure_topics(untrusted, shard_count=SHARDS)


def test_reader_may_read_and_not_write_and_the_scheduler_both(kafka: KafkaSettings,
                                                              secure_cluster: SecureCluster) -> None:
    ensure_topics(kafka, shard_count=SHARDS)
    topic = kafka.ready_topic(READY_TOPICS[0])
    values = [f"task-{n}".encode() for n in range(20)]

    publisher = KafkaPublisher(kafka)
    try:
        publisher.check()
        publisher.publish(topic, values)
        publisher.flush(30)
    finally:
        publisher.close()
    before = end_offsets(kafka, topic)
    assert sum(before) == len(values)

    reader = as_user(kafka, secure_cluster, "reader")
    refused_publisher = KafkaPublisher(reader)
    try:
        refused_publisher.check()  # describing the topics is allowed
        with pytest.raises(QueueAccessDenied) as refused:  # from the publish or its flush: whichever hears first
            refused_publisher.publish(topic, [b"forged"])
            refused_publisher.flush(30)
    finally:
        refused_publisher.close()
    message = str(refused.value)
    assert f"refused to let user 'reader' write to {topic}" in message
    assert "ACLs of User:reader" in message
    assert end_offsets(kafka, topic) == before

    assert sorted(read_all(kafka, topic, len(values))) == sorted(values)  # the scheduler's round trip
    assert sorted(read_all(reader, topic, len(values))) == sorted(values)


@pytest.fixture
def stranger(kafka: KafkaSettings, secure_cluster: SecureCluster, tmp_path: Path) -> Iterator[KafkaSettings]:
    """The scheduler's settings as a user made now, as production makes users (the admin
    API), with no ACL at all; removed afterwards."""
    name = unique_name("stranger")
    password = tmp_path / "stranger.password"
    password.write_text("a-stranger's-password\n")
    password.chmod(0o600)
    admin = AdminClient(client_config(as_user(kafka, secure_cluster, "admin")))
    credential = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192)

    def change(alteration: UserScramCredentialAlteration) -> None:
        for future in admin.alter_user_scram_credentials([alteration]).values():
            future.result(timeout=30)

    change(UserScramCredentialUpsertion(name, credential, b"a-stranger's-password"))
    try:
        yield dataclasses.replace(kafka, username=name, password_file=password)
    finally:
        change(UserScramCredentialDeletion(name, ScramMechanism.SCRAM_SHA_512))


def test_topics_a_user_may_not_describe_are_named_with_both_causes(kafka: KafkaSettings,
                                                                    stranger: KafkaSettings) -> None:
    # Kafka leaves a topic the user may not DESCRIBE out of the metadata, as if missing.
    ensure_topics(kafka, shard_count=SHARDS)
    stranger_username = stranger.username
    assert stranger_username is not None

    def refused_check() -> str | None:
        """The check's error once the user can log in (a user just made may not be known
        to the broker for a moment: a refused authentication is tried again)."""
        publisher = KafkaPublisher(stranger)
        try:
            publisher.check()
        except QueueAccessDenied:
            return None
        except QueueError as exc:
            return str(exc)
        finally:
            publisher.close()
        raise AssertionError("a user with no ACL saw the scheduler's topics")

    message = wait_until(refused_check, timeout_s=60, interval_s=0.5, what="the new user's first login")
    assert message is not None
    assert f"has no topic {kafka.ready_topic(READY_TOPICS[0])}" in message
    assert f"if they exist, User:{stranger_username} may not DESCRIBE them" in message
    assert "kafka-acls --list" in message


def test_the_cli_exits_2_with_the_refusal_and_no_traceback(secure_cluster: SecureCluster, tmp_path: Path) -> None:
    env = secure_cluster.process_env(SCHEDULER_BACKEND="cassandra", SCHEDULER_KEYSPACE=unique_name("k"),
                                     SCHEDULER_TOPIC_PREFIX=unique_name("k"))
    try:
        applied = run_cli(env, "schema", "apply")
        assert applied.returncode == 0, applied.stderr
        # The password file given by flag wins over SCHEDULER_KAFKA_PASSWORD_FILE.
        for command in (["worker", "--app", APP], ["submit", "sms", "--delay", "1s", "--tenant", "t"]):
            done = run_cli(env, *command[:1], "--kafka-password-file", str(wrong_password(tmp_path)), *command[1:])
            assert done.returncode == 2, done.stderr
            assert "Traceback" not in done.stderr
            assert "error: Kafka at" in done.stderr
            assert "refused the SASL authentication of user 'scheduler'" in done.stderr
            assert "not-the-password" not in done.stderr
    finally:
        assert not remove_deployment(CassandraSettings.from_env(env), KafkaSettings.from_env(env),
                                     ZooKeeperSettings.from_env(env))


def run_cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "scheduler", *args], env=env, capture_output=True, text=True,
                          timeout=120)


def test_a_submit_whose_hand_off_is_refused_keeps_the_task_and_says_what_to_fix(
        secure_cluster: SecureCluster) -> None:
    # `reader` may write to no topic, so Kafka gives its idempotent producer no id: the
    # task due soon is stored, its hand-off refused, and the message says both.
    env = secure_cluster.process_env(SCHEDULER_BACKEND="cassandra", SCHEDULER_KEYSPACE=unique_name("k"),
                                     SCHEDULER_TOPIC_PREFIX=unique_name("k"))
    try:
        applied = run_cli(env, "schema", "apply")
        assert applied.returncode == 0, applied.stderr
        ensure_topics(KafkaSettings.from_env(env), shard_count=64)
        reader = {**env, "SCHEDULER_KAFKA_USERNAME": "reader",
                  "SCHEDULER_KAFKA_PASSWORD_FILE": str(secure_cluster.password_file("kafka-reader"))}
        submitted = run_cli(reader, "submit", "sms", "--tenant", "t", "--delay", "1s")
        assert submitted.returncode == 1, submitted.stderr
        assert "Traceback" not in submitted.stderr
        error = submitted.stderr.strip().splitlines()[-1]
        assert "is stored, but the queue refused its hand-off" in error
        assert f"refused to let user 'reader' write to {env['SCHEDULER_TOPIC_PREFIX']}.handoff" in error
        assert "submit it again" not in error
        task_id = error.split()[2]  # "error: task <id> is stored, ..."
        got = run_cli(env, "get", task_id, "--tenant", "t", "--json")
        assert got.returncode == 0 and '"status": "scheduled"' in got.stdout, got.stdout + got.stderr
    finally:
        assert not remove_deployment(CassandraSettings.from_env(env), KafkaSettings.from_env(env),
                                     ZooKeeperSettings.from_env(env))
