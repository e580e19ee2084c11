"""`CancelWatch`: a worker's copy of the store's cancel marks, read on a thread of its own.

The rule it serves is in `scheduler.cancels`: a worker starts nothing while its copy is
older than `MAX_AGE_MS`, checks against the home row a message whose shard was marked
near the task's time, and checks again, before it starts, a message whose shard's count
moved since it was placed.

"Older than" is measured from when the read *began*: a read that began after a cancel's
mark was written sees it, whenever it ends. A failed read keeps the copy it had, which
then ages; after `MAX_AGE_MS` the worker waits (starts nothing) rather than risk running
a task cancelled meanwhile. Clock: `time.monotonic`, injectable for tests.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from scheduler import cancels
from scheduler.errors import SchedulerError
from scheduler.ports import CancelMarks, TaskStore

log = logging.getLogger(__name__)

NO_MARKS = CancelMarks({}, {})


class CancelWatch:
    """Reads `store.read_cancel_marks()` every `refresh_s` on a daemon thread."""

    def __init__(self, store: TaskStore, *, refresh_s: float = cancels.REFRESH_MS / 1000,
                 max_age_s: float = cancels.MAX_AGE_MS / 1000,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self._store = store
        self._refresh_s = refresh_s
        self._max_age_s = max_age_s
        self._monotonic = monotonic
        self.marks: CancelMarks = NO_MARKS
        """The latest copy; replaced whole on each read, so a reference to it is a snapshot."""
        self._read_from: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.reads = 0
        self.failures = 0

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="cancel-marks", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def read_once(self) -> bool:
        """Read the marks now; True if the read succeeded."""
        began = self._monotonic()
        try:
            marks = self._store.read_cancel_marks()
        except SchedulerError as exc:
            self.failures += 1
            if self.failures == 1 or self.failures % 50 == 0:
                log.warning("reading the cancel marks failed (%d times so far): %s; tasks wait for them",
                            self.failures, exc, extra={"action": "cancel_marks_failed"})
            return False
        self.marks = marks
        self._read_from = began
        self.reads += 1
        return True

    def fresh(self) -> bool:
        """Whether the copy is recent enough to start tasks by."""
        read_from = self._read_from
        return read_from is not None and self._monotonic() - read_from <= self._max_age_s

    def allows(self, shard: int, seen: int) -> bool:
        """Whether a job placed when its shard's count was `seen` may start now: the copy
        is fresh and the count has not moved. Asked at the very moment a handler would
        begin, from any thread (`scheduler.cancels` gives the argument)."""
        return self.fresh() and self.marks.counts.get(shard, 0) == seen

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.read_once()
            self._stop.wait(self._refresh_s)
