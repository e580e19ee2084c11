"""What every part of a dispatcher shares: its settings and ports, the shards the fire
loop owns, the fire loop's inbox and the pools that work is sent to.

The rule that makes a dispatcher safe without locks around shard state is kept here:
`shards` (and every `OwnedShard` in it) is read and changed only on the fire loop.
Other threads do I/O and send their results back with `post`; each result carries the
lease token it was started under, and `current(shard, token)` drops it if the shard has
changed hands since.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from scheduler.dispatcher.config import Clock, DispatcherConfig, Gauges, Stats
from scheduler.dispatcher.shard import OwnedShard
from scheduler.ports import Coordinator, Lease, SessionState, TaskStore
from scheduler.visibility.labels import TypeLabels

log = logging.getLogger(__name__)


class DispatcherContext:
    """The shared state and plumbing of one dispatcher's parts (see the module docstring)."""

    def __init__(self, config: DispatcherConfig, store: TaskStore, coordinator: Coordinator, clock: Clock) -> None:
        self.config = config
        self.store = store
        self.coordinator = coordinator
        self.clock = clock
        self.shard_count = store.shard_count
        self.stats = Stats()
        self.gauges = Gauges()
        """The latest `Gauges`, replaced whole by the fire loop; any thread reads it."""
        self.type_labels = TypeLabels(config.metrics_types)
        """The task types the metrics label (slots in the wheel tags)."""
        self.shards: dict[int, OwnedShard] = {}
        """The shards being fired, by number: the fire loop's alone."""
        self.inbox: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self.stopping = threading.Event()
        self.wake_balancer = threading.Event()
        self.session = SessionState.CONNECTED
        """The coordinator session's state, as its last callback said (any thread may read it)."""
        self.readers = ThreadPoolExecutor(config.reader_threads, thread_name_prefix="dispatcher-read")
        """Bucket reads, and the counts and re-reads before a slice fires."""
        self.lookers = ThreadPoolExecutor(config.looker_threads, thread_name_prefix="dispatcher-look")
        """Second looks and sweeps, and their re-reads: a pool of their own, so that they
        never queue ahead of the reads and counts that what is due now waits for."""
        self.writers = ThreadPoolExecutor(config.writer_threads, thread_name_prefix="dispatcher-write")
        """Taking shards in the store and advancing cursors (each a lightweight transaction)."""
        self.drop: Callable[[int, str, Lease], None] = _not_wired
        """Stop firing a shard at once, without touching the store (`Ownership.drop`)."""

    def post(self, action: Callable[[], None]) -> None:
        """Run `action` on the fire loop, at its next turn."""
        self.inbox.put(action)

    def submit(self, pool: ThreadPoolExecutor, job: Callable[..., None], *args: Any,
               on_error: Callable[[], None] | None = None) -> None:
        """Run `job` on `pool`; an unexpected exception is logged and `on_error` runs, since
        a pool would otherwise swallow it and leave the shard waiting forever."""

        def guarded() -> None:
            try:
                job(*args)
            except Exception:
                self.stats.job_errors += 1
                log.exception("%s failed unexpectedly", getattr(job, "__name__", "a job"),
                              extra={"action": "job_failed"})
                if on_error is not None:
                    try:
                        on_error()
                    except Exception:
                        log.exception("cleaning up after a failed job failed too")

        try:
            pool.submit(guarded)
        except RuntimeError:  # shutting down
            pass

    def holds(self, shard: int, token: int) -> bool:
        owned = self.shards.get(shard)
        return owned is not None and owned.token == token

    def current(self, shard: int, token: int) -> OwnedShard | None:
        """The shard, if it is still held under `token`."""
        owned = self.shards.get(shard)
        return owned if owned is not None and owned.token == token else None

    def session_now(self) -> SessionState:
        """The session's state read again (another thread may have changed it since a check)."""
        return self.session

    def stop(self) -> None:
        """Ask the dispatcher to stop gracefully. Safe from a signal handler."""
        self.stopping.set()
        self.wake_balancer.set()


def _not_wired(shard: int, why: str, lease: Lease) -> None:
    raise RuntimeError("DispatcherContext.drop is set when the dispatcher is assembled")
