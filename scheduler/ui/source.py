"""`PageSource`: the backend the status page reads and acts on.

The store and the count store are opened once, for the page's life. A status is read
at most every `STATUS_TTL_S` per (tenant, type, since) whatever the number of browsers
refreshing: the counts it shows are written every 2 s, so reading more often shows
nothing new. The dead letters are read when their page is asked for (a scan of the
dead-letter topic); a replay goes through `scheduler.replay`, as `dlq replay` does, and
a cancel through the producer client, as `scheduler cancel` does.
"""

from __future__ import annotations

import threading
import time
from contextlib import ExitStack
from dataclasses import dataclass

from scheduler import backends
from scheduler.connecting import connect
from scheduler.errors import QueueError
from scheduler.model import TaskId
from scheduler.ports import CancelOutcome, StoredTask
from scheduler.replay import ReplayOutcome, replay
from scheduler.visibility.history import AttemptRecord
from scheduler.visibility.status import Status, read_status
from scheduler.worker.dead_letters import DeadLetter, waiting

STATUS_TTL_S = 2.0
LAG_TTL_S = 5.0
LAG_RETRY_S = 30.0
"""After the queue failed to say its consumer lag, the page says "not known" for this
long before asking again: a queue out of reach must not make every refresh wait on it."""


@dataclass(frozen=True)
class DeadLetters:
    waiting: list[DeadLetter]
    replayed: int
    unreadable: int


class PageSource:
    def __init__(self, settings: backends.BackendSettings) -> None:
        self.settings = settings
        self._stack = ExitStack()
        try:
            self.store = self._stack.enter_context(backends.open_store(settings))
            self.counts = self._stack.enter_context(backends.open_counts(settings, self.store))
        except BaseException:
            self._stack.close()
            raise
        self._lock = threading.Lock()
        self._cache: dict[tuple[str | None, str | None, int], tuple[float, Status, bool]] = {}
        self._lag_lock = threading.Lock()
        self._lag: tuple[float, dict[str, int] | None] = (float("-inf"), None)

    def close(self) -> None:
        self._stack.close()

    def __enter__(self) -> PageSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def status(self, tenant: str | None, type_: str | None, since_ms: int) -> tuple[Status, bool]:
        """The status, and whether the consumer lag in it is known (the queue answered)."""
        key = (tenant, type_, since_ms)
        with self._lock:
            cached = self._cache.get(key)
            if cached is not None and time.monotonic() - cached[0] < STATUS_TTL_S:
                return cached[1], cached[2]
            lag = self.consumer_lag()
            status = read_status(self.store, self.counts, since_ms=since_ms, tenant=tenant, type_=type_,
                                 consumer_lag=lag, minute_lateness=True)
            if len(self._cache) > 64:
                self._cache.clear()
            self._cache[key] = (time.monotonic(), status, lag is not None)
            return status, lag is not None

    def consumer_lag(self) -> dict[str, int] | None:
        """Ready topic -> messages behind, None when the queue cannot say (kept
        `LAG_TTL_S`, and a failure `LAG_RETRY_S`)."""
        with self._lag_lock:
            at, lag = self._lag
            age = time.monotonic() - at
            if age < (LAG_TTL_S if lag is not None else LAG_RETRY_S):
                return lag
            try:
                lag = backends.consumer_lag(self.settings)
            except (QueueError, TimeoutError):  # a slow broker can time a request's future out
                lag = None
            self._lag = (time.monotonic(), lag)
            return lag

    def task(self, task_id: TaskId) -> tuple[StoredTask | None, list[AttemptRecord]]:
        stored = self.store.get(task_id)
        if stored is None:
            return None, []
        return stored, [AttemptRecord.decode(n, text) for n, text in sorted(self.store.attempts(task_id).items())]

    def dead_letters(self) -> DeadLetters:
        if self.settings.backend == "embedded" and not self.settings.queue_path.exists():
            return DeadLetters([], 0, 0)  # nothing was ever queued: do not create the queue's file
        with backends.open_dead_letters(self.settings) as (scanner, _):
            letters, replayed, unreadable = waiting(scanner.scan(self.settings.kafka.dead_letter_topic))
        return DeadLetters(letters, len(replayed), unreadable)

    def replay(self, letter: str) -> ReplayOutcome:
        settings = self.settings
        with connect(backend=settings.backend, db=settings.db, cassandra=settings.cassandra,
                     kafka=settings.kafka) as client, backends.open_dead_letters(settings) as (scanner, publisher):
            (outcome,) = replay(client, scanner, publisher, settings.kafka.dead_letter_topic, [letter])
        return outcome

    def cancel(self, task_id: TaskId, tenant: str) -> CancelOutcome:
        """`Client.cancel`, as `scheduler cancel` does: `NOT_FOUND` for another tenant's task."""
        settings = self.settings
        with connect(backend=settings.backend, db=settings.db, cassandra=settings.cassandra,
                     kafka=settings.kafka) as client:
            return client.cancel(task_id, tenant)
