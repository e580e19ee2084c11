"""A dispatcher's settings (`DispatcherConfig`), its counters (`Stats`), what it holds
at a moment (`Gauges`) and the limits its parts share."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from scheduler.dispatcher.shard import DEFAULT_HORIZON_MS
from scheduler.model import BUCKET_MS
from scheduler.visibility.histogram import LatencyHistogram
from scheduler.visibility.labels import DEFAULT_TYPE_LABELS

SCHEDULE_STOP_WAIT_S = 10.0
"""How long a stopping dispatcher waits for a schedule pass under way before it gives
its leases back (the pass stops at its next schedule; runs it made are idempotent)."""

Clock = Callable[[], int]

LOAD_CHUNK = 500
"""Rows a bucket read sends to the fire loop at a time."""

PRELOADS_AT_ONCE = 2
"""Reads of buckets not yet due under way at once, over all shards (see `reading`)."""

LIMITS_ATTEMPTS = 10
"""Tries (a second apart) of the first read of the tenants' limits before giving up."""

LOAD_ATTEMPTS = 5
"""Tries of one bucket read before it is handed back to be asked for again later."""

SKEW_WARN_MS = 1000
"""A hand-off record stamped this far ahead of the dispatcher's clock is counted and logged."""

SKEW_WINDOW_MS = 60_000
"""The window over which the least lag of hand-off records is taken (`Stats.handoff_min_lag_ms`)."""


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True)
class DispatcherConfig:
    member: str
    shards: Sequence[int] | None = None
    """None for `auto`; else the pinned shards."""
    tick_ms: int = 100
    """The fire loop's beat: each tick takes the hand-offs, fires, starts reads and cursor
    advances. It is also the wheel's slot width: a slot is taken from the wheel when it
    begins and each of its tasks fires at its own `run_at`, in a pass between ticks."""
    fire_gap_ms: int = 15
    """The least time between two firing passes between ticks: tasks falling due within it
    go out in one batch (one publish and flush), so a task fires up to this late, plus the
    publish; a gap of `tick_ms` or more fires at the ticks only. A pass costs about 0.2 ms
    of CPU (a third of it the Kafka flush): at 15 ms, some 0.013 of a core while tasks
    fall due, for a fire lateness p50 of ~8 ms instead of ~56 ms (10 ms: ~6 ms, but a
    quarter more CPU a task than firing at the ticks, on a light shape)."""
    lookahead_ms: int = BUCKET_MS
    """How far ahead buckets are loaded: the next bucket is read a minute before it starts."""
    verify_lead_ms: int = 2000
    verify_grace_ms: int = 1000
    second_look_ms: int = 1000
    """How long after a slice ends (or after its bucket was read) it is counted again."""
    sweep_interval_ms: int = 20_000
    """How often each shard counts the last 90 s behind its cursor; every sixth time, the
    whole look-back horizon, bucket by bucket."""
    sweep_horizon_ms: int = DEFAULT_HORIZON_MS
    """How far back the sweep looks for rows written late."""
    dead_letter_topic: str | None = None
    """Where rows that cannot be read are parked (None: they are logged and skipped)."""
    advance_interval_ms: int = 1000
    commit_interval_ms: int = 1000
    balance_interval_s: float = 1.0
    lease_timeout_s: float = 10.0
    first_lookback_ms: int = 60 * BUCKET_MS
    """Where a never-fired shard starts when the store does not record its creation time."""
    publish_give_up_s: float = 60.0
    """After this long without a successful publish, give every shard back and exit, so
    dispatchers that can publish take over."""
    page_size: int = 500
    """Rows per page of a bucket read: a page is decoded whole, so it bounds the rows a
    read holds at once (see `reading`)."""
    reader_threads: int = 8
    looker_threads: int = 4
    writer_threads: int = 8
    long_types: frozenset[str] = frozenset()
    flush_timeout_s: float = 10.0
    stats_path: Path | None = None
    stats_interval_ms: int = 1000
    schedule_interval_ms: int = 5000
    """How often the recurring schedules of each held shard get a creation pass."""
    limits_interval_s: float = 5.0
    """How often the tenants' limits are read again from the store."""
    hold_timeout_s: float = 300.0
    """How long a released task of a capped tenant holds its place without a completion
    (its worker died and nothing ran it again) before the place is freed."""
    metrics_types: int = DEFAULT_TYPE_LABELS
    """How many distinct task types get a label of their own in the metrics (the first
    seen; the rest count as `other`)."""
    gauges_interval_ms: int = 1000
    """How often the fire loop takes the `Gauges` the metrics show."""


@dataclass
class Stats:
    """The dispatcher's counters: plain numbers that the part making each event happen
    adds to (mostly on the fire loop, the store errors on the pools' threads), read by
    the stats file and the metrics as they are, without a lock. Per task nothing is
    done but what the batch already does: counts by wheel tag and the lateness go in
    once per flushed batch."""

    fired: int = 0
    loaded: int = 0
    handed_tasks: int = 0
    handed_cancels: int = 0
    skipped_cancelled: int = 0
    slices_counted: int = 0
    slices_reread: int = 0
    rows_merged: int = 0
    advances: int = 0
    fenced_out: int = 0
    leases_lost: int = 0
    taken: int = 0
    given_back: int = 0
    publish_failures: int = 0
    store_failures: int = 0
    bad_handoffs: int = 0
    stalls: int = 0
    duplicates_dropped: int = 0
    job_errors: int = 0
    schedule_passes: int = 0
    schedule_runs_created: int = 0
    schedule_misfires: int = 0
    schedule_skipped_retention: int = 0
    schedule_skipped_refused: int = 0
    schedule_failures: int = 0
    gated: int = 0
    released: int = 0
    completions: int = 0
    limits_reads: int = 0
    limits_failures: int = 0
    slices_looked: int = 0
    looks_reread: int = 0
    rows_found_late: int = 0
    """Rows a second look found that the shard had not seen (written after its reads)."""
    sweeps: int = 0
    buckets_reread: int = 0
    rows_swept: int = 0
    """Rows a sweep found behind the cursor that the shard had not handled."""
    bad_rows: int = 0
    rows_purged: int = 0
    """Rows past their retention deleted from the embedded backend's files (`purge`)."""
    purge_failures: int = 0
    handoff_clock_ahead: int = 0
    """Hand-off records stamped more than `SKEW_WARN_MS` ahead of this dispatcher's clock."""
    handoff_min_lag_ms: int | None = None
    """The least (now - writer's stamp) over the hand-off records of the last window: the
    writers' clocks behind this one's by about this much (plus the transit), or ahead if
    negative."""
    handoff_failures: int = 0
    """Reads of the hand-off log, and commits of its positions, that failed."""
    fired_by_tag: list[int] = field(default_factory=lambda: [0] * 256)
    """Tasks published, by wheel tag (priority, long topic and type slot: `rows.tag_for`)."""
    fire_lateness: LatencyHistogram = field(default_factory=LatencyHistogram)
    """Publish (the flush acknowledged) - run_at, in ms, of every task published."""
    started_ms: int = field(default_factory=wall_clock_ms)

    def document(self) -> dict[str, object]:
        """The counters as the stats file keeps them: every number, and the lateness
        histogram's count and quantiles."""
        document: dict[str, object] = {k: v for k, v in vars(self).items() if v is None or isinstance(v, int)}
        lateness = self.fire_lateness.snapshot()
        document["fire_lateness_ms"] = {"count": lateness.total, "p50": lateness.quantile(0.5),
                                        "p99": lateness.quantile(0.99)}
        return document


@dataclass(frozen=True)
class Gauges:
    """What a dispatcher holds at one moment, taken by the fire loop (the one thread that
    may read its shards) every `gauges_interval_ms`, and replaced whole, so the metrics
    read it from another thread as it is: at most that interval old."""

    at_ms: int = 0
    shards_held: int = 0
    cursor_lag_max_ms: int | None = None
    """now - the oldest cursor written to the store among the shards held (None: none held)."""
    wheel_tasks: int = 0
    wheel_bytes: int = 0
    gate_waiting: int = 0
    """Tasks due and held back by the release gate (caps and rates)."""
    unacknowledged_batches: int = 0
    """Fired batches the queue has not acknowledged yet (published again after a failure)."""
    handoff_lag_max_ms: int = 0
    """The greatest now - writer's stamp of the hand-off records read in the interval (0: none)."""
