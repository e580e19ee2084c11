"""Workers as real processes on the real Cassandra, Kafka and ZooKeeper, fed by real
dispatchers: kill -9 mid-batch, backoff of a poison task, permanent errors, weighted
serving under a backlog, the long pool, dead letters and their replay, a stale
attempt's late report, and SIGTERM with handlers in flight.

Every worker runs `tests.worker.apps:app` and reports each handler start and each
effect to one SQLite sink shared by the test's processes (`tests/workers.py`)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path

import pytest
from confluent_kafka import Producer

from scheduler.adapters.kafka.consumer import KafkaTopicScanner
from scheduler.adapters.kafka.publisher import KafkaPublisher
from scheduler.adapters.kafka.security import client_config
from scheduler.model import Priority, Task, TaskId, decode_message, encode_message, from_ms
from scheduler.ports import StatusReport, StoredTask, TaskStatus
from scheduler.producer import Submission
from scheduler.worker import dead_letters
from scheduler.worker.dead_letters import DeadLetter
from scheduler.worker.runtime import LEAVE_S
from tests.dispatchers import Deployment
from tests.support import run_cli, wait_until
from tests.workers import Workers, wait_for_group

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

DEFAULT_POOL_PARTITIONS = 12
"""high, normal and low, 4 partitions each (the deployment fixture's topics)."""


def at(ms: int) -> datetime:
    return from_ms(ms)


def submit(deployment: Deployment, items: Iterable[Submission]) -> list[TaskId]:
    report = deployment.client.submit_many(items)
    assert report.complete and report.ids is not None, report
    return [task_id for task_id in report.ids if task_id is not None]


def homes(deployment: Deployment, ids: Iterable[TaskId]) -> dict[TaskId, StoredTask]:
    return deployment.store.get_many(list(ids))


def home(deployment: Deployment, task_id: TaskId) -> StoredTask:
    found = deployment.store.get(task_id)
    assert found is not None, f"task {task_id} is not stored"
    return found


def wait_status(deployment: Deployment, ids: Iterable[TaskId], status: TaskStatus, *, timeout_s: float) -> None:
    wanted = list(ids)

    def reached() -> bool:
        found = homes(deployment, wanted)
        return len(found) == len(wanted) and all(row.status is status for row in found.values())

    def missing() -> str:
        found = homes(deployment, wanted)
        return str(Counter(row.status.value for row in found.values()))

    try:
        wait_until(reached, timeout_s=timeout_s, interval_s=0.2, what=f"{len(wanted)} tasks to be {status.value}")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; statuses now: {missing()}") from None


def letters(deployment: Deployment) -> list[DeadLetter]:
    """The dead letters waiting on the deployment's dead-letter topic."""
    scanned = KafkaTopicScanner(deployment.kafka).scan(deployment.kafka.dead_letter_topic)
    waiting, _, unreadable = dead_letters.waiting(scanned)
    assert unreadable == 0
    return waiting


def letter_of(deployment: Deployment, task_id: TaskId, timeout_s: float = 10) -> DeadLetter:
    """The waiting dead letter of `task_id`, once it is there."""
    found = wait_until(lambda: next((x for x in letters(deployment) if x.task_id == task_id), None),
                       timeout_s=timeout_s, interval_s=0.2, what=f"the dead letter of {task_id}")
    assert found is not None
    return found


def start_dispatcher(deployment: Deployment, *args: str) -> None:
    deployment.fleet.start("d", *args)


def wait_dispatching(deployment: Deployment) -> None:
    """Until the dispatcher holds every shard. Tasks submitted before that are both in
    the first read of their bucket and on the hand-off log, and the dispatcher may then
    publish them twice (seen: 3 of 40), which would blur the counts of runs here."""
    deployment.fleet.wait_for_split({"d": 64}, timeout_s=60)


def test_kill_9_of_a_worker_mid_batch_loses_no_task_and_repeats_no_effect(
    deployment: Deployment, workers: Workers, tmp_path: Path
) -> None:
    start_dispatcher(deployment)
    a = workers.start("a", concurrency=1)
    workers.wait_started(a)
    wait_dispatching(deployment)
    marker = tmp_path / "blocked"
    now = deployment.now_ms()
    # One handler slot: the first 100 run, then the blocker takes the slot for good, and
    # the 100 after it (due later) are received and buffered but never started.
    before = submit(deployment, (Submission("sms", {"effect": f"e-{n}"}, run_at=at(now + 2_000)) for n in range(100)))
    (blocker,) = submit(deployment, [Submission("sms", {"mode": "block_once", "marker": str(marker),
                                                          "effect": "e-block"}, run_at=at(now + 2_500))])
    after = submit(deployment, (Submission("sms", {"effect": f"e-{n}"}, run_at=at(now + 3_000))
                                for n in range(100, 200)))
    ids = [*before, blocker, *after]

    wait_until(marker.exists, timeout_s=30, what="the blocker to start")
    wait_until(lambda: a.stats().get("received", 0) >= len(ids), timeout_s=15,
               what="worker a to receive the tasks after the blocker")
    a.kill()
    sink = workers.sink()
    ran_by_a = {run[0] for run in sink.runs()}
    assert str(blocker) in ran_by_a
    assert 0 < len(ran_by_a) < len(ids), f"{len(ran_by_a)} of {len(ids)} tasks ran before the kill: not mid-batch"

    b = workers.start("b", concurrency=8)
    wait_status(deployment, ids, TaskStatus.DONE, timeout_s=60)
    runs = sink.runs()
    effects = Counter(effect[0] for effect in sink.effects())
    sink.close()
    redeliveries = len(runs) - len(ids)
    assert effects == Counter([f"e-{n}" for n in range(200)] + ["e-block"]), (
        f"effects repeated or missing: {sorted(k for k, n in effects.items() if n != 1)}; {redeliveries} redeliveries")
    per_task = Counter(run[0] for run in runs)
    assert set(per_task) == {str(task_id) for task_id in ids}
    assert per_task[str(blocker)] == 2, f"the blocker ran {per_task[str(blocker)]} times; {redeliveries} redeliveries"
    assert {run[5] for run in runs if run[0] == str(blocker)} == {a.pid, b.pid}
    assert redeliveries >= 1, f"{redeliveries} redeliveries"  # at least the blocker's second run
    b.check_alive()


def test_a_poison_task_backs_off_1_2_4_s_and_is_dead_after_4_attempts(
    deployment: Deployment, workers: Workers
) -> None:
    start_dispatcher(deployment)
    a = workers.start("a")
    workers.wait_started(a)
    wait_dispatching(deployment)
    (poison,) = submit(deployment, [Submission("poison", {"to": "+31"})])
    wait_status(deployment, [poison], TaskStatus.DEAD, timeout_s=60)

    sink = workers.sink()
    runs = [run for run in sink.runs() if run[0] == str(poison)]
    sink.close()
    assert [run[1] for run in runs] == [1, 2, 3, 4], runs
    starts = [run[3] for run in runs]
    gaps = [later - earlier for earlier, later in zip(starts, starts[1:], strict=False)]
    windows = [1_000, 2_000, 4_000]  # base 1 s doubling, no jitter, cap 8 s
    for gap, window in zip(gaps, windows, strict=True):
        assert window <= gap <= window + 10_000, f"gaps {gaps} ms against windows {windows}"
    assert gaps[0] < gaps[1] < gaps[2], gaps
    for _, attempt, _, started_ms, run_at_ms, _, _ in runs:
        assert started_ms >= run_at_ms, f"attempt {attempt} started {run_at_ms - started_ms} ms early"

    row = home(deployment, poison)
    assert (row.status, row.status_attempt) == (TaskStatus.DEAD, 4)
    assert row.error is not None and dead_letters.EXHAUSTED in row.error
    assert "provider timed out (attempt 4)" in row.error
    letter = letter_of(deployment, poison)
    assert (letter.reason, letter.attempt, letter.type, letter.tenant) == (dead_letters.EXHAUSTED, 4, "poison", "college")
    assert "provider timed out (attempt 4)" in letter.error
    assert decode_message(letter.message).task.attempt == 4


def test_a_permanent_error_is_dead_at_once_after_one_run_with_a_dead_letter(
    deployment: Deployment, workers: Workers
) -> None:
    start_dispatcher(deployment)
    a = workers.start("a")
    workers.wait_started(a)
    wait_dispatching(deployment)
    (doomed,) = submit(deployment, [Submission("sms", {"mode": "permanent", "to": "+4412"})])
    wait_status(deployment, [doomed], TaskStatus.DEAD, timeout_s=30)
    row = home(deployment, doomed)
    assert row.status_attempt == 1
    assert row.error is not None and dead_letters.PERMANENT in row.error and "invalid phone number +4412" in row.error
    letter = letter_of(deployment, doomed)
    assert (letter.reason, letter.attempt, letter.type) == (dead_letters.PERMANENT, 1, "sms")
    assert "invalid phone number +4412" in letter.error
    sink = workers.sink()
    assert [(run[0], run[1]) for run in sink.runs()] == [(str(doomed), 1)]
    sink.close()
    assert a.stats().get("retried", 0) == 0


def test_a_full_backlog_is_served_7_2_1_high_normal_low(deployment: Deployment, workers: Workers) -> None:
    # No dispatcher: the tasks are published here, straight to the ready topics, and a
    # dispatcher would fire the stored copies a second time.
    priority_of: dict[str, Priority] = {}
    tasks: list[Task] = []
    for priority in (Priority.HIGH, Priority.NORMAL, Priority.LOW):
        for n in range(600):
            item = deployment.client.task("sms", {"n": n}, priority=priority)
            tasks.append(item)
            priority_of[str(item.id)] = priority
    # A gate first: it holds the one handler slot until the whole backlog is buffered in
    # the worker, so what follows is the serving order itself, not the order in which
    # the fetcher happened to bring the partitions in.
    gate_path = workers.directory / "gate-open"
    gate = deployment.client.task("sms", {"mode": "wait_for", "path": str(gate_path)}, priority=Priority.HIGH)
    assert deployment.store.insert([gate, *tasks]) == []  # home rows: the worker's check finds them scheduled
    a = workers.start("a", concurrency=1)
    sink = workers.sink()
    publisher = KafkaPublisher(deployment.kafka, client_id="test-backlog")
    try:
        publisher.publish(deployment.kafka.ready_topic("high"), [encode_message(gate, 1)])
        publisher.flush(30)
        wait_until(lambda: [run[0] for run in sink.runs()] == [str(gate.id)], timeout_s=60,
                   what="the gate to hold the one slot")
        for priority in (Priority.HIGH, Priority.NORMAL, Priority.LOW):
            publisher.publish(deployment.kafka.ready_topic(priority.value),
                              [encode_message(item, 1) for item in tasks if item.priority is priority])
        publisher.flush(30)
    finally:
        publisher.close()

    def all_in_hand() -> bool:
        stats = a.stats()
        return stats.get("received") == 1801 and sum(stats.get("buffered", {}).values()) == 1800

    wait_until(all_in_hand, timeout_s=60, what="the whole backlog buffered behind the gate")
    gate_path.touch()
    wait_until(lambda: len(sink.runs()) >= 401, timeout_s=60, what="400 runs after the gate")
    a.check_alive()
    runs = sink.runs()
    sink.close()
    assert runs[0][0] == str(gate.id)
    order = [priority_of[run[0]] for run in runs[1:]]
    # With all three topics backlogged: exactly 7 in 10 high, 2 in 10 normal, 1 in 10
    # low (smooth weighted round robin), and never more than 10 runs without a low.
    assert Counter(order[:300]) == {Priority.HIGH: 210, Priority.NORMAL: 60, Priority.LOW: 30}, Counter(order[:300])
    lows = [n for n, priority in enumerate(order[:400]) if priority is Priority.LOW]
    assert max(b - a for a, b in zip([-1, *lows], lows, strict=False)) <= 10, lows


def test_a_long_task_in_the_long_pool_does_not_delay_short_ones(deployment: Deployment, workers: Workers) -> None:
    start_dispatcher(deployment, "--long-types", "report")
    long_worker = workers.start("long", "--drain-timeout", "1", pool="long", concurrency=1)
    short_worker = workers.start("short", concurrency=8)
    workers.wait_started(long_worker, short_worker)
    wait_dispatching(deployment)
    (report,) = submit(deployment, [Submission("report", {"mode": "sleep", "s": 60})])
    sink = workers.sink()
    report_run = wait_until(lambda: next((r for r in sink.runs() if r[0] == str(report)), None), timeout_s=30,
                            what="the report to start")
    assert report_run is not None
    assert report_run[5] == long_worker.pid

    shorts = submit(deployment, (Submission("sms", {"n": n}) for n in range(100)))
    wait_status(deployment, shorts, TaskStatus.DONE, timeout_s=18)
    elapsed_ms = deployment.now_ms() - report_run[3]
    wait_until(lambda: home(deployment, report).status is TaskStatus.RUNNING, timeout_s=10,
               what="the long task shown running (its report is written once it has run a second)")
    assert elapsed_ms < 20_000, f"the short tasks took until {elapsed_ms} ms into the 60 s report"
    runs = sink.runs()
    sink.close()
    assert {run[5] for run in runs if run[0] != str(report)} == {short_worker.pid}
    assert sum(run[0] == str(report) for run in runs) == 1
    topics = {m.topic for m in deployment.ready.snapshot() if m.task_id == report}
    assert topics == {deployment.kafka.ready_topic("long")}

    # SIGTERM while the report runs on: the long worker leaves after its 1 s drain timeout
    # (the report will be delivered again to the next long worker), it does not wait for
    # the report's 60 s: it settles, commits and leaves within `LEAVE_S` more, whatever
    # the broker and the store take (the bound it promises, not the second it takes when
    # the machine is quiet).
    asked = time.monotonic()
    long_worker.signal(signal.SIGTERM)
    try:
        long_worker.process.wait(timeout=1 + LEAVE_S + 5)
    except subprocess.TimeoutExpired:
        pass
    took = time.monotonic() - asked
    assert not long_worker.alive(), (
        f"the long worker still runs {took:.1f} s after SIGTERM with --drain-timeout 1:\n{long_worker.log()[-1500:]}")
    assert home(deployment, report).status is TaskStatus.RUNNING


def test_undecodable_and_unknown_type_messages_are_dead_lettered_the_worker_goes_on_and_replay_resubmits(
    deployment: Deployment, workers: Workers
) -> None:
    start_dispatcher(deployment)
    a = workers.start("a", concurrency=4)
    workers.wait_started(a)
    wait_dispatching(deployment)
    deployment.ready.close()  # the fixture's reader of the ready topics cannot decode garbage; not needed here
    # Garbage, then a good task behind it on the same partition: the worker must pass it.
    follower = deployment.client.task("sms", {"after": "garbage"})
    assert deployment.store.insert([follower]) == []
    producer = Producer({**client_config(deployment.kafka), "enable.idempotence": True})  # keeps the order
    normal = deployment.kafka.ready_topic("normal")
    producer.produce(normal, b"\xc1 this is not a message", partition=0)
    producer.produce(normal, encode_message(follower, 1), partition=0)
    assert producer.flush(30) == 0
    (fax,) = submit(deployment, [Submission("fax", {"to": "+3120"})])
    (later,) = submit(deployment, [Submission("sms", {"after": "fax"})])

    wait_status(deployment, [follower.id, later], TaskStatus.DONE, timeout_s=30)
    wait_status(deployment, [fax], TaskStatus.DEAD, timeout_s=10)
    assert "fax" in (home(deployment, fax).error or "")
    wait_until(lambda: len(letters(deployment)) >= 2, timeout_s=10, what="two dead letters")
    wait_until(lambda: a.stats().get("undecodable") == 1 and a.stats().get("unknown_type") == 1, timeout_s=5,
               what="the worker's counters")

    env = {**os.environ, **deployment.fleet.env}
    listed = run_cli("dlq", "list", "--json", env=env)
    assert listed.returncode == 0, listed.stderr
    rows = [json.loads(line) for line in listed.stdout.splitlines()]
    by_reason = {row["reason"]: row for row in rows}
    assert len(rows) == 2 and set(by_reason) == {dead_letters.UNDECODABLE, dead_letters.UNKNOWN_TYPE}, rows
    garbage, unknown = by_reason[dead_letters.UNDECODABLE], by_reason[dead_letters.UNKNOWN_TYPE]
    assert (garbage["task_id"], garbage["source_topic"]) == (None, normal)
    assert (unknown["task_id"], unknown["type"], unknown["tenant"]) == (str(fax), "fax", "college")

    replayed = run_cli("dlq", "replay", unknown["letter"], env=env)
    assert replayed.returncode == 0, replayed.stderr
    line = replayed.stdout.strip()
    assert line.startswith(f"{unknown['letter']}: replayed as ") and line.endswith(f"(was {fax})"), line
    new_id = TaskId.parse(line.split(" replayed as ")[1].split()[0])
    assert new_id != fax
    resubmitted = home(deployment, new_id)
    assert (resubmitted.task.type, resubmitted.task.tenant, resubmitted.task.attempt) == ("fax", "college", 1)

    again = run_cli("dlq", "list", "--json", env=env)
    assert again.returncode == 0, again.stderr
    names = {json.loads(line)["letter"] for line in again.stdout.splitlines()}
    assert unknown["letter"] not in names and garbage["letter"] in names
    # The new task is fired and reaches the worker, which still has no handler for it.
    wait_until(lambda: any(x.task_id == new_id for x in letters(deployment)), timeout_s=30,
               what="the replayed task to be dead-lettered in turn")
    a.check_alive()


def test_a_stale_attempts_late_done_does_not_change_the_status(deployment: Deployment, workers: Workers) -> None:
    start_dispatcher(deployment)
    a = workers.start("a")
    workers.wait_started(a)
    wait_dispatching(deployment)
    (failing,) = submit(deployment, [Submission("sms", {"mode": "fail"}, max_attempts=2)])
    (control,) = submit(deployment, [Submission("sms", {}, delay=3600)])  # never fired during the test
    wait_status(deployment, [failing], TaskStatus.DEAD, timeout_s=30)
    dead = home(deployment, failing)
    assert dead.status_attempt == 2 and "provider timed out (attempt 2)" in (dead.error or "")

    # Attempt 1's worker, late, reports done (and running): the newer attempt's dead stands.
    deployment.store.record_status([StatusReport(failing, 1, TaskStatus.DONE)])
    deployment.store.record_status([StatusReport(failing, 1, TaskStatus.RUNNING)])
    deployment.store.record_status([StatusReport(failing, 2, TaskStatus.RUNNING)])
    after = home(deployment, failing)
    assert (after.status, after.status_attempt, after.error) == (TaskStatus.DEAD, 2, dead.error)
    # The same report on a task with no newer one is recorded: the write itself works.
    deployment.store.record_status([StatusReport(control, 1, TaskStatus.DONE)])
    assert home(deployment, control).status is TaskStatus.DONE


def test_sigterm_lets_handlers_in_flight_finish_and_they_are_not_run_again(
    deployment: Deployment, workers: Workers
) -> None:
    start_dispatcher(deployment)
    a = workers.start("a", "--drain-timeout", "15", concurrency=4)
    b = workers.start("b", concurrency=8)
    # Both in the group before anything runs: a rebalance while a holds handlers would
    # rightly hand their messages to b as well.
    held = wait_for_group(deployment.kafka, {"a", "b"}, partitions=DEFAULT_POOL_PARTITIONS)
    wait_dispatching(deployment)
    # The tasks go to the topic a holds most partitions of, so that a surely runs some
    # whatever the assignor deals it (a balance of counts alone may give it none of one).
    topics = Counter(topic for topic, _ in held["a"])
    priority = next(p for p in Priority if deployment.kafka.ready_topic(p.value) == topics.most_common(1)[0][0])
    now = deployment.now_ms()
    ids = submit(deployment, (Submission("sms", {"mode": "sleep", "s": 1}, priority=priority,
                                         run_at=at(now + 1_000 + 100 * n)) for n in range(40)))
    sink = workers.sink()

    def a_in_flight() -> bool:
        recent = deployment.now_ms() - 500
        return any(run[5] == a.pid and run[3] >= recent for run in sink.runs())

    wait_until(a_in_flight, timeout_s=30, interval_s=0.02, what="worker a to be running handlers")
    asked = time.monotonic()
    asked_ms = deployment.now_ms()
    a.signal(signal.SIGTERM)
    in_flight = {run[0] for run in sink.runs() if run[5] == a.pid and run[3] > asked_ms - 900}
    assert in_flight
    code = a.process.wait(timeout=20)
    took = time.monotonic() - asked
    assert took < 15, f"worker a took {took:.1f} s to stop, past its 15 s drain timeout"

    wait_status(deployment, ids, TaskStatus.DONE, timeout_s=40)
    runs = sink.runs()
    sink.close()
    per_task = Counter(run[0] for run in runs)
    assert set(per_task) == {str(task_id) for task_id in ids}
    # A dispatcher may publish a task twice (at least once), and both copies may run: a
    # repeat counts only beyond the task's publications.
    published = Counter(str(m.task_id) for m in deployment.ready.snapshot())
    ran_by_a = {run[0] for run in runs if run[5] == a.pid}
    # Whatever a ran, in flight at SIGTERM or before, it settled and committed before it
    # left: nobody runs it again.
    again = {t: (per_task[t], published[t]) for t in ran_by_a if per_task[t] > published[t]}
    assert not again, f"(runs, publications) of tasks a ran and someone ran again: {again}"
    once = [task_id for task_id in in_flight if published[task_id] == 1]
    assert once and all(per_task[task_id] == 1 for task_id in once), {t: per_task[t] for t in in_flight}
    # a leaving rebalances the group, and the eager assignor takes every partition from b
    # too and hands them back: b's own handlers in flight at that moment are delivered to
    # b again and, their home rows saying `running`, run a second time. Bounded: b's
    # tasks only, at most once more each.
    repeats = {t: (n, published[t]) for t, n in per_task.items() if n > published[t]}
    assert all(n <= p + 1 for n, p in repeats.values()), f"{len(runs)} runs of {len(ids)} tasks: {repeats}"
    assert {run[5] for run in runs} == {a.pid, b.pid}
    b.check_alive()
    assert code == 0, f"worker a exited {code} after SIGTERM:\n{a.log()[-2000:]}"
