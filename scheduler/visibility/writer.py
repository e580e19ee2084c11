"""`CountWriter`: the thread that writes one process's counts, lateness and heartbeat to
the count store every `interval_s`.

What a process counts (`EventCounter`), how late it was (cumulative `LatencyHistogram`s,
read from the process's own counters: this thread takes the difference since the minute
began) and its gauges (a callable, read on this thread) go out together. A failed write
is kept and sent again with the next one (rows are absolute: the newer replaces the
older), so an outage of the store costs only staleness; what was still unwritten when
the process dies is lost, at most one interval of its events (see
`scheduler.visibility.counts`). Nothing here is on a hot path: the parts that count only
add to a dict under a lock.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from scheduler.errors import SchedulerError
from scheduler.ports import CountStore, LatenessRow, ProcessReport
from scheduler.visibility.counts import HOUR_MS, MINUTE_MS, CountRow, EventCounter, Pair
from scheduler.visibility.histogram import LatencyHistogram

log = logging.getLogger(__name__)

DEFAULT_INTERVAL_S = 2.0
TENANT_MINUTES_EVERY_MS = 10_000
"""Each tenant's minute rows are written this often (and when their minute ends, and at
stop); the hour rows, which the states come from, and the all-tenant minute rows at
every write."""
STOPPED = "stopped"
"""Set in the detail of a process's last report, written as it stops."""


def new_writer_id(role: str) -> str:
    """Unique per process start: role, host, pid and a random part (a pid is reused)."""
    return f"{role}:{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass
class Gauges:
    """What a process reports of itself at each write."""

    running: Mapping[Pair, int] = field(default_factory=dict)
    detail: Mapping[str, object] = field(default_factory=dict)


class CountWriter:
    def __init__(
        self,
        store: CountStore,
        role: str,
        *,
        writer: str | None = None,
        gauges: Callable[[], Gauges] | None = None,
        lateness: Mapping[str, Callable[[], LatencyHistogram]] | None = None,
        interval_s: float = DEFAULT_INTERVAL_S,
        clock_ms: Callable[[], int] = wall_ms,
        before_write: Callable[[], None] | None = None,
        after_write: Callable[[int], None] | None = None,
    ) -> None:
        """`before_write` runs first at each write (to add what was gathered elsewhere to
        the counter); `after_write` after each successful one, with its time."""
        self.store = store
        self.role = role
        self.writer = writer or new_writer_id(role)
        self.counter = EventCounter(self.writer)
        self._gauges = gauges
        self._lateness = dict(lateness or {})
        self.interval_s = interval_s
        self._clock = clock_ms
        self._before_write = before_write
        self._after_write = after_write
        self.started_ms = clock_ms()
        self._started_snapshots = False
        self._unwritten_hours: dict[tuple[int, str, str], CountRow] = {}
        self._unwritten_minutes: dict[tuple[int, str, str], CountRow] = {}
        self._minute = -1
        self._minute_base: dict[str, LatencyHistogram] = {}
        self._last_total: dict[str, LatencyHistogram] = {}
        self._stop = threading.Event()
        self._stopping = False
        self._tenant_minutes_ms = 0
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.writes = 0
        self.failures = 0
        self.last_error: str | None = None

    def start(self) -> CountWriter:
        self._thread = threading.Thread(target=self._run, name=f"count-writer-{self.role}", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        """Write what is left (one try), with a last report that says the process has
        stopped (`scheduler status` no longer shows it live), and stop the thread."""
        self._stopping = True
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None
        else:
            self.flush()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.flush()
        self.flush()

    def flush(self) -> bool:
        """One write of everything; False (kept for the next) when the store failed."""
        with self._lock:
            if self._before_write is not None:
                self._before_write()
            now = self._clock()
            tenant_minutes = self._stopping or now - self._tenant_minutes_ms >= TENANT_MINUTES_EVERY_MS
            if tenant_minutes:
                self._tenant_minutes_ms = now
            hours, minutes = self.counter.take(now, tenant_minutes=tenant_minutes)
            for row in hours:
                self._unwritten_hours[(row.period, row.tenant, row.type)] = row
            for row in minutes:
                self._unwritten_minutes[(row.period, row.tenant, row.type)] = row
            lateness = self._lateness_rows(now)
            try:
                if not self._started_snapshots:
                    # Before this writer's first row: a snapshot older than any row it writes.
                    self.store.start_snapshots(self.started_ms // HOUR_MS - 1)
                    self._started_snapshots = True
                if self._unwritten_hours or self._unwritten_minutes:
                    self.store.write_counts(list(self._unwritten_hours.values()),
                                            list(self._unwritten_minutes.values()))
                    self._unwritten_hours.clear()
                    self._unwritten_minutes.clear()
                if lateness:
                    self.store.write_lateness(lateness)
                gauges = self._gauges() if self._gauges is not None else Gauges()
                detail = {**gauges.detail, STOPPED: True} if self._stopping else dict(gauges.detail)
                self.store.write_process(ProcessReport(self.writer, self.role, socket.gethostname(), os.getpid(),
                                                       self.started_ms, now, {} if self._stopping else
                                                       dict(gauges.running), detail))
            except Exception as exc:  # counts must never stop the process: a store error, or a bug
                self.failures += 1
                if self.last_error is None or self.failures % 30 == 1:
                    log.warning("writing the counts failed (%d so far): %s; kept for the next write",
                                self.failures, exc, exc_info=not isinstance(exc, SchedulerError),
                                extra={"action": "counts_write_failed"})
                self.last_error = str(exc)
                return False
            self.writes += 1
            self.last_error = None
        if self._after_write is not None:
            self._after_write(now)
        return True

    def _lateness_rows(self, now: int) -> list[LatenessRow]:
        """This minute's histogram of each kind, as the cumulative one minus where it
        stood when the minute began (by this thread's clock)."""
        minute = now // MINUTE_MS
        current = {kind: read().snapshot() for kind, read in self._lateness.items()}
        if minute != self._minute:
            # The previous minute's rows stand as last written; values added since count in this one.
            self._minute = minute
            self._minute_base = {kind: self._last_total.get(kind, LatencyHistogram()) for kind in current}
        self._last_total = current
        rows = []
        for kind, total in current.items():
            base = self._minute_base[kind]
            delta = LatencyHistogram([a - b for a, b in zip(total.counts, base.counts, strict=True)],
                                     total.sum_ms - base.sum_ms)
            if delta.total:
                rows.append(LatenessRow(minute, kind, self.writer, delta))
        return rows
