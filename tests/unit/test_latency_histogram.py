"""The lateness histogram: buckets as Prometheus counts them (le: at or below), quantiles
within a bucket's width of the true ones, merging the same as adding."""

from __future__ import annotations

import math
import random
from bisect import bisect_left

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler.visibility.histogram import BOUNDS_MS, FORMER_BOUNDS_MS, LatencyHistogram


def test_a_value_on_a_bound_counts_in_that_bound_s_bucket() -> None:
    h = LatencyHistogram()
    h.add(10)
    h.add(11)
    cumulative = dict(h.cumulative())
    assert cumulative[0.010] == 1
    assert cumulative[0.020] == 2
    assert cumulative[float("inf")] == 2


def test_negative_values_count_as_zero_and_huge_ones_in_the_last_bucket() -> None:
    h = LatencyHistogram()
    h.add_many([-50, 10**9])
    assert h.counts[0] == 1 and h.counts[-1] == 1
    assert h.sum_ms == 10**9
    assert h.quantile(1.0) == BOUNDS_MS[-1]


def test_an_empty_histogram_has_no_quantile_and_bad_quantiles_are_refused() -> None:
    assert LatencyHistogram().quantile(0.5) is None
    with pytest.raises(ValueError):
        LatencyHistogram().quantile(0)
    with pytest.raises(ValueError):
        LatencyHistogram([1, 2, 3])


@given(st.lists(st.integers(min_value=0, max_value=1_000_000), min_size=1, max_size=400),
       st.sampled_from([0.5, 0.9, 0.99, 1.0]))
def test_a_quantile_is_within_its_bucket_of_the_true_one(values: list[int], q: float) -> None:
    h = LatencyHistogram()
    h.add_many(values)
    estimate = h.quantile(q)
    assert estimate is not None
    ordered = sorted(values)
    true = ordered[math.ceil(q * len(ordered)) - 1]
    i = bisect_left(BOUNDS_MS, true)
    low = 0 if i == 0 else BOUNDS_MS[i - 1]
    high = BOUNDS_MS[min(i, len(BOUNDS_MS) - 1)]
    assert low <= estimate <= high


def test_merging_is_adding() -> None:
    rng = random.Random(7)
    a_values = [rng.randrange(0, 5000) for _ in range(500)]
    b_values = [rng.randrange(0, 50_000) for _ in range(300)]
    a, b, both = LatencyHistogram(), LatencyHistogram(), LatencyHistogram()
    a.add_many(a_values)
    b.add_many(b_values)
    both.add_many(a_values + b_values)
    merged = a.snapshot()
    merged.merge(b)
    assert merged.counts == both.counts and merged.sum_ms == both.sum_ms
    assert a.total == 500  # the snapshot was merged into, not a


@given(st.integers(min_value=0, max_value=4_000_000_000_000),
       st.lists(st.integers(min_value=-3_000_000, max_value=3_000_000), max_size=400))
def test_adding_elapsed_times_from_one_moment_is_adding_each_value(now_ms: int, offsets: list[int]) -> None:
    """`add_elapsed` (one bisection per bound, for a fired batch) and `add_many` (one per
    value) agree on every bucket and on the sum, bounds, negatives and outliers included."""
    since = [now_ms - offset for offset in offsets]
    fast, plain = LatencyHistogram(), LatencyHistogram()
    fast.add_elapsed(now_ms, since)
    plain.add_many(now_ms - t for t in since)
    assert fast.counts == plain.counts
    assert fast.sum_ms == plain.sum_ms


def test_adding_elapsed_times_on_the_bounds() -> None:
    h = LatencyHistogram()
    h.add_elapsed(10_000, [10_000 - bound for bound in BOUNDS_MS] + [10_001])
    assert h.counts[:len(BOUNDS_MS)] == [2] + [1] * (len(BOUNDS_MS) - 1)  # 10_001 is -1 ms: the first bucket
    assert h.counts[-1] == 0 and h.sum_ms == sum(BOUNDS_MS)


def test_a_row_with_the_former_buckets_reads_into_the_buckets_of_the_same_bounds() -> None:
    former = [0] * (len(FORMER_BOUNDS_MS) + 1)
    former[FORMER_BOUNDS_MS.index(20_000)] = 7  # (10 s, 20 s] before
    former[-1] = 2  # above 30 min
    read = LatencyHistogram.stored(former, 150_000)
    assert read.total == 9 and read.sum_ms == 150_000
    assert read.counts[BOUNDS_MS.index(20_000)] == 7 and read.counts[-1] == 2
    quantile = read.quantile(0.5)
    assert quantile is not None and 15_000 <= quantile <= 20_000  # within the bucket it now sits in
    assert LatencyHistogram.stored(read.counts, 1).counts == read.counts
    assert set(FORMER_BOUNDS_MS) <= set(BOUNDS_MS)


def test_a_p99_of_ten_seconds_reads_within_a_quarter_of_it() -> None:
    histogram = LatencyHistogram()
    histogram.add_many([5_000] * 9_800 + [10_300] * 150 + [10_600] * 50)
    p99 = histogram.quantile(0.99)
    assert p99 is not None and 10_000 <= p99 <= 12_500
