"""A dispatcher in this process on the embedded backend's real adapters (SQLite store,
queue, hand-off reader and coordinator, in one test's directory), driven by hand.

`Rig.pump()` is one turn of the fire loop: the manual clock moves on, what the inbox
holds is applied, then `_tick` runs. Writer jobs run inline, at once, in order; reader
jobs too unless real reader threads are asked for (a read that must fail while the
fire loop goes on). The coordinator has no heartbeat thread and a clock of its own, so
a session lives until the test moves that clock past its timeout (a crashed member's
leases then go to whoever asks next).

For fault injection: `FlakyPublisher`, whose flush fails while the test says so and which
records what the queue acknowledged; and `passed_unacknowledged`, the cursor rule as
read from the store: a cursor, as written, never at or after a task the queue has not
acknowledged (what a kill -9 at that moment would leave to the next owner).
"""

from __future__ import annotations

import queue
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from scheduler.adapters.embedded.coordinator import SqliteCoordinator
from scheduler.adapters.embedded.queue import SqliteQueue
from scheduler.adapters.embedded.store import SqliteTaskStore
from scheduler.dispatcher.purge import Purger
from scheduler.dispatcher.rows import topic_tags
from scheduler.dispatcher.runtime import Dispatcher, DispatcherConfig
from scheduler.errors import QueueError
from scheduler.model import Task, TaskId, decode_message
from scheduler.ports import Publisher, TaskStore
from scheduler.settings import READY_TOPICS, KafkaSettings
from tests.tasks import make_task

SHARDS = 4
SESSION_S = 10.0
"""The coordinator's session timeout, on its own manual clock."""

KAFKA = KafkaSettings()
READY = frozenset(KAFKA.ready_topic(name) for name in READY_TOPICS)


class ManualClock:
    """Milliseconds that move only when the test moves them."""

    def __init__(self, now_ms: int) -> None:
        self.now_ms = now_ms

    def __call__(self) -> int:
        return self.now_ms


class SecondsClock:
    """The coordinators' clock (seconds), moved by hand to expire a crashed member's session."""

    def __init__(self, now_s: float) -> None:
        self.now_s = now_s

    def __call__(self) -> float:
        return self.now_s


def task_in(shard: int, run_at_ms: int, *, tenant: str = "board") -> Task:
    """A task due at `run_at_ms` whose id falls in `shard` (of `SHARDS`)."""
    while True:
        task = make_task(run_at_ms, tenant=tenant)
        if task.id.shard(SHARDS) == shard:
            return task


Failing = Callable[[list[Task], int], bool]
"""(the tasks of a flush, the dispatcher's clock) -> whether the flush fails."""
LettersFailing = Callable[[list[bytes], int], bool]
"""(the dead letters of a flush, the dispatcher's clock) -> whether the flush fails."""


class FlakyPublisher:
    """The embedded queue's publisher behind a fault: values wait here until `flush`,
    which stores nothing and raises `QueueError` while `failing` says so. Records every
    message the queue acknowledged with the dispatcher's clock at that moment, and what
    it refused."""

    def __init__(self, inner: Publisher, clock: Callable[[], int], failing: Failing | None = None,
                 letters_failing: LettersFailing | None = None) -> None:
        self.inner = inner
        self.clock = clock
        self.failing: Failing = failing if failing is not None else (lambda tasks, now: False)
        self.letters_failing: LettersFailing = letters_failing if letters_failing is not None else (
            lambda letters, now: False)
        self._buffer: list[tuple[str, list[bytes], int | None]] = []
        self.acked: dict[TaskId, int] = {}
        """Task id -> when the queue first acknowledged it."""
        self.sent: list[tuple[int, Task]] = []
        """Every acknowledged ready message: (the clock then, its task)."""
        self.refused: set[TaskId] = set()
        self.failures = 0
        self.letters: list[bytes] = []
        """Acknowledged values of other topics (the dead-letter topic)."""

    def publish(self, topic: str, values: Sequence[bytes], timestamp_ms: int | None = None) -> None:
        self._buffer.append((topic, list(values), timestamp_ms))

    def flush(self, timeout_s: float) -> None:
        buffer, self._buffer = self._buffer, []
        tasks = [decode_message(value).task for topic, values, _ in buffer if topic in READY for value in values]
        letters = [value for topic, values, _ in buffer if topic not in READY for value in values]
        now = self.clock()
        if self.failing(tasks, now) or self.letters_failing(letters, now):
            self.failures += 1
            self.refused.update(task.id for task in tasks)
            raise QueueError("injected fault: the queue did not acknowledge the batch")
        for topic, values, stamp in buffer:
            self.inner.publish(topic, values, stamp)
        self.inner.flush(timeout_s)
        for task in tasks:
            self.acked.setdefault(task.id, now)
            self.sent.append((now, task))
        self.letters += letters

    def close(self) -> None:
        self._buffer = []
        self.inner.close()


class Rig:
    """One dispatcher on the embedded adapters under `directory`; see the module docstring."""

    def __init__(self, directory: Path, member: str, clock: ManualClock, coordinator_clock: SecondsClock, *,
                 store: TaskStore | None = None, failing: Failing | None = None,
                 letters_failing: LettersFailing | None = None, inline_readers: bool = True,
                 purgers: Mapping[str, Purger] | None = None, **config: Any) -> None:
        self.clock = clock
        self._own_store = store is None
        self.store: TaskStore = store if store is not None else SqliteTaskStore(directory / "tasks.db",
                                                                                shard_count=SHARDS)
        self.queue = SqliteQueue(directory / "queue.db", handoff_topic=KAFKA.handoff_topic)
        self.coordinator = SqliteCoordinator(directory / "coordinator.db", session_timeout_s=SESSION_S,
                                             clock=coordinator_clock, heartbeat=False)
        self.publisher = FlakyPublisher(self.queue.publisher(), clock, failing, letters_failing)
        settings: dict[str, Any] = {"dead_letter_topic": KAFKA.dead_letter_topic, **config}
        self.dispatcher = Dispatcher(
            DispatcherConfig(member=member, **settings), store=self.store, coordinator=self.coordinator,
            publisher=self.publisher, handoff_reader=self.queue.handoff_reader(KAFKA.dispatcher_group),
            topics=topic_tags({name: KAFKA.ready_topic(name) for name in READY_TOPICS}), clock=clock,
            purgers=purgers,
        )

        def inline(job: Callable[[], None]) -> None:
            job()

        self.dispatcher.ctx.writers.submit = inline  # type: ignore[method-assign,assignment]
        if inline_readers:
            self.dispatcher.ctx.readers.submit = inline  # type: ignore[method-assign,assignment]
            self.dispatcher.ctx.lookers.submit = inline  # type: ignore[method-assign,assignment]
        self.dispatcher.start_session()
        self.checks: list[Callable[[], None]] = []
        """Run after every pump (the cursor rule, say)."""
        self._closed = False

    def take(self) -> None:
        """One pass of the balancer: take every free shard this member is due, and start it."""
        self.dispatcher.ownership.balance_once()
        self.drain()

    def drain(self) -> None:
        inbox = self.dispatcher.ctx.inbox
        while True:
            try:
                action = inbox.get_nowait()
            except queue.Empty:
                return
            action()

    def pump(self, step_ms: int = 100) -> None:
        self.clock.now_ms += step_ms
        self.drain()
        self.dispatcher._tick()
        for check in self.checks:
            check()

    def pump_until(self, condition: Callable[[], object], *, max_pumps: int, what: str | Callable[[], str],
                   step_ms: int = 100) -> None:
        """Pump until `condition` holds; fail after `max_pumps` turns (of manual time)."""
        for _ in range(max_pumps):
            if condition():
                return
            self.pump(step_ms)
        if not condition():
            said = what if isinstance(what, str) else what()
            raise AssertionError(f"{said}: not reached after {max_pumps} turns of {step_ms} ms")

    def kill(self) -> None:
        """Stop as kill -9 stops: nothing more is written, nothing given back; the session
        stays in the coordinator's file until it expires."""
        self._closed = True
        self.coordinator.crash()
        self.dispatcher.ctx.stopping.set()  # lets reader threads sleeping between attempts end
        self.shutdown_pools()
        self.queue.close()
        if self._own_store:
            self.store.close()

    def shutdown_pools(self) -> None:
        ctx = self.dispatcher.ctx
        schedules = self.dispatcher.schedules
        for pool in (ctx.readers, ctx.lookers, ctx.writers, *([] if schedules is None else [schedules.pool])):
            pool.shutdown(wait=True, cancel_futures=True)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.dispatcher.ctx.stopping.set()
        self.shutdown_pools()
        self.coordinator.close()
        self.queue.close()
        if self._own_store:
            self.store.close()


def cursors(store: TaskStore) -> dict[int, int | None]:
    return {shard: store.read_shard(shard).fired_through_ms for shard in range(SHARDS)}


def passed_unacknowledged(store: TaskStore, tasks: Iterable[Task], acked: Collection[TaskId]) -> list[str]:
    """Every task at or before its shard's cursor, as the store holds it now, that the
    queue has not acknowledged: what a next owner starting there would never fire.
    (Read the cursors before `acked` grows any further: acknowledgements only add.)"""
    through = cursors(store)
    missed = []
    for task in tasks:
        cursor = through[task.id.shard(SHARDS)]
        if cursor is not None and task.run_at_ms <= cursor and task.id not in acked:
            missed.append(f"{task.id} due {task.run_at_ms}, shard {task.id.shard(SHARDS)} cursor {cursor}")
    return missed


def published_ids(q: SqliteQueue) -> list[TaskId]:
    """Every task id in the ready topics, once per message."""
    return [decode_message(value).task.id for topic in sorted(READY) for value in q.read(topic)]
