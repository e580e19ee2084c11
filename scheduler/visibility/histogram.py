"""`LatencyHistogram`: lateness in fixed buckets, cheap to add to on a hot path, merged by
adding, and read as quantiles.

One set of bucket bounds (`BOUNDS_MS`) serves every lateness the scheduler measures (fire:
publish - run_at; handler start: start - run_at), in Prometheus as much as in the
per-minute rows `scheduler status` reads, so that histograms of any process and any minute
can be added together. A quantile is estimated as Prometheus's `histogram_quantile` does,
by linear interpolation inside the bucket it falls in: its error is at most that bucket's
width (10 ms up to 100 ms, 50-100 ms up to 1 s, then coarser).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Sequence

BOUNDS_MS: tuple[int, ...] = (
    1, 2, 5, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100, 150, 200, 250, 300, 400, 500, 600, 700, 800, 900,
    1_000, 1_500, 2_000, 2_500, 3_000, 4_000, 5_000, 6_000, 7_500, 10_000, 12_500, 15_000, 20_000, 25_000,
    30_000, 40_000, 50_000, 60_000, 90_000, 120_000, 300_000, 600_000, 1_800_000,
)
"""Upper bounds (inclusive, in ms) of the buckets; one more bucket holds what is above the
last. From 1 s to 2 min no bucket is wider than half its lower bound, so a p99 of 10.6 s
reads between 10 and 12.5 s, not anywhere up to 20 s."""

FORMER_BOUNDS_MS: tuple[int, ...] = (
    1, 2, 5, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100, 150, 200, 250, 300, 400, 500, 600, 700, 800, 900,
    1_000, 1_500, 2_000, 3_000, 5_000, 10_000, 20_000, 30_000, 60_000, 120_000, 300_000, 600_000, 1_800_000,
)
"""The bounds rows written before the finer ones (kept 2 days) have; every one of them
is one of `BOUNDS_MS`, so such a row reads into the bucket with its upper bound."""


class LatencyHistogram:
    """Counts of values (ms) per bucket of `BOUNDS_MS`, and their sum. Negative values (a
    clock behind) count as 0. Not locked: one thread adds; a reader takes `snapshot()`."""

    __slots__ = ("counts", "sum_ms")

    def __init__(self, counts: Sequence[int] | None = None, sum_ms: int = 0) -> None:
        if counts is not None and len(counts) != len(BOUNDS_MS) + 1:
            raise ValueError(f"a histogram has {len(BOUNDS_MS) + 1} buckets, not {len(counts)}")
        self.counts: list[int] = list(counts) if counts is not None else [0] * (len(BOUNDS_MS) + 1)
        self.sum_ms = sum_ms

    def add(self, value_ms: int) -> None:
        value_ms = max(value_ms, 0)
        self.counts[bisect_left(BOUNDS_MS, value_ms)] += 1
        self.sum_ms += value_ms

    def add_many(self, values_ms: Iterable[int]) -> None:
        counts = self.counts
        total = 0
        for value in values_ms:
            value = max(value, 0)
            counts[bisect_left(BOUNDS_MS, value)] += 1
            total += value
        self.sum_ms += total

    def add_elapsed(self, now_ms: int, since_ms: list[int]) -> None:
        """Add `now_ms - t` for every `t` of `since_ms`: what `add_many` of those values
        adds, for a batch that shares one `now_ms` (a flush, a start). It sorts `since_ms`
        in place (a fired batch comes nearly sorted, so this is about linear) and then
        takes one bisection per bucket bound rather than one per value: the per-value
        work is the sort and the sum, both in C, which is what a dispatcher firing
        100,000 tasks a second can afford. A value at or below `BOUNDS_MS[i]` has
        `t >= now_ms - BOUNDS_MS[i]`; negative values (a `t` after `now_ms`) count as 0.
        The bisections stop at the first bound that every value is at or below: a batch
        published within a few ms of its times (small and frequent) takes a few."""
        times = since_ms
        n = len(times)
        if not n:
            return
        times.sort()
        counts = self.counts
        below = 0
        for i, bound in enumerate(BOUNDS_MS):
            at_or_below = n - bisect_left(times, now_ms - bound)
            counts[i] += at_or_below - below
            below = at_or_below
            if below == n:
                break
        counts[-1] += n - below
        past = bisect_left(times, now_ms)  # the times before now_ms: the positive values
        self.sum_ms += past * now_ms - sum(times[:past])

    @classmethod
    def stored(cls, counts: Sequence[int], sum_ms: int) -> LatencyHistogram:
        """A histogram as a count store keeps it: with `BOUNDS_MS`'s buckets, or with
        `FORMER_BOUNDS_MS`'s (each count goes to the bucket of the same upper bound)."""
        if len(counts) == len(FORMER_BOUNDS_MS) + 1:
            moved = [0] * (len(BOUNDS_MS) + 1)
            for bound, n in zip((*FORMER_BOUNDS_MS, None), counts, strict=True):
                moved[len(BOUNDS_MS) if bound is None else BOUNDS_MS.index(bound)] += n
            counts = moved
        return cls(counts, sum_ms)

    def merge(self, other: LatencyHistogram) -> None:
        for i, n in enumerate(other.counts):
            self.counts[i] += n
        self.sum_ms += other.sum_ms

    def snapshot(self) -> LatencyHistogram:
        return LatencyHistogram(self.counts, self.sum_ms)

    @property
    def total(self) -> int:
        return sum(self.counts)

    def quantile(self, q: float) -> float | None:
        """The q-quantile (0 < q <= 1) in ms, or None when empty. A quantile that falls in
        the last bucket (above `BOUNDS_MS[-1]`) is given as that bound."""
        if not 0 < q <= 1:
            raise ValueError(f"a quantile is in (0, 1], not {q}")
        total = self.total
        if total == 0:
            return None
        rank = q * total
        seen = 0
        for i, n in enumerate(self.counts):
            if n and seen + n >= rank:
                if i == len(BOUNDS_MS):
                    return float(BOUNDS_MS[-1])
                low = 0 if i == 0 else BOUNDS_MS[i - 1]
                return low + (BOUNDS_MS[i] - low) * (rank - seen) / n
            seen += n
        return float(BOUNDS_MS[-1])

    def cumulative(self) -> list[tuple[float, int]]:
        """(upper bound in seconds, values at or below it) per bucket, the last bound
        `inf`: the shape of a Prometheus histogram's `_bucket` series."""
        out = []
        running = 0
        for bound, n in zip((*BOUNDS_MS, None), self.counts, strict=True):
            running += n
            out.append((float("inf") if bound is None else bound / 1000, running))
        return out
