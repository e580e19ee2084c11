"""librdkafka's client-level error callback, kept once for every Kafka client here.

librdkafka retries client errors (a broker gone away) by itself and reports them to
`error_cb`; a *fatal* one (the idempotent producer lost its guarantees) means the client
is unusable and a new one must be made. `ClientErrors` is that callback: it remembers
the fatal error and the last one, for the client's own exceptions, and logs each
distinct error once rather than on every retry.
"""

from __future__ import annotations

import logging

from confluent_kafka import KafkaError


class ClientErrors:
    """The `error_cb` of one client, named `what` in logs, with actions `<action>.fatal`
    and `<action>.error`."""

    def __init__(self, what: str, action: str, log: logging.Logger) -> None:
        self.what = what
        self.action = action
        self.log = log
        self.fatal: KafkaError | None = None
        self.last: KafkaError | None = None

    def __call__(self, error: KafkaError) -> None:
        if error.fatal():
            self.fatal = error
            self.log.error("fatal %s error: %s", self.what, error, extra={"action": f"{self.action}.fatal"})
            return
        if self.last is None or self.last.str() != error.str():
            self.log.warning("%s error: %s", self.what, error, extra={"action": f"{self.action}.error"})
        self.last = error
