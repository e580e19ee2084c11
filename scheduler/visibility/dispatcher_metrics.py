"""`DispatcherCollector`: a dispatcher's counters and gauges as Prometheus metrics, read at
scrape time from `Stats` and `Gauges` (see `scheduler.visibility.metrics`).

Every metric, its labels and what it means are listed in docs/metrics.md. Labels are
bounded: `priority` has three values, `type` at most `--metrics-types` plus `other`
(`scheduler.visibility.labels`), `operation` a handful; there is no shard or tenant
label. The cursor lag is one number per dispatcher, the oldest held shard's: the alert
needs the worst shard, and a series per shard would move between dispatchers at every
rebalance (the stats file names the shards).
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from scheduler.dispatcher.context import DispatcherContext
from scheduler.dispatcher.rows import priority_of_tag, type_slot_of_tag
from scheduler.visibility.metrics import histogram_family

PREFIX = "scheduler_dispatcher_"


class DispatcherCollector(Collector):
    """The metrics of the dispatcher whose parts share `ctx`."""

    def __init__(self, ctx: DispatcherContext) -> None:
        self.ctx = ctx

    def collect(self) -> Iterator[Metric]:
        ctx = self.ctx
        stats, gauges, labels = ctx.stats, ctx.gauges, ctx.type_labels
        yield histogram_family(PREFIX + "fire_lateness_seconds",
                               "Publish time (the queue acknowledged the flush) minus run_at, of each task published.",
                               stats.fire_lateness)

        fired = CounterMetricFamily(PREFIX + "tasks_fired", "Tasks published to the ready topics.",
                                    labels=["priority", "type"])
        by_label: dict[tuple[str, str], int] = {}
        for tag, count in enumerate(list(stats.fired_by_tag)):
            if count:
                key = (priority_of_tag(tag).value, labels.name(type_slot_of_tag(tag)))
                by_label[key] = by_label.get(key, 0) + count
        for (priority, type_), count in sorted(by_label.items()):
            fired.add_metric([priority, type_], count)
        yield fired

        yield _counter("tasks_loaded", "Rows read from the store into the wheels.", stats.loaded)
        yield _counter("tasks_handed_off", "Tasks taken from the hand-off log into the wheels.", stats.handed_tasks)
        skipped = CounterMetricFamily(PREFIX + "tasks_skipped", "Due tasks not published, by why.",
                                      labels=["reason"])
        skipped.add_metric(["cancelled"], stats.skipped_cancelled)
        skipped.add_metric(["duplicate"], stats.duplicates_dropped)
        yield skipped
        schedule_skips = CounterMetricFamily(PREFIX + "schedule_slots_skipped",
                                             "Slots of recurring schedules passed over without a run, by why.",
                                             labels=["reason"])
        schedule_skips.add_metric(["retention"], stats.schedule_skipped_retention)
        schedule_skips.add_metric(["refused"], stats.schedule_skipped_refused)
        yield schedule_skips
        yield _counter("unreadable_rows", "Stored rows that could not be read, dead-lettered with their raw columns.",
                       stats.bad_rows)
        yield _counter("rows_purged", "Rows past their retention deleted from the embedded backend's files.",
                       stats.rows_purged)
        yield _counter("bad_handoffs", "Hand-off records that could not be applied, skipped.", stats.bad_handoffs)
        yield _counter("fenced_out", "Writes the store refused for a stale fencing token (the shard is dropped).",
                       stats.fenced_out)
        yield _counter("shards_lost", "Shards dropped because their lease was no longer valid.", stats.leases_lost)

        queue_errors = CounterMetricFamily(PREFIX + "queue_errors", "Failed operations on the queue (Kafka).",
                                           labels=["operation"])
        queue_errors.add_metric(["publish"], stats.publish_failures)
        queue_errors.add_metric(["handoff"], stats.handoff_failures)
        yield queue_errors
        store_errors = CounterMetricFamily(PREFIX + "store_errors",
                                           "Failed operations on the store (Cassandra, or SQLite embedded).",
                                           labels=["operation"])
        store_errors.add_metric(["tasks"], stats.store_failures)
        store_errors.add_metric(["limits"], stats.limits_failures)
        store_errors.add_metric(["schedules"], stats.schedule_failures)
        store_errors.add_metric(["purge"], stats.purge_failures)
        yield store_errors

        yield _gauge("shards_held", "Shards this dispatcher holds and fires.", gauges.shards_held)
        yield _gauge("shards", "Shards of the deployment (every dispatcher reports the same).", ctx.shard_count)
        if gauges.cursor_lag_max_ms is not None:
            yield _gauge("cursor_lag_max_seconds",
                         "Now minus the oldest cursor written to the store among the shards held.",
                         gauges.cursor_lag_max_ms / 1000)
        yield _gauge("wheel_tasks", "Tasks loaded in the wheels, waiting for their time.", gauges.wheel_tasks)
        yield _gauge("wheel_bytes", "Memory the wheels hold for them.", gauges.wheel_bytes)
        yield _gauge("gate_waiting_tasks", "Due tasks the release gate holds back (caps and rates).",
                     gauges.gate_waiting)
        yield _gauge("unacknowledged_batches", "Fired batches the queue has not acknowledged yet.",
                     gauges.unacknowledged_batches)
        yield _gauge("handoff_lag_max_seconds",
                     "Greatest now minus writer's stamp of the hand-off records read in the last second.",
                     gauges.handoff_lag_max_ms / 1000)


def _counter(name: str, documentation: str, value: int) -> CounterMetricFamily:
    return CounterMetricFamily(PREFIX + name, documentation, value=value)


def _gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(PREFIX + name, documentation, value=value)
