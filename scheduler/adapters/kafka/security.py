"""How every Kafka client of the scheduler connects: `client_config` turns `KafkaSettings`
into librdkafka's settings, and `refusal` tells an answer that refused the scheduler
from an outage.

The security protocol follows from what is set: a SASL user and a CA is `SASL_SSL`, a
user alone `SASL_PLAINTEXT`, a CA alone `SSL`, neither `PLAINTEXT`. With TLS the
broker's certificate must be signed by the CA and name the address dialled
(librdkafka's `ssl.endpoint.identification.algorithm=https`, its default, left on). The
password is read from its file when a client is made, so a rotated file takes effect
with the next client, and never appears in a log: `redacted` is the config as it may
be shown.

How a refusal shows: librdkafka never raises for a failed authentication or TLS
handshake; it reports the error to `error_cb` (`_AUTHENTICATION`, `_SSL`, or a
`_TRANSPORT` error carrying the server's TLS alert when the broker refused our
certificate), takes the broker as down and retries, so the request in progress times
out as if no broker answered. An authorization refusal comes back as the answer to the
request (`TOPIC_AUTHORIZATION_FAILED`, ...). `refusal` recognises both, and only those:
a connection refused, reset or timed out stays an outage.
"""

from __future__ import annotations

import re
from typing import Any

from confluent_kafka import KafkaError

from scheduler.errors import QueueAccessDenied, QueueError
from scheduler.settings import KafkaSettings, read_secret

SECRET_KEYS = frozenset({"sasl.password", "ssl.key.password", "ssl.key.pem", "sasl.oauthbearer.client.secret"})

AUTHORIZATION_CODES: dict[int, str] = {
    KafkaError.TOPIC_AUTHORIZATION_FAILED: "topic",
    KafkaError.GROUP_AUTHORIZATION_FAILED: "consumer group",
    KafkaError.CLUSTER_AUTHORIZATION_FAILED: "cluster",
    KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED: "transactional id",
    KafkaError.DELEGATION_TOKEN_AUTHORIZATION_FAILED: "delegation token",
}
"""Broker answers that mean "your principal may not do this", and to what."""

# The TLS alerts a server sends when it will not take the client's certificate (or
# does not trust the client at all): the broker refused us, it is not an outage.
_TLS_REFUSAL = re.compile(
    r"alert (bad certificate|certificate required|unknown ca|certificate unknown|certificate revoked|"
    r"certificate expired|unsupported certificate|access denied|handshake failure)", re.IGNORECASE)


# An _SSL error that is about whom to trust, not a connection cut mid-handshake.
_TLS_TRUST = re.compile(r"certificate|verify|alert|no ciphers|wrong version", re.IGNORECASE)


def security_protocol(settings: KafkaSettings) -> str:
    sasl, tls = settings.username is not None, settings.tls is not None
    return {(True, True): "SASL_SSL", (True, False): "SASL_PLAINTEXT",
            (False, True): "SSL", (False, False): "PLAINTEXT"}[(sasl, tls)]


def client_config(settings: KafkaSettings) -> dict[str, Any]:
    """librdkafka's settings for a client of these brokers, as these settings say to
    connect; the caller adds its own (`group.id`, `acks`...). The password file is read
    now: `ConfigError` naming it if it cannot be."""
    config: dict[str, Any] = {"bootstrap.servers": settings.bootstrap,
                              "security.protocol": security_protocol(settings)}
    if settings.username is not None and settings.password_file is not None:
        config |= {
            "sasl.mechanisms": settings.sasl_mechanism,
            "sasl.username": settings.username,
            "sasl.password": read_secret(settings.password_file, "Kafka password"),
        }
    if settings.tls is not None:
        settings.tls.check("Kafka")
        config["ssl.ca.location"] = str(settings.tls.ca)
        if settings.tls.cert is not None and settings.tls.key is not None:
            config |= {"ssl.certificate.location": str(settings.tls.cert),
                       "ssl.key.location": str(settings.tls.key)}
    return config


def redacted(config: dict[str, Any]) -> dict[str, Any]:
    """`config` as it may be logged or shown: secrets replaced."""
    return {key: "<hidden>" if key in SECRET_KEYS else value for key, value in config.items()}


def refusal(error: object) -> str | None:
    """What the broker refused, if `error` (a `KafkaError`, or text) is a refusal rather
    than an outage: "authentication", "TLS", or the kind of resource whose
    authorization failed; None otherwise."""
    if isinstance(error, KafkaError):
        code = error.code()
        if code in AUTHORIZATION_CODES:
            return AUTHORIZATION_CODES[code]
        if code in (KafkaError._AUTHENTICATION, KafkaError.SASL_AUTHENTICATION_FAILED,
                    KafkaError.UNSUPPORTED_SASL_MECHANISM, KafkaError.ILLEGAL_SASL_STATE):
            return "authentication"
        text = error.str()
        if code == KafkaError._SSL and _TLS_TRUST.search(text):
            return "TLS"
    else:
        text = str(error)
    if _TLS_REFUSAL.search(text):
        return "TLS"
    return None


def access_denied(settings: KafkaSettings, refused: str, detail: object, what: str) -> QueueAccessDenied:
    """The `QueueAccessDenied` of a refusal (`refused`, from `refusal`) of `what` the
    client was doing, naming the brokers, the user and the settings to check."""
    user = f"user {settings.username!r}" if settings.username else "no SASL user"
    if refused == "authentication":
        check = ("SCHEDULER_KAFKA_USERNAME, SCHEDULER_KAFKA_PASSWORD_FILE (the password of that user) and "
                 "SCHEDULER_KAFKA_SASL_MECHANISM (the brokers' sasl.enabled.mechanisms)")
        refused_what = f"the SASL authentication of {user}, to {what}"
    elif refused == "TLS":
        check = ("SCHEDULER_KAFKA_TLS_CA (the CA that signed the brokers' certificates) and "
                 "SCHEDULER_KAFKA_TLS_CERT/_KEY (a client certificate the brokers trust, where they require one)")
        refused_what = f"the TLS handshake of {user}, to {what}"
    else:
        check = (f"the ACLs of User:{settings.username or 'ANONYMOUS'} on the brokers (kafka-acls --list), and "
                 "SCHEDULER_KAFKA_USERNAME")
        refused_what = f"to let {user} {what}: not authorized on the {refused}"
    return QueueAccessDenied(
        f"Kafka at {settings.bootstrap} refused {refused_what} ({detail}); check {check}"
    )


def topics_missing(settings: KafkaSettings, names: list[str]) -> QueueError:
    """The `QueueError` of topics the brokers' metadata does not list. Where ACLs may be
    in force (a SASL user, or a client certificate), a topic the user may not DESCRIBE is
    left out of the metadata just as a missing one is, and Kafka says no more: the
    message names both causes."""
    error = (f"Kafka at {settings.bootstrap} has no topic {', '.join(names)}: create the scheduler's topics first "
             "(scheduler.adapters.kafka.topics.ensure_topics)")
    if settings.username is not None:
        principal = f"User:{settings.username}"
    elif settings.tls is not None and settings.tls.cert is not None:
        principal = f"the principal of the client certificate {settings.tls.cert}"
    else:
        return QueueError(error)
    return QueueError(f"{error}; if they exist, {principal} may not DESCRIBE them: check its ACLs on the brokers "
                      "(kafka-acls --list)")
