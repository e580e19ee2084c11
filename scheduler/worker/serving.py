"""Which ready topic a worker serves next: smooth weighted round robin.

With weights high 7, normal 2, low 1 and all three backlogged, every run of 10 picks
serves exactly 7 high, 2 normal and 1 low, interleaved (h h n h h l h h n h rather than
7 h in a row), so a low task waits at most 10 picks however deep the high backlog is.
A topic with nothing buffered is skipped and its share goes to the others: the worker
never idles while any topic has work.

The algorithm (nginx's smooth weighted round robin): each pick adds every eligible
topic's weight to its credit, serves the topic with the most credit, and takes the sum
of the eligible weights from that topic's credit.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from scheduler.errors import ConfigError

DEFAULT_WEIGHTS = {"high": 7, "normal": 2, "low": 1}


class WeightedServing:
    def __init__(self, weights: Mapping[str, int]) -> None:
        if not weights or any(not isinstance(w, int) or w < 1 for w in weights.values()):
            raise ConfigError(f"serving weights must be positive integers, got {dict(weights)!r}")
        self.weights = dict(weights)
        self._credit = dict.fromkeys(weights, 0)

    def pick(self, has_work: Callable[[str], bool]) -> str | None:
        """The topic to serve next among those for which `has_work` is true, or None."""
        best: str | None = None
        total = 0
        for topic, weight in self.weights.items():
            if not has_work(topic):
                continue
            total += weight
            self._credit[topic] += weight
            if best is None or self._credit[topic] > self._credit[best]:
                best = topic
        if best is not None:
            self._credit[best] -= total
        return best
