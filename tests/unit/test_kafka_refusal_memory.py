"""A refusal a Kafka client saw is forgotten once a request goes through, and a client
that only waits reports a failed handshake only once it has lasted and a fresh metadata
request fails too: a broker restarting mid-handshake must not make a worker exit 2."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, KafkaException

from scheduler.adapters.kafka.errors import ClientErrors
from scheduler.errors import ConfigError, QueueAccessDenied
from scheduler.settings import KafkaSettings

AUTHENTICATION = KafkaError(KafkaError._AUTHENTICATION, "SASL authentication error: Authentication failed")
TOPIC_REFUSED = KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED, "Topic authorization failed")


def errors() -> ClientErrors:
    return ClientErrors("consumer", "kafka.consumer", logging.getLogger("test"))


def answered(_timeout_s: float) -> object:
    return object()


def unanswered(_timeout_s: float) -> object:
    raise KafkaException(KafkaError(KafkaError._TRANSPORT, "connection refused"))


def test_a_request_that_goes_through_forgets_an_earlier_refusal() -> None:
    client = errors()
    client(AUTHENTICATION)
    client(KafkaError(KafkaError._TRANSPORT, "broker down"))
    client.succeeded()
    assert client.denied is None
    client.raise_denied(KafkaSettings(), "write to t")  # nothing to raise: an outage stays an outage


def test_a_failed_handshake_is_reported_only_once_it_lasts_and_a_probe_fails() -> None:
    client = errors()
    client(AUTHENTICATION)
    probes: list[float] = []

    def probe(timeout_s: float) -> object:
        probes.append(timeout_s)
        return unanswered(timeout_s)

    assert not client.refused_still(60.0, probe)  # too fresh: not even probed
    assert probes == []
    assert client.refused_still(0.0, probe)
    assert probes == [0.0]
    with pytest.raises(QueueAccessDenied, match="SASL authentication"):
        client.raise_denied(KafkaSettings(username="scheduler", password_file=Path("/nonexistent")), "consume as group g")


def test_an_answered_probe_clears_a_passing_refusal() -> None:
    client = errors()
    client(AUTHENTICATION)
    assert not client.refused_still(0.0, answered)
    assert client.denied is None
    assert not client.refused_still(0.0, unanswered)  # nothing left to report


def test_the_time_counts_from_the_first_refusal_since_the_last_success() -> None:
    client = errors()
    client(AUTHENTICATION)
    first = client.denied_at
    time.sleep(0.01)
    client(AUTHENTICATION)
    assert client.denied_at == first
    client.succeeded()
    client(AUTHENTICATION)
    assert client.denied_at is not None and first is not None and client.denied_at > first


def test_an_authorization_refusal_is_the_brokers_answer_and_stands_at_once() -> None:
    client = errors()
    client(TOPIC_REFUSED)
    assert client.refused_still(60.0, answered)


def test_sasl_plain_without_tls_is_refused_before_any_connection(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="PLAIN would send the password in clear"):
        KafkaSettings(username="scheduler", password_file=tmp_path / "p", sasl_mechanism="PLAIN")


def test_a_probe_is_made_at_most_once_a_grace_period_and_a_refused_one_makes_the_refusal_stand() -> None:
    """The dispatcher's hand-off reader checks on every tick: a standing refusal must not
    cost it a metadata request each time."""
    client = errors()
    client(AUTHENTICATION)
    probes: list[float] = []

    def refused_probe(timeout_s: float) -> object:
        probes.append(timeout_s)
        raise KafkaException(AUTHENTICATION)

    assert client.refused_still(0.0, refused_probe, probe_timeout_s=1.0)
    assert probes == [1.0]  # the short probe asked for, not the grace period
    client.denied_at = time.monotonic() - 120.0  # the refusal has lasted; the probe was a moment ago
    assert all(client.refused_still(60.0, refused_probe, probe_timeout_s=1.0) for _ in range(100))
    assert probes == [1.0]  # no probe on these ticks, and the refusal stands
    client.probed_at = time.monotonic() - 61.0  # the probe has aged past the grace period
    assert client.refused_still(60.0, refused_probe, probe_timeout_s=1.0)
    assert probes == [1.0, 1.0]
    client.probed_at = time.monotonic() - 61.0
    assert not client.refused_still(60.0, answered)  # answered: the refusal is gone
    assert client.denied is None and client.probed_at is None and not client.probe_refused


def test_a_probe_that_times_out_reports_once_and_lets_the_clients_requests_go_ahead() -> None:
    """No answer is no verdict: a slow broker must not stop the hand-off reader reading
    for a whole grace period on the strength of a refusal it may be past."""
    client = errors()
    client(AUTHENTICATION)
    probes: list[float] = []

    def timed_out(timeout_s: float) -> object:
        probes.append(timeout_s)
        raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "Failed to get metadata: Local: Timed out"))

    client.denied_at = time.monotonic() - 120.0
    assert client.refused_still(60.0, timed_out, probe_timeout_s=1.0)  # the tick of the probe reports it
    assert not any(client.refused_still(60.0, timed_out, probe_timeout_s=1.0) for _ in range(100))
    assert probes == [1.0]  # and the next ticks neither probe nor stop
    assert client.denied is not None  # not forgotten: the next probe, a grace period on, asks again
    client.probed_at = time.monotonic() - 61.0
    assert client.refused_still(60.0, timed_out, probe_timeout_s=1.0) and probes == [1.0, 1.0]


def test_an_authorization_refusal_is_forgotten_after_the_grace_period_so_a_new_grant_is_seen() -> None:
    client = errors()
    client(TOPIC_REFUSED)
    client.denied_at = time.monotonic() - 61.0
    assert not client.refused_still(60.0, unanswered)  # no probe: the next request asks the broker itself
    assert client.denied is None
    client(TOPIC_REFUSED)  # still refused: reported again, and stands for another grace period
    assert client.refused_still(60.0, unanswered)
