"""`Scraper`: what a Prometheus would do to the processes of a bench run started with
`--metrics-port 0`: scrape every endpoint once a second, on a thread of its own, for as
long as the run lasts. It finds each endpoint in its process's log (`serving metrics on
http://...`), times every scrape, and keeps the last page of each, from which `figures`
reads what the endpoints said (tasks fired and handled, the lateness histograms) to set
beside the bench's own measurements. Used by `bench/nine_oclock.py --metrics` and
`bench/worker_throughput.py --metrics`.
"""

from __future__ import annotations

import re
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from scheduler.visibility.histogram import BOUNDS_MS, LatencyHistogram

_SERVING = re.compile(r"serving metrics on (http://\S+/metrics)")

INTERVAL_S = 1.0


@dataclass
class Endpoint:
    name: str
    log: Callable[[], str]
    url: str | None = None
    page: str = ""
    scrapes: int = 0
    failures: int = 0
    durations_ms: list[float] = field(default_factory=list)


class Scraper:
    """Scrapes each of `processes` ((name, a function returning its log so far)) every
    `interval_s` until `stop`."""

    def __init__(self, processes: Sequence[tuple[str, Callable[[], str]]], interval_s: float = INTERVAL_S) -> None:
        self.endpoints = [Endpoint(name, log) for name, log in processes]
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="scraper", daemon=True)

    def start(self) -> Scraper:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop, after one last scrape of every endpoint (the counters as the run ends)."""
        self._stop.set()
        self._thread.join(30)
        for endpoint in self.endpoints:
            self._scrape(endpoint)

    def _loop(self) -> None:
        next_at = time.monotonic()
        while not self._stop.is_set():
            for endpoint in self.endpoints:
                self._scrape(endpoint)
            next_at += self.interval_s
            self._stop.wait(max(0.0, next_at - time.monotonic()))

    def _scrape(self, endpoint: Endpoint) -> None:
        if endpoint.url is None:
            try:
                found = _SERVING.search(endpoint.log())
            except OSError:
                return
            if found is None:
                return
            endpoint.url = found.group(1)
        started = time.perf_counter()
        try:
            with urllib.request.urlopen(endpoint.url, timeout=5) as response:
                endpoint.page = response.read().decode()
        except (urllib.error.URLError, OSError):
            endpoint.failures += 1
            return
        endpoint.scrapes += 1
        endpoint.durations_ms.append((time.perf_counter() - started) * 1000)

    def figures(self) -> dict[str, Any]:
        """How the scraping went, and what the last pages said, summed over the endpoints."""
        durations = sorted(d for e in self.endpoints for d in e.durations_ms)
        totals: dict[str, float] = {}
        lateness: dict[str, LatencyHistogram] = {}
        for endpoint in self.endpoints:
            for family in text_string_to_metric_families(endpoint.page):
                if family.type == "histogram":
                    buckets = [s.value for s in family.samples if s.name.endswith("_bucket")]
                    if len(buckets) == len(BOUNDS_MS) + 1:
                        counts = [int(b - a) for a, b in zip([0.0, *buckets[:-1]], buckets, strict=True)]
                        lateness.setdefault(family.name, LatencyHistogram()).merge(LatencyHistogram(counts))
                    continue
                for sample in family.samples:
                    if sample.name in ("scheduler_dispatcher_tasks_fired_total", "scheduler_worker_tasks_handled_total",
                                       "process_cpu_seconds_total"):
                        totals[sample.name] = totals.get(sample.name, 0) + sample.value
        return {
            "endpoints": len(self.endpoints),
            "interval_s": self.interval_s,
            "scrapes": sum(e.scrapes for e in self.endpoints),
            "failures": sum(e.failures for e in self.endpoints),
            "scrape_ms": {"mean": round(sum(durations) / len(durations), 1) if durations else None,
                          "max": round(durations[-1], 1) if durations else None},
            "page_bytes": max((len(e.page) for e in self.endpoints), default=0),
            "said": {name.removeprefix("scheduler_"): value for name, value in sorted(totals.items())},
            "lateness_ms": {name.removeprefix("scheduler_"): {"count": h.total, "p50": h.quantile(0.5),
                                                              "p99": h.quantile(0.99)}
                            for name, h in sorted(lateness.items())},
        }


def summary(figures: dict[str, Any]) -> str:
    """One line for the bench's output."""
    said = ", ".join(f"{name} {value:,.0f}" for name, value in figures["said"].items())
    lateness = ", ".join(f"{name} p99 {h['p99']:,.0f} ms" for name, h in figures["lateness_ms"].items()
                         if h["p99"] is not None)
    return (f"metrics: {figures['scrapes']:,} scrapes of {figures['endpoints']} endpoints every "
            f"{figures['interval_s']:g} s ({figures['failures']} failed), {figures['scrape_ms']['mean']} ms mean, "
            f"{figures['scrape_ms']['max']} ms max, pages up to {figures['page_bytes']:,} bytes; the endpoints say "
            f"{said}; {lateness}")
