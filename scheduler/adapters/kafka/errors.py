"""librdkafka's client-level error callback, kept once for every Kafka client here.

librdkafka retries client errors (a broker gone away) by itself and reports them to
`error_cb`; a *fatal* one (the idempotent producer lost its guarantees) means the client
is unusable and a new one must be made. `ClientErrors` is that callback: it remembers
the fatal error and the last one, for the client's own exceptions, and logs each
distinct error once rather than on every retry.

A fatal error is not always given to `error_cb`: confluent-kafka raises it from the
`poll` or `flush` that serves it, as a `KafkaException` (or, when a delivery callback
runs after it in the same call, as a `SystemError` caused by one). `note_raised` takes
it from there into `fatal`.

A refusal (failed authentication, a TLS handshake the broker or the client would not
complete, a fatal authorization error) is remembered apart, in `denied`: librdkafka
retries it like an outage, and the request in progress times out, but no retry can
succeed. `raise_denied` turns it into `QueueAccessDenied`. librdkafka calls `error_cb`
only while the client is polled; `serve` does that for a client that is not.

A refusal is not always the brokers' last word: a broker restarting or shedding
connections can cut a SASL or TLS handshake in a way librdkafka reports as an
authentication or TLS error, and the next connection succeeds. So a request that goes
through (`succeeded`) forgets it, and a long-lived client that only waits (a consumer's
poll) reports it only once it has lasted a while and a metadata request made then is
not answered either (`refused_still`).

A client checked on every tick of a loop (the dispatcher's hand-off reader) must not
wait out a metadata request on each one, so the probe is made at most once in that
while. Until the next, the refusal stands for a client that must not wait on (a worker,
which exits on it); for one that can read on (the hand-off reader), only if the probe
was refused too: a probe that timed out is no verdict, and the reader's own requests go
ahead and report the refusal again if it is still there. An authorization refusal, the
broker's answer to a request, stands at once, for the same while: ACLs can be granted
to a running process, and its next request asks again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from confluent_kafka import KafkaError, KafkaException

from scheduler.adapters.kafka.security import access_denied, refusal
from scheduler.settings import KafkaSettings


class ClientErrors:
    """The `error_cb` of one client, named `what` in logs, with actions `<action>.fatal`,
    `<action>.denied` and `<action>.error`."""

    def __init__(self, what: str, action: str, log: logging.Logger) -> None:
        self.what = what
        self.action = action
        self.log = log
        self.fatal: KafkaError | None = None
        self.last: KafkaError | None = None
        self.denied: tuple[str, KafkaError] | None = None
        """(what was refused, as `security.refusal` names it; the error)."""
        self.denied_at: float | None = None
        """When (monotonic) the first refusal since the last request that went through came."""
        self.probed_at: float | None = None
        """When (monotonic) the last probe of the refusal failed (`refused_still`)."""
        self.probe_refused = False
        """Whether that probe was refused too, rather than left unanswered."""
        self.serve: Callable[[], object] | None = None
        """Serves the client's queued callbacks without taking messages (`poll(0)` of a
        producer or admin client); None where that is not safe."""

    def __call__(self, error: KafkaError) -> None:
        refused = refusal(error)
        if refused is not None:
            if self.denied is None or self.denied[1].str() != error.str():
                self.log.error("%s refused by Kafka: %s", self.what, error, extra={"action": f"{self.action}.denied"})
            if self.denied is None or self.denied[0] != refused:  # the time of this kind of refusal
                self.denied_at = time.monotonic()
            self.denied = (refused, error)
        if error.fatal():
            self.fatal = error
            self.log.error("fatal %s error: %s", self.what, error, extra={"action": f"{self.action}.fatal"})
            return
        if refused is None and (self.last is None or self.last.str() != error.str()):
            self.log.warning("%s error: %s", self.what, error, extra={"action": f"{self.action}.error"})
        self.last = error

    def note_raised(self, exc: BaseException) -> bool:
        """Records the fatal error `exc` carries (see the module docstring), as `error_cb`
        would have; False if it carries none."""
        for candidate in (exc, exc.__cause__, exc.__context__):
            if isinstance(candidate, KafkaException) and candidate.args and isinstance(candidate.args[0], KafkaError):
                error: KafkaError = candidate.args[0]
                if error.fatal():
                    self(error)
                    return True
        return False

    def raise_denied(self, settings: KafkaSettings, what: str) -> None:
        """`QueueAccessDenied` if the brokers refused this client (serving its callbacks
        first, where that is safe)."""
        if self.serve is not None:
            self.serve()
        if self.denied is not None:
            refused, error = self.denied
            raise access_denied(settings, refused, error.str(), what)

    def succeeded(self) -> None:
        """A request of this client went through: any refusal before it was passing."""
        self.denied = self.denied_at = self.probed_at = None
        self.probe_refused = False

    def refused_still(self, grace_s: float, probe: Callable[[float], object],
                      probe_timeout_s: float | None = None, unanswered_stands: bool = True) -> bool:
        """Whether the refusal this client saw stands (see the module docstring): an
        authorization refusal for `grace_s`, then it is forgotten; a failed authentication
        or TLS handshake once it is `grace_s` old and `probe(timeout_s)`, a metadata
        request of `probe_timeout_s` (default `grace_s`), fails too. A probe that is
        answered clears it. After one that fails, no probe for `grace_s`: the refusal
        stands meanwhile if the probe was refused, or if it timed out and
        `unanswered_stands`."""
        if self.denied is None or self.denied_at is None:
            return False
        now = time.monotonic()
        if self.denied[0] not in ("authentication", "TLS"):
            if now - self.denied_at < grace_s:
                return True
            self.succeeded()
            return False
        if now - self.denied_at < grace_s:
            return False
        if self.probed_at is not None and now - self.probed_at < grace_s:
            return self.probe_refused or unanswered_stands
        try:
            probe(grace_s if probe_timeout_s is None else probe_timeout_s)
        except KafkaException as exc:
            self.probed_at = time.monotonic()
            self.probe_refused = bool(exc.args) and refusal(exc.args[0]) is not None
            return True
        self.succeeded()
        return False
