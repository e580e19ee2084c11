"""Two `scheduler worker` processes on the embedded backend share one priority: the
queue deals the `normal` topic's messages over its partitions, and the group deals the
partitions to the two members. Both handle tasks, each partition by one member, every
task once; and when one member is killed with kill -9, the other takes its partitions
once its session has expired and finishes the work, each effect still done once.

The tasks are stored and their messages published as a dispatcher does (no dispatcher
runs: it would publish a task again now and then, which is allowed but would blur the
counts of runs here)."""

from __future__ import annotations

import sqlite3
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import pytest

from scheduler.adapters.embedded.queue import SqliteQueue
from scheduler.adapters.embedded.store import SqliteTaskStore
from scheduler.model import Priority, Task, TaskId, decode_message, encode_message, encode_payload
from scheduler.ports import TaskStatus
from scheduler.settings import KafkaSettings
from scheduler.worker.context import CLAIM_S
from tests.dispatchers import Fleet
from tests.support import wait_until
from tests.workers import SESSION_TIMEOUT_S, Workers

pytestmark = pytest.mark.timeout(240)

AFTER_A_KILL_S = CLAIM_S + 5.0 + SESSION_TIMEOUT_S + 30.0
"""How long the work may take to finish after a worker is killed. b may die between
claiming an effect and marking it done: its claim then holds for `CLAIM_S` + 5 s (the
`sms` handler has no timeout), and a runs that effect only after it lapses, as the
design says ("delays the effect by the claim time"). Plus b's session, and a's work."""

KAFKA = KafkaSettings()
TOPIC = KAFKA.ready_topic("normal")
GROUP = KAFKA.worker_group("default")


class Deployment:
    """The test's store and queue files, opened by the test as another process would."""

    def __init__(self, db: Path) -> None:
        self.store = SqliteTaskStore(db)
        self.queue = SqliteQueue(db.with_name("queue.db"))

    def wait_members(self, *names: str) -> None:
        """Until the pool's group has exactly these members (each has polled), so that the
        first messages are dealt to all of them at once rather than to whichever joined
        first and then moved."""
        def members() -> set[str]:
            with closing(sqlite3.connect(self.queue.path)) as db:
                return {name for (name,) in db.execute('SELECT member FROM members WHERE "group" = ?', (GROUP,))}

        wait_until(lambda: members() == set(names), timeout_s=30, what=f"members {sorted(names)} in the group")

    def fire(self, payloads: list[dict[str, object]]) -> list[Task]:
        """Store one `sms` task of normal priority per payload, due now, and publish their
        messages in one flush, as a dispatcher fires a slot."""
        now = time.time_ns() // 1_000_000
        tasks = [Task(TaskId.new(now), "board", "sms", encode_payload(payload), now, Priority.NORMAL)
                 for payload in payloads]
        assert not self.store.insert(tasks)
        publisher = self.queue.publisher()
        publisher.publish(TOPIC, [encode_message(task, 1) for task in tasks])
        publisher.flush(30)
        return tasks

    def partition_of(self) -> dict[str, int]:
        """Task id -> the partition its message is in."""
        return {str(decode_message(d.value).task.id): d.partition for d in self.queue.scanner().scan(TOPIC)}

    def committed(self) -> int:
        return sum(self.queue.position(GROUP, TOPIC, p) or 0 for p in range(self.queue.ready_partitions))

    def statuses(self, tasks: list[Task]) -> Counter[str]:
        found = self.store.get_many([task.id for task in tasks])
        return Counter(found[task.id].status.value if task.id in found else "missing" for task in tasks)

    def close(self) -> None:
        self.queue.close()
        self.store.close()


@pytest.fixture
def deployment(embedded: tuple[Fleet, Workers]) -> Iterator[Deployment]:
    fleet, _ = embedded
    made = Deployment(Path(fleet.env["SCHEDULER_DB"]))
    try:
        yield made
    finally:
        made.close()


def wait_done(deployment: Deployment, tasks: list[Task], timeout_s: float) -> None:
    wait_until(lambda: deployment.statuses(tasks)[TaskStatus.DONE.value] == len(tasks), timeout_s=timeout_s,
               interval_s=0.2, what=f"{len(tasks)} tasks done")


def test_two_worker_processes_share_a_priority_and_handle_every_task_once(
    embedded: tuple[Fleet, Workers], deployment: Deployment
) -> None:
    _, workers = embedded
    a, b = workers.start("a"), workers.start("b")
    workers.wait_started(a, b)
    deployment.wait_members("a", "b")
    tasks = deployment.fire([{"effect": f"e-{n}"} for n in range(400)])
    wait_done(deployment, tasks, timeout_s=60)
    wait_until(lambda: deployment.committed() == len(tasks), timeout_s=30, what="every message committed")

    sink = workers.sink()
    runs, effects = sink.runs(), Counter(effect[0] for effect in sink.effects())
    sink.close()
    per_task = Counter(run[0] for run in runs)
    assert set(per_task) == {str(task.id) for task in tasks}, "a task was not handled"
    assert set(per_task.values()) == {1}, f"handled twice: {[t for t, n in per_task.items() if n > 1]}"
    assert effects == Counter(f"e-{n}" for n in range(400))
    by_process = Counter(run[5] for run in runs)
    assert set(by_process) == {a.pid, b.pid}, f"runs by process: {by_process}"
    # Each partition was handled by one member, and each member had half of them.
    partition_of = deployment.partition_of()
    handlers: defaultdict[int, set[int]] = defaultdict(set)
    for run in runs:
        handlers[partition_of[run[0]]].add(run[5])
    assert len(handlers) == deployment.queue.ready_partitions
    assert all(len(pids) == 1 for pids in handlers.values()), f"a partition handled by both: {dict(handlers)}"
    assert Counter(pid for pids in handlers.values() for pid in pids) == {a.pid: 4, b.pid: 4}
    a.check_alive()
    b.check_alive()


def test_when_a_worker_is_killed_the_other_takes_its_partitions_and_finishes_the_work(
    embedded: tuple[Fleet, Workers], deployment: Deployment
) -> None:
    _, workers = embedded
    a, b = workers.start("a", concurrency=2), workers.start("b", concurrency=2)
    workers.wait_started(a, b)
    deployment.wait_members("a", "b")
    # Each worker runs 2 at a time, 50 ms each: ~40 tasks/s, so its share of 320 takes
    # ~4 s and b is killed early in it.
    tasks = deployment.fire([{"mode": "sleep", "s": 0.05, "effect": f"e-{n}"} for n in range(320)])
    sink = workers.sink()
    wait_until(lambda: sum(1 for run in sink.runs() if run[5] == b.pid) >= 20, timeout_s=30,
               what="worker b to handle some tasks")
    b.kill()
    killed_ms = time.time_ns() // 1_000_000
    ran_by_b = {run[0] for run in sink.runs() if run[5] == b.pid}
    partition_of = deployment.partition_of()
    b_partitions = {partition_of[task] for task in ran_by_b}
    left_in_b_partitions = [t for t, p in partition_of.items() if p in b_partitions and t not in ran_by_b]
    assert left_in_b_partitions, "worker b had finished its share before the kill: not mid-work"

    wait_done(deployment, tasks, timeout_s=AFTER_A_KILL_S)
    wait_until(lambda: deployment.committed() == len(tasks), timeout_s=30, what="every message committed")
    runs, effects = sink.runs(), Counter(effect[0] for effect in sink.effects())
    sink.close()
    per_task = Counter(run[0] for run in runs)
    assert set(per_task) == {str(task.id) for task in tasks}, "a task was lost"
    assert effects == Counter(f"e-{n}" for n in range(320)), "an effect was repeated or lost"
    # Only what b had started could run twice (it died before committing it).
    again = {task for task, n in per_task.items() if n > 1}
    assert again <= ran_by_b, f"run twice though b never started them: {sorted(again - ran_by_b)}"
    after = [run for run in runs if run[3] > killed_ms]
    assert {run[5] for run in after} == {a.pid}
    taken = {partition_of[run[0]] for run in after}
    assert b_partitions <= taken, f"a took partitions {sorted(taken)}, b had {sorted(b_partitions)}"
    assert set(left_in_b_partitions) <= {run[0] for run in after}
    a.check_alive()
