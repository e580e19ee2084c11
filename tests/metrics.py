"""Reading a `/metrics` page in tests: `scrape(url)` fetches one over HTTP, and `Scrape`
parses it with prometheus_client's own parser and looks samples up by name and labels.
`metrics_url(log)` finds the endpoint a process logged (it was started with
`--metrics-port 0`, any free port)."""

from __future__ import annotations

import re
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

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
