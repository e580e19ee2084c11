"""A refusal a Kafka client saw is forgotten once a request goes through, and a client
that only waits reports a failed handshake only once it has lasted and a fresh metadata
request fails too: a broker restarting mid-handshake must not make a worker exit 2."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
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


def timed_out_probe(probes: list[float]) -> Callable[[float], object]:
    """A metadata probe as librdkafka fails it while no broker lets the client in: a
    transport error or a timeout, never the refusal itself."""
    def probe(timeout_s: float) -> object:
        probes.append(timeout_s)
        raise KafkaException(KafkaError(KafkaError._TRANSPORT, "Failed to get metadata: Local: Broker transport failure"))
    return probe


def test_for_a_worker_a_failed_probe_makes_the_refusal_stand_with_no_other_probe_for_the_grace_period() -> None:
    """A worker exits on a standing refusal; whichever of its checks comes first after the
    probe (a poll, or a commit whose caller logs and goes on) must not be the only one."""
    client = errors()
    client(AUTHENTICATION)
    probes: list[float] = []
    client.denied_at = time.monotonic() - 120.0  # the refusal has lasted
    assert client.refused_still(60.0, timed_out_probe(probes))
    assert probes == [60.0]  # the probe waits the grace period unless told otherwise
    assert all(client.refused_still(60.0, timed_out_probe(probes)) for _ in range(100))
    assert probes == [60.0]  # it stands on the next checks, with no probe
    client.probed_at = time.monotonic() - 61.0  # the probe has aged past the grace period
    assert client.refused_still(60.0, timed_out_probe(probes)) and probes == [60.0, 60.0]
    client.probed_at = time.monotonic() - 61.0
    assert not client.refused_still(60.0, answered)  # answered: the refusal is gone
    assert client.denied is None and client.probed_at is None and not client.probe_refused


def test_for_the_hand_off_reader_a_probe_left_unanswered_reports_once_and_the_next_ticks_read_on() -> None:
    """The reader is checked on every fire-loop tick: a short probe, at most once a grace
    period, and no answer is no verdict, so a slow broker does not stop it reading."""
    client = errors()
    client(AUTHENTICATION)
    probes: list[float] = []
    client.denied_at = time.monotonic() - 120.0

    def check() -> bool:
        return client.refused_still(60.0, timed_out_probe(probes), probe_timeout_s=1.0, unanswered_stands=False)

    assert check()  # the tick of the probe reports it
    assert probes == [1.0]  # the short probe asked for
    assert not any(check() for _ in range(100))  # the next ticks neither probe nor stop
    assert probes == [1.0] and client.denied is not None  # not forgotten: a grace period on, it asks again
    client.probed_at = time.monotonic() - 61.0
    assert check() and probes == [1.0, 1.0]


def test_a_refused_probe_makes_the_refusal_stand_even_for_the_reader() -> None:
    client = errors()
    client(AUTHENTICATION)
    client.denied_at = time.monotonic() - 120.0

    def refused_probe(_timeout_s: float) -> object:
        raise KafkaException(AUTHENTICATION)

    assert client.refused_still(60.0, refused_probe, probe_timeout_s=1.0, unanswered_stands=False)
    assert client.refused_still(60.0, unanswered, probe_timeout_s=1.0, unanswered_stands=False)


def test_a_refusal_of_another_kind_is_timed_from_when_it_came() -> None:
    client = errors()
    client(AUTHENTICATION)
    client.denied_at = time.monotonic() - 120.0
    client(TOPIC_REFUSED)  # an authorization refusal now: it stands its own grace period
    assert client.refused_still(60.0, unanswered)


def test_an_authorization_refusal_is_forgotten_after_the_grace_period_so_a_new_grant_is_seen() -> None:
    client = errors()
    client(TOPIC_REFUSED)
    client.denied_at = time.monotonic() - 61.0
    assert not client.refused_still(60.0, unanswered)  # no probe: the next request asks the broker itself
    assert client.denied is None
    client(TOPIC_REFUSED)  # still refused: reported again, and stands for another grace period
    assert client.refused_still(60.0, unanswered)
