"""Reading a `/metrics` page in tests: `scrape(url)` fetches one over HTTP, and `Scrape`
parses it with prometheus_client's own parser and looks samples up by name and labels.
`metrics_url(log)` finds the endpoint a process logged (it was started with
`--metrics-port 0`, any free port); `lint` runs `promtool check metrics` on a page; and
`check_end_to_end` runs real dispatchers and a worker and checks that what their
endpoints say adds up (tests/embedded/test_metrics_embedded.py and
tests/integration/test_metrics_cluster.py)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from scheduler import Submission, connect
from tests.dispatchers import Fleet, ManagedProcess
from tests.support import wait_until
from tests.workers import Workers

_SERVING = re.compile(r"serving metrics on (http://\S+/metrics)")


def metrics_url(log: str) -> str | None:
    """The endpoint a process's log says it serves, if it says so yet."""
    found = _SERVING.search(log)
    return found.group(1) if found else None


def scrape(url: str, timeout_s: float = 10) -> Scrape:
    with urllib.request.urlopen(url, timeout=timeout_s) as response:
        return Scrape(response.read().decode())


@dataclass
class Scrape:
    text: str
    families: dict[str, str] = field(init=False)
    """Family name -> its type."""
    samples: list[Sample] = field(init=False)

    def __post_init__(self) -> None:
        self.families, self.samples = {}, []
        for family in text_string_to_metric_families(self.text):
            self.families[family.name] = family.type
            self.samples += family.samples

    def names(self) -> set[str]:
        return set(self.families)

    def sample_names(self) -> set[str]:
        return {sample.name for sample in self.samples}

    def exportable(self) -> set[str]:
        """Every sample name the families can have, with or without samples yet."""
        suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum")}
        return {name + suffix for name, kind in self.families.items() for suffix in suffixes.get(kind, ("",))}

    def matching(self, name: str, **labels: str) -> Iterator[Sample]:
        for sample in self.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                yield sample

    def value(self, name: str, **labels: str) -> float:
        """The sum of the samples of `name` with these labels (0 if there is none)."""
        return sum(sample.value for sample in self.matching(name, **labels))

    def by_labels(self, name: str, *keys: str) -> dict[tuple[str, ...], float]:
        """The samples of `name` summed by the values of the labels `keys`, zeros left out."""
        out: dict[tuple[str, ...], float] = {}
        for sample in self.matching(name):
            key = tuple(sample.labels.get(k, "") for k in keys)
            out[key] = out.get(key, 0) + sample.value
        return {key: value for key, value in out.items() if value}

    def labels_of(self, name: str, key: str) -> list[str]:
        return [sample.labels[key] for sample in self.matching(name) if key in sample.labels]


def promtool() -> str:
    """The path of `promtool` (Debian's `prometheus` package, which .ci/run installs).
    Without it a test is skipped, but fails under CI: there it must be checked."""
    found = shutil.which("promtool")
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("promtool is missing: .ci/run installs it (apt-get install prometheus)")
        pytest.skip("promtool is not installed (apt-get install prometheus)")
    return found


def lint(text: str) -> None:
    """`promtool check metrics`: Prometheus's own lint of names, units, suffixes and help."""
    done = subprocess.run([promtool(), "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


@dataclass
class EndToEnd:
    dispatchers: list[Scrape]
    worker: Scrape
    tasks: int


def wait_for_endpoint(process: ManagedProcess, timeout_s: float = 60) -> str:
    def found() -> str | None:
        if not process.alive():
            raise AssertionError(f"{process.name} exited:\n{process.log()[-3000:]}")
        return metrics_url(process.log())

    url = wait_until(found, timeout_s=timeout_s, what=f"{process.name}'s metrics endpoint")
    assert url is not None
    return url


def check_end_to_end(fleet: Fleet, workers: Workers, *, tasks: int, timeout_s: float = 120) -> EndToEnd:
    """Two dispatchers and a worker with `--metrics-port 0`; `tasks` tasks submitted
    (due over the next three seconds, in three priorities); then what the endpoints say
    must add up: every task fired once, handled `done` once, in both lateness
    histograms once, and the dispatchers' shards held adding up to the shard count."""
    dispatchers = [fleet.start(name, "--metrics-port", "0") for name in ("d1", "d2")]
    worker = workers.start("w", "--metrics-port", "0", concurrency=8)
    d_urls = [wait_for_endpoint(d) for d in dispatchers]
    w_url = wait_for_endpoint(worker)

    def split() -> bool:
        scrapes = [scrape(url) for url in d_urls]
        held = [s.value("scheduler_dispatcher_shards_held") for s in scrapes]
        count = scrapes[0].value("scheduler_dispatcher_shards")
        return count > 0 and sum(held) == count and all(held)

    wait_until(split, timeout_s=timeout_s, what="the shards split between the two dispatchers")
    workers.wait_started(worker, timeout_s=timeout_s)

    priorities = ["high", "normal", "low"]
    now = datetime.now(timezone.utc)
    with connect(tenant="metrics", env={**os.environ, **fleet.env}) as client:
        report = client.submit_many(
            Submission(type="sms", payload={"n": n}, priority=priorities[n % 3],
                       run_at=now + timedelta(milliseconds=1000 + 2000 * n // tasks)) for n in range(tasks))
    assert report.stored == tasks, report

    def handled() -> float:
        worker.check_alive()
        return scrape(w_url).value("scheduler_worker_tasks_handled_total", outcome="done")

    wait_until(lambda: handled() >= tasks, timeout_s=timeout_s, what=f"{tasks} tasks handled")
    # A dispatcher's counters move when the queue acknowledged the flush, before a worker
    # can see the batch: by now they hold every task.
    result = EndToEnd([scrape(url) for url in d_urls], scrape(w_url), tasks)
    fired = [s.by_labels("scheduler_dispatcher_tasks_fired_total", "priority", "type") for s in result.dispatchers]
    by_priority: dict[str, float] = {}
    for one in fired:
        for (priority, type_), n in one.items():
            assert type_ == "sms"
            by_priority[priority] = by_priority.get(priority, 0) + n
    assert by_priority == {p: sum(1 for n in range(tasks) if priorities[n % 3] == p) for p in priorities}
    assert sum(s.value("scheduler_dispatcher_fire_lateness_seconds_count") for s in result.dispatchers) == tasks
    assert sum(s.value("scheduler_dispatcher_shards_held") for s in result.dispatchers) \
        == result.dispatchers[0].value("scheduler_dispatcher_shards")
    assert result.worker.by_labels("scheduler_worker_tasks_handled_total", "outcome", "type") == {("done", "sms"): tasks}
    assert result.worker.value("scheduler_worker_start_lateness_seconds_count") == tasks
    assert result.worker.value("scheduler_worker_store_errors_total") == 0
    for text in [s.text for s in result.dispatchers] + [result.worker.text]:
        lint(text)
    return result
