"""The burst's tasks, and storing them.

`Burst` makes one burst's tasks in three forms: SDK `Submission`s to store, the
ready-topic messages a dispatcher publishes for them (for the Kafka ceiling), and
payload sizes (for the memory figures); the same seed gives the same tasks. `ingest`
stores the submissions through the producer SDK, and raises `BenchFailure` when any
was rejected or not stored."""

from __future__ import annotations

import bisect
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from scheduler.adapters.cassandra.store import CassandraTaskStore
from scheduler.model import DEFAULT_MAX_ATTEMPTS, Priority, Task, TaskId, encode_message, encode_payload, from_ms
from scheduler.ports import TaskStore
from scheduler.producer import Client, Submission
from scheduler.settings import CassandraSettings

from .common import BenchFailure
from .settings import BOARD_SHARE, SAMPLE_FENCE, TASK_TYPE


def text_length_for(payload_bytes: int) -> int:
    """The text length that makes an encoded payload about `payload_bytes` long."""
    length = max(0, payload_bytes - len(encode_payload({"to": "+919800000000", "text": ""})))
    while length and len(encode_payload({"to": "+919800000000", "text": "x" * length})) > payload_bytes:
        length -= 1
    return length


@dataclass(frozen=True)
class Burst:
    """`tasks` tasks due evenly over the first `spread_ms` of the minute at `minute_ms`."""

    minute_ms: int
    tasks: int
    spread_ms: int
    text_len: int
    colleges: int

    def records(self, seed: int, count: int | None = None) -> Iterator[tuple[int, str, dict[str, str]]]:
        """(run_at_ms, tenant, payload): the board has `BOARD_SHARE` of the tasks, college
        n (1-based) a share proportional to 1/n of the rest."""
        rng = random.Random(seed)
        names = [f"college-{n}" for n in range(1, self.colleges + 1)]
        cumulative: list[float] = []
        total = 0.0
        for n in range(1, self.colleges + 1):
            total += 1 / n
            cumulative.append(total)
        filler = "Visit results.example.in for marks and the revaluation form. " * (self.text_len // 60 + 1)
        count = self.tasks if count is None else count
        for n in range(count):
            if rng.random() < BOARD_SHARE:
                tenant = "board"
            else:
                tenant = names[min(bisect.bisect(cumulative, rng.random() * total), self.colleges - 1)]
            text = f"Roll no. {rng.randrange(10**7):07d}: your result is out. {filler}"[: self.text_len]
            payload = {"to": f"+9198{rng.randrange(10**8):08d}", "text": text}
            yield self.minute_ms + n * self.spread_ms // self.tasks, tenant, payload

    def submissions(self, seed: int) -> list[Submission]:
        moments: dict[int, datetime] = {}
        items = []
        for run_at_ms, tenant, payload in self.records(seed):
            run_at = moments.get(run_at_ms) or moments.setdefault(run_at_ms, from_ms(run_at_ms))
            items.append(Submission(TASK_TYPE, payload, tenant=tenant, run_at=run_at))
        return items

    def messages(self, count: int, seed: int) -> list[bytes]:
        """Ready-topic messages for `count` tasks of this burst, as a dispatcher encodes them."""
        return [
            encode_message(Task.unchecked(TaskId.new(run_at_ms), tenant, TASK_TYPE, encode_payload(payload),
                                          run_at_ms, Priority.NORMAL, 1, DEFAULT_MAX_ATTEMPTS, None), SAMPLE_FENCE)
            for run_at_ms, tenant, payload in self.records(seed, count)
        ]

    def mean_payload_bytes(self, sample: int = 2000) -> float:
        sizes = [len(encode_payload(payload)) for _, _, payload in self.records(0, min(sample, self.tasks))]
        return sum(sizes) / len(sizes)


def ingest(cassandra: CassandraSettings, items: list[Submission],
           progress: Callable[[int], None] | None = None) -> tuple[dict[str, Any], dict[bytes, int]]:
    """Store every item with the SDK; the timing and id -> run_at_ms of what was stored.
    `progress` is told the tasks stored so far after each chunk."""
    store = CassandraTaskStore.open(cassandra)
    try:
        return ingest_into(store, items, progress)
    finally:
        store.close()


def ingest_into(store: TaskStore, items: list[Submission],
                progress: Callable[[int], None] | None = None) -> tuple[dict[str, Any], dict[bytes, int]]:
    """`ingest` into an open store (the caller closes it)."""
    client = Client(store, handoff=None)
    started = time.monotonic()
    report = client.submit_many(items, keep_ids=True,
                                progress=None if progress is None else lambda got: progress(got.stored))
    seconds = time.monotonic() - started
    if not report.complete or report.stored != len(items):
        errors = report.rejected or report.failed
        raise BenchFailure(f"ingest stored {report.stored:,} of {len(items):,}"
                           + (f"; first error: {errors[0].reason}" if errors else ""))
    expected = {task_id.bytes: task_id.run_at_ms for task_id in report.ids or [] if task_id is not None}
    timing = {"tasks": report.stored, "seconds": round(seconds, 3), "rows_per_s": round(report.stored / seconds)}
    return timing, expected
