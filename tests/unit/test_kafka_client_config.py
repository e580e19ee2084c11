"""`client_config`: the librdkafka settings of every Kafka client, from `KafkaSettings`,
for each combination of SASL and TLS; and `refusal`, which tells a refused client
from an outage. The password is read from its file and shown nowhere else."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from confluent_kafka import KafkaError

from scheduler.adapters.kafka.security import access_denied, client_config, redacted, refusal
from scheduler.errors import ConfigError, QueueAccessDenied
from scheduler.settings import KafkaSettings, TlsFiles, environment

SECRET = "s3cret-pass-word"


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    paths = {name: tmp_path / name for name in ("password", "ca.pem", "client.pem", "client.key")}
    for name, path in paths.items():
        path.write_text(SECRET + "\n" if name == "password" else "pem\n")
        path.chmod(0o600)
    return paths


@pytest.mark.parametrize(("sasl", "tls", "cert", "protocol"), [
    (False, False, False, "PLAINTEXT"),
    (True, False, False, "SASL_PLAINTEXT"),
    (False, True, False, "SSL"),
    (False, True, True, "SSL"),
    (True, True, False, "SASL_SSL"),
    (True, True, True, "SASL_SSL"),
])
def test_every_combination_of_sasl_and_tls(files: dict[str, Path], sasl: bool, tls: bool, cert: bool,
                                           protocol: str) -> None:
    settings = KafkaSettings(
        bootstrap="10.0.0.1:9093",
        username="scheduler" if sasl else None, password_file=files["password"] if sasl else None,
        tls=TlsFiles(files["ca.pem"], files["client.pem"] if cert else None, files["client.key"] if cert else None)
        if tls else None,
    )
    config = client_config(settings)
    expected: dict[str, object] = {"bootstrap.servers": "10.0.0.1:9093", "security.protocol": protocol}
    if sasl:
        expected |= {"sasl.mechanisms": "SCRAM-SHA-512", "sasl.username": "scheduler", "sasl.password": SECRET}
    if tls:
        expected["ssl.ca.location"] = str(files["ca.pem"])
    if cert:
        expected |= {"ssl.certificate.location": str(files["client.pem"]),
                     "ssl.key.location": str(files["client.key"])}
    assert config == expected  # hostname verification is librdkafka's default: never turned off here
    assert "ssl.endpoint.identification.algorithm" not in config
    assert KafkaSettings.from_env(environment_of(settings)) == settings


def environment_of(settings: KafkaSettings) -> dict[str, str]:
    from scheduler.settings import CassandraSettings, ZooKeeperSettings

    return environment(CassandraSettings(), settings, ZooKeeperSettings())


def test_the_password_is_read_when_a_client_is_made(files: dict[str, Path]) -> None:
    settings = KafkaSettings(username="scheduler", password_file=files["password"])
    files["password"].write_text("rotated\n")
    assert client_config(settings)["sasl.password"] == "rotated"


def test_the_password_is_in_no_repr_log_or_error(files: dict[str, Path], caplog: pytest.LogCaptureFixture) -> None:
    settings = KafkaSettings(username="scheduler", password_file=files["password"],
                             tls=TlsFiles(files["ca.pem"]))
    config = client_config(settings)
    logging.getLogger("test").warning("config %s settings %r", redacted(config), settings)
    denied = access_denied(settings, "authentication", "invalid credentials", "fetch the cluster's metadata")
    for text in (repr(settings), str(settings), caplog.text, str(denied), repr(redacted(config))):
        assert SECRET not in text
    assert isinstance(denied, QueueAccessDenied) and isinstance(denied, ConfigError)
    assert "scheduler" in str(denied) and "SCHEDULER_KAFKA_PASSWORD_FILE" in str(denied)


def test_a_missing_password_file_is_named(tmp_path: Path) -> None:
    settings = KafkaSettings(username="scheduler", password_file=tmp_path / "absent")
    with pytest.raises(ConfigError, match="Kafka password file .*absent cannot be read"):
        client_config(settings)


def test_an_unreadable_tls_file_is_named(files: dict[str, Path], tmp_path: Path) -> None:
    settings = KafkaSettings(tls=TlsFiles(tmp_path / "no-ca.pem"))
    with pytest.raises(ConfigError, match="Kafka TLS CA file .*no-ca.pem"):
        client_config(settings)


@pytest.mark.parametrize(("error", "refused"), [
    (KafkaError(KafkaError._AUTHENTICATION, "SASL authentication error: invalid credentials"), "authentication"),
    (KafkaError(KafkaError._SSL, "SSL handshake failed: certificate verify failed"), "TLS"),
    (KafkaError(KafkaError._TRANSPORT, "Receive failed: ssl/tls alert bad certificate: SSL alert number 42"), "TLS"),
    (KafkaError(KafkaError._TRANSPORT, "Receive failed: tlsv13 alert certificate required"), "TLS"),
    (KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED), "topic"),
    (KafkaError(KafkaError.GROUP_AUTHORIZATION_FAILED), "consumer group"),
    (KafkaError(KafkaError.CLUSTER_AUTHORIZATION_FAILED), "cluster"),
    # Outages stay outages.
    (KafkaError(KafkaError._TRANSPORT, "Connect to ipv4#10.0.0.1:9093 failed: Connection refused"), None),
    (KafkaError(KafkaError._TRANSPORT, "Disconnected: connection closed by peer"), None),
    (KafkaError(KafkaError._SSL, "SSL transport error: Connection reset by peer"), None),
    (KafkaError(KafkaError._ALL_BROKERS_DOWN, "1/1 brokers are down"), None),
    (KafkaError(KafkaError._TIMED_OUT), None),
    (KafkaError(KafkaError.NOT_LEADER_FOR_PARTITION), None),
])
def test_refusals_are_told_from_outages(error: KafkaError, refused: str | None) -> None:
    assert refusal(error) == refused
