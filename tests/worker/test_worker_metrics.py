"""The worker's collector on a real worker (embedded backend, in one process): what it
exports is what became of each task, by outcome, priority and a bounded type label, the
start lateness of each attempt, and what it holds now."""

from __future__ import annotations

import time

from prometheus_client import generate_latest
from prometheus_client.registry import CollectorRegistry

from scheduler.model import Priority, encode_message
from scheduler.ports import TaskStatus
from scheduler.visibility.worker_metrics import OUTCOMES, WorkerCollector
from scheduler.worker.runtime import Worker
from tests.metrics import Scrape
from tests.worker.rig import KAFKA, EmbeddedRig, task, wait_for


def scrape(worker: Worker) -> Scrape:
    registry = CollectorRegistry()
    registry.register(WorkerCollector(worker))
    return Scrape(generate_latest(registry).decode())


def test_outcomes_are_counted_by_priority_and_handler_type_and_unknown_types_as_other(rig: EmbeddedRig) -> None:
    now = time.time_ns() // 1_000_000
    done = rig.fire([task("sms", run_at_ms=now - 300) for _ in range(3)]
                    + [task("sms", priority=Priority.HIGH, run_at_ms=now - 300)])
    dead = rig.fire([task("sms", {"mode": "permanent"}, priority=Priority.LOW, run_at_ms=now)])
    unknown = rig.fire([task("no-such-type", run_at_ms=now) for _ in range(2)])
    rig.publish_raw("normal", b"\x01not msgpack")
    retried = rig.fire([task("poison", run_at_ms=now)])
    worker = rig.start()
    wait_for(lambda: all(rig.home(item).status is TaskStatus.DONE for item in done), what="the done tasks")
    wait_for(lambda: worker.stats.dead == 4 and worker.stats.retried >= 1, what="dead letters and a retry")

    got = scrape(worker)
    handled = got.by_labels("scheduler_worker_tasks_handled_total", "outcome", "priority", "type")
    assert handled[("done", "normal", "sms")] == 3
    assert handled[("done", "high", "sms")] == 1
    assert handled[("dead", "low", "sms")] == len(dead)
    assert handled[("dead", "normal", "other")] == len(unknown)  # a type with no handler has no label of its own
    assert handled[("dead", "unknown", "other")] == 1  # could not be decoded at all
    assert handled[("retried", "normal", "poison")] >= len(retried)
    assert {outcome for outcome, _, _ in handled} <= set(OUTCOMES)
    assert set(got.labels_of("scheduler_worker_tasks_handled_total", "type")) <= {
        *worker.app.types(), "other"}

    started = got.value("scheduler_worker_attempts_started_total")
    assert started == got.value("scheduler_worker_start_lateness_seconds_count") >= 6
    # the four done tasks were due 300 ms before the worker started
    assert got.value("scheduler_worker_start_lateness_seconds_bucket", le="0.3") <= started - 4
    assert got.value("scheduler_worker_start_lateness_seconds_sum") >= 4 * 0.3
    assert got.value("scheduler_worker_messages_received_total") >= 9
    assert set(got.labels_of("scheduler_worker_tasks_buffered", "topic")) == {"high", "normal", "low"}
    assert got.value("scheduler_worker_store_errors_total") == 0


def test_large_messages_fill_a_buffer_at_its_byte_bound_first(rig: EmbeddedRig) -> None:
    worker = rig.start(concurrency=1, buffer_per_topic=10_000, buffer_bytes_per_topic=20_000, poll_batch=5,
                       lag_interval_s=0.05)
    blocker = rig.path / "go"
    rig.fire([task("sms", {"mode": "wait_for", "path": str(blocker)})])
    wait_for(lambda: worker.running() == 1, what="the blocking task to start")
    # ~2 KB messages against 20,000 bytes: about 10 buffered, not 10,000.
    items = rig.fire([task("sms", {"text": "x" * 2000}) for _ in range(60)])
    try:
        wait_for(lambda: worker.snapshot()["buffered"]["normal"] >= 10, what="the buffer to fill")
        wait_for(lambda: worker.stats.consumer_lag is not None and sum(worker.stats.consumer_lag.values()) >= 25,
                 what="the rest held back in the queue")
        assert worker.snapshot()["buffered"]["normal"] <= 35
    finally:
        blocker.write_text("go")
    wait_for(lambda: all(rig.home(i).status is TaskStatus.DONE for i in items), what="all done", timeout_s=30)


def test_consumer_lag_counts_what_the_worker_has_not_fetched(rig: EmbeddedRig) -> None:
    worker = rig.start(concurrency=1, lag_interval_s=0.05, buffer_per_topic=10, poll_batch=10)
    wait_for(lambda: worker.stats.consumer_lag is not None, what="a first lag reading")
    blocker = rig.path / "go"
    rig.fire([task("sms", {"mode": "wait_for", "path": str(blocker)})])
    wait_for(lambda: worker.running() == 1, what="the blocking task to start")
    # With its one slot busy, the worker buffers up to `buffer_per_topic` (10) and pauses
    # the topic: the messages behind those stay in the queue, and are its lag.
    items = [task("sms") for _ in range(60)]
    for item in items:
        assert not rig.store.insert([item])
    values = [encode_message(item, 1) for item in items]
    rig.publisher.publish(KAFKA.ready_topic("normal"), values)
    rig.publisher.flush(10)
    def held() -> tuple[float, float]:
        got = scrape(worker)
        return (got.value("scheduler_worker_consumer_lag_messages", topic="normal"),
                got.value("scheduler_worker_tasks_buffered", topic="normal"))

    try:
        wait_for(lambda: sum(held()) == 60 and held()[1] >= 10, what="60 messages in the queue or the buffer")
        lag, buffered = held()
        assert lag >= 10, (lag, buffered)  # paused at 10 buffered; a poll or two may land before the pause
    finally:
        blocker.write_text("go")
    wait_for(lambda: worker.stats.done == 61, what="all done", timeout_s=30)
    wait_for(lambda: scrape(worker).value("scheduler_worker_consumer_lag_messages", topic="normal") == 0,
             what="no lag left")
