"""The `/metrics` endpoint of a dispatcher or a worker (`--metrics-port`), and what its
collectors share.

Nothing is observed per task. The processes keep plain counters and `LatencyHistogram`s
(`scheduler.dispatcher.config.Stats`, `scheduler.worker.stats.WorkerStats`), added to
once per batch on their own threads; the collectors
(`scheduler.visibility.dispatcher_metrics`, `scheduler.visibility.worker_metrics`) read
them when Prometheus scrapes, on the server's thread, without a lock: a scrape sees each
number a moment old at worst, and a histogram's count always equals its `+Inf` bucket.

One registry per process, not prometheus_client's global one: the endpoint shows
exactly what the process registered, and tests can build as many as they like in one
interpreter. The global registry is still served through it (`DefaultRegistry`): it
holds the process and Python metrics (`process_cpu_seconds_total`,
`process_resident_memory_bytes`, `python_gc_*`) and whatever a worker's application
registers there for its own handlers.

Failures: `serve` raises `ConfigError` (the CLI's exit 2) when the address cannot be
bound, e.g. the port is in use, before the process has joined anything. Once serving,
the server is a daemon thread that lives as long as the process.
"""

from __future__ import annotations

import errno
import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from threading import Thread
from wsgiref.simple_server import WSGIServer

from prometheus_client import REGISTRY, start_http_server
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector, CollectorRegistry

from scheduler.errors import ConfigError
from scheduler.visibility.histogram import LatencyHistogram

log = logging.getLogger(__name__)

DEFAULT_HOST = "127.0.0.1"
"""Loopback: nothing is exposed unless asked for. The endpoint has no authentication, and
its numbers (task types, backlogs, errors) describe the business; bind it to another
address only where the network limits who can reach it."""


def histogram_family(name: str, documentation: str, histogram: LatencyHistogram,
                     labels: Iterable[str] = (), values: Iterable[str] = ()) -> HistogramMetricFamily:
    """A Prometheus histogram in seconds from a `LatencyHistogram` (ms): the buckets are
    `BOUNDS_MS`, so Prometheus's quantiles and the scheduler's own agree."""
    snapshot = histogram.snapshot()
    family = HistogramMetricFamily(name, documentation, labels=list(labels))
    family.add_metric(list(values), [(_le(bound), count) for bound, count in snapshot.cumulative()],
                      sum_value=snapshot.sum_ms / 1000)
    return family


def _le(bound_s: float) -> str:
    return "+Inf" if bound_s == float("inf") else repr(bound_s)


class DefaultRegistry(Collector):
    """Everything in prometheus_client's global registry (see the module docstring)."""

    def collect(self) -> Iterator[Metric]:
        yield from REGISTRY.collect()


@dataclass
class MetricsServer:
    """The endpoint of one process: its registry, and the server serving it."""

    registry: CollectorRegistry
    host: str
    port: int
    """The port bound (the one asked for, or the one chosen for 0)."""
    _server: WSGIServer
    _thread: Thread

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def register(self, collector: Collector) -> None:
        self.registry.register(collector)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def serve(host: str, port: int) -> MetricsServer:
    """Bind `host:port` (0: any free port) and serve a new registry there on a daemon
    thread. `ConfigError` if the address cannot be bound."""
    if not 0 <= port <= 65535:
        raise ConfigError(f"--metrics-port {port} is not a port: use 1 to 65535, or 0 for any free one")
    registry = CollectorRegistry(auto_describe=False)
    registry.register(DefaultRegistry())
    try:
        server, thread = start_http_server(port, addr=host, registry=registry)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise ConfigError(f"--metrics-port {port}: the port is already in use on {host}; choose a free one "
                              "(each process needs its own), or 0 for any free port") from None
        raise ConfigError(f"cannot serve metrics on {host}:{port} (--metrics-host, --metrics-port): "
                          f"{exc.strerror or exc}") from None
    endpoint = MetricsServer(registry, host, int(server.server_port), server, thread)
    log.info("serving metrics on %s", endpoint.url, extra={"action": "metrics_serving"})
    return endpoint
