"""`WorkerCollector`: a worker's counters and gauges as Prometheus metrics, read at scrape
time from its `WorkerStats` (see `scheduler.visibility.metrics`).

Every metric, its labels and what it means are listed in docs/metrics.md. Labels are
bounded: `outcome` seven values, `priority` three (and `unknown` for a message that could
not be decoded), `type` the app's handler types plus `other`, `topic` the pool's topics
(high, normal, low; or long), `operation` a handful. No tenant label.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from scheduler.model import Priority
from scheduler.visibility.metrics import histogram_family
from scheduler.worker.runtime import Worker
from scheduler.worker.stats import UNKNOWN_PRIORITY

PREFIX = "scheduler_worker_"

OUTCOMES = ("done", "retried", "deferred", "dead", "skipped_cancelled", "skipped_finished", "skipped_superseded")
"""What became of a task a worker took (`WorkerStats.count`)."""


def priority_label(code: int) -> str:
    return "unknown" if code == UNKNOWN_PRIORITY else Priority.from_code(code).value


class WorkerCollector(Collector):
    """The metrics of one `Worker`."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker

    def collect(self) -> Iterator[Metric]:
        worker = self.worker
        stats, settler = worker.stats, worker.settler_stats
        yield histogram_family(PREFIX + "start_lateness_seconds",
                               "Handler start minus run_at, of each attempt started.", stats.start_lateness)

        handled = CounterMetricFamily(PREFIX + "tasks_handled", "Tasks taken from the ready topics, by what became "
                                      "of them.", labels=["outcome", "priority", "type"])
        for (outcome, code, type_), count in sorted(list(stats.handled.items())):
            handled.add_metric([outcome, priority_label(code), type_], count)
        yield handled

        yield _counter("messages_received", "Messages polled from the ready topics.", stats.received)
        yield _counter("attempts_started", "Attempts handed to a handler.", stats.started)
        yield _counter("handlers_timed_out", "Attempts settled as failed because their handler ran past its "
                       "timeout.", stats.timed_out)
        yield _counter("stale_fence_messages", "Messages published under an older shard lease than the latest "
                       "known (still run).", stats.stale_fence)

        store_errors = CounterMetricFamily(PREFIX + "store_errors", "Failed operations on the store.",
                                           labels=["operation"])
        store_errors.add_metric(["settle"], settler.write_failures - settler.queue_failures)
        store_errors.add_metric(["check"], stats.check_failures)
        store_errors.add_metric(["cancel_marks"], worker.cancel_watch.failures)
        store_errors.add_metric(["fences"], stats.fence_read_failures)
        yield store_errors
        queue_errors = CounterMetricFamily(PREFIX + "queue_errors", "Failed operations on the queue (Kafka).",
                                           labels=["operation"])
        queue_errors.add_metric(["commit"], stats.commit_failures)
        queue_errors.add_metric(["settle"], settler.queue_failures)
        queue_errors.add_metric(["completions"], settler.completion_failures)
        queue_errors.add_metric(["lag"], stats.lag_failures)
        yield queue_errors

        yield GaugeMetricFamily(PREFIX + "tasks_running", "Attempts running in handlers now.", value=worker.running())
        buffered = GaugeMetricFamily(PREFIX + "tasks_buffered", "Tasks received and waiting for a free handler.",
                                     labels=["topic"])
        for topic, count in sorted(worker.buffered_by_topic().items()):
            buffered.add_metric([topic], count)
        yield buffered
        lag = stats.consumer_lag
        if lag is not None:
            consumer_lag = GaugeMetricFamily(PREFIX + "consumer_lag_messages",
                                             "Messages of this worker's partitions it has not fetched yet.",
                                             labels=["topic"])
            for topic, count in sorted(lag.items()):
                consumer_lag.add_metric([topic], count)
            yield consumer_lag


def _counter(name: str, documentation: str, value: int) -> CounterMetricFamily:
    return CounterMetricFamily(PREFIX + name, documentation, value=value)
