"""The metrics: bounded type labels, the dispatcher's collector read from a real fire loop
(manual clock, in-memory ports), and the endpoint (a real HTTP server on loopback).
The worker's collector is tested on a real worker in tests/worker/test_worker_metrics.py;
whole processes in tests/embedded/test_metrics_embedded.py."""

from __future__ import annotations

import socket
import threading
import urllib.request

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry

from scheduler import handoff
from scheduler.errors import ConfigError
from scheduler.model import Priority, Task, TaskId
from scheduler.ports import HandoffRecord
from scheduler.visibility.dispatcher_metrics import DispatcherCollector
from scheduler.visibility.histogram import BOUNDS_MS
from scheduler.visibility.labels import OTHER, TypeLabels
from scheduler.visibility.metrics import serve
from tests.metrics import Scrape
from tests.unit.test_dispatch_gate import NOW, SHARDS, Rig

# --- bounded labels ---------------------------------------------------------------


def test_the_first_types_seen_get_labels_and_the_rest_are_other() -> None:
    labels = TypeLabels(2)
    assert [labels.label(t) for t in ("sms", "email", "push", "sms", "fax")] == ["sms", "email", OTHER, "sms", OTHER]
    assert labels.labels() == [OTHER, "sms", "email"]
    assert labels.slot("push") == 0 and labels.name(labels.slot("email")) == "email"
    assert TypeLabels(0).label("sms") == OTHER


def test_a_type_named_other_never_takes_a_slot() -> None:
    labels = TypeLabels(3)
    assert labels.slot(OTHER) == 0
    assert labels.labels() == [OTHER]


def test_a_worker_labels_its_handler_types_only() -> None:
    labels = TypeLabels(fixed=["sms", "report"])
    assert labels.label("report") == "report" and labels.label("sms") == "sms"
    assert labels.label("unknown") == OTHER
    assert sorted(labels.labels()) == sorted([OTHER, "report", "sms"])


def test_at_most_the_limit_of_types_get_slots_whichever_threads_ask() -> None:
    labels = TypeLabels(31)
    barrier = threading.Barrier(8)

    def ask(n: int) -> None:
        barrier.wait()
        for i in range(200):
            labels.slot(f"type-{(n * 37 + i) % 100}")

    threads = [threading.Thread(target=ask, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    named = labels.labels()
    assert len(named) == 32 and len(set(named)) == 32
    assert all(labels.name(labels.slot(name)) == name for name in named[1:])
    with pytest.raises(ValueError):
        TypeLabels(32)  # the slot has 5 bits


# --- the dispatcher's collector --------------------------------------------------


def task_of(shard: int, run_at_ms: int, type_: str, priority: Priority) -> Task:
    while True:
        task_id = TaskId.new(run_at_ms)
        if task_id.shard(SHARDS) == shard:
            return Task(task_id, "board", type_, b"\x90", run_at_ms, priority)


def scrape(registry: CollectorRegistry) -> Scrape:
    return Scrape(generate_latest(registry).decode())


def test_the_dispatcher_exports_what_it_fired_by_priority_and_bounded_type_and_its_lateness() -> None:
    rig = Rig()
    rig.dispatcher.ctx.type_labels = TypeLabels(2)  # as --metrics-types 2
    rig.hold(0, NOW - 1)
    sent = [task_of(0, NOW - 250, "sms", Priority.HIGH), task_of(0, NOW - 250, "sms", Priority.HIGH),
            task_of(0, NOW - 40, "email", Priority.NORMAL), task_of(0, NOW - 40, "push", Priority.LOW),
            task_of(0, NOW - 3000, "fax", Priority.LOW)]
    rig.reader.pending = [HandoffRecord(0, n, handoff.encode_task(item), NOW - 10) for n, item in enumerate(sent)]
    rig.dispatcher._tick()
    assert len(rig.publisher.sent) == 5
    registry = CollectorRegistry()
    registry.register(DispatcherCollector(rig.dispatcher.ctx))
    got = scrape(registry)

    fired = "scheduler_dispatcher_tasks_fired_total"
    assert got.by_labels(fired, "priority", "type") == {
        ("high", "sms"): 2, ("normal", "email"): 1, ("low", "other"): 2}  # push and fax are beyond the first two
    lateness = "scheduler_dispatcher_fire_lateness_seconds"
    assert got.value(lateness + "_count") == 5
    assert got.value(lateness + "_bucket", le="0.04") == 2
    assert got.value(lateness + "_bucket", le="0.25") == 4
    assert got.value(lateness + "_bucket", le="3.0") == 5
    assert got.value(lateness + "_sum") == pytest.approx((250 * 2 + 40 * 2 + 3000) / 1000)
    assert [float(le) for le in got.labels_of(lateness + "_bucket", "le")[:-1]] == [b / 1000 for b in BOUNDS_MS]

    assert got.value("scheduler_dispatcher_tasks_handed_off_total") == 5
    assert got.value("scheduler_dispatcher_shards") == SHARDS
    assert got.value("scheduler_dispatcher_shards_held") == 1
    assert got.value("scheduler_dispatcher_handoff_lag_max_seconds") == pytest.approx(0.010)
    assert got.value("scheduler_dispatcher_cursor_lag_max_seconds") == pytest.approx(0.001)
    assert got.value("scheduler_dispatcher_queue_errors_total", operation="publish") == 0
    for name in got.names():
        assert name.startswith(("scheduler_dispatcher_",)), name


def test_a_failed_publish_is_counted_and_fires_nothing_until_it_succeeds() -> None:
    from scheduler.errors import QueueError

    rig = Rig()
    rig.hold(0, NOW - 1)
    failing = [True]
    publish = rig.publisher.publish

    def flaky(topic: str, values: list[bytes], stamp: int | None = None) -> None:
        if failing[0]:
            raise QueueError("broker gone")
        publish(topic, values, stamp)

    rig.publisher.publish = flaky  # type: ignore[method-assign,assignment]
    rig.reader.pending = [HandoffRecord(0, 0, handoff.encode_task(task_of(0, NOW - 5, "sms", Priority.NORMAL)))]
    rig.dispatcher._tick()
    registry = CollectorRegistry()
    registry.register(DispatcherCollector(rig.dispatcher.ctx))
    got = scrape(registry)
    assert got.value("scheduler_dispatcher_queue_errors_total", operation="publish") == 1
    assert got.value("scheduler_dispatcher_fire_lateness_seconds_count") == 0
    assert got.value("scheduler_dispatcher_unacknowledged_batches") == 1
    failing[0] = False
    rig.now += 1000
    rig.dispatcher._tick()
    got = scrape(registry)
    assert got.value("scheduler_dispatcher_fire_lateness_seconds_count") == 1
    assert got.value("scheduler_dispatcher_fire_lateness_seconds_sum") == pytest.approx(1.005)
    assert got.by_labels("scheduler_dispatcher_tasks_fired_total", "priority", "type") == {("normal", "sms"): 1}


# --- the endpoint ---------------------------------------------------------------


def test_the_endpoint_serves_its_own_registry_and_the_process_metrics() -> None:
    server = serve("127.0.0.1", 0)
    try:
        rig = Rig()
        server.register(DispatcherCollector(rig.dispatcher.ctx))
        with urllib.request.urlopen(server.url, timeout=10) as response:
            text = response.read().decode()
        names = {family.name for family in text_string_to_metric_families(text)}
        assert "scheduler_dispatcher_shards_held" in names
        assert "process_cpu_seconds" in names  # prometheus_client's default collectors, through the global registry
    finally:
        server.close()


def test_a_port_in_use_is_a_usage_error_that_names_the_flag() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError, match=f"--metrics-port {port}: the port is already in use"):
            serve("127.0.0.1", port)
