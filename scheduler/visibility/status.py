"""`read_status`: what `scheduler status` (and the status page) show, gathered from the
count store and the shards table; no task is read.

Reads, whatever the number of tasks stored: the snapshot and the hour rows since it
(rows per writer and (tenant, type), not per task), one hour partition's tenant slice per
hour of `since` for the per-minute figures, the lateness rows of the last minutes, the
processes partition, and one shard row per shard.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from scheduler.ports import AGGREGATE_TENANT, CountStore, ProcessReport, TaskStore
from scheduler.visibility.counts import (
    EVENTS,
    HOUR_MS,
    MINUTE_MS,
    ZERO,
    Levels,
    Pair,
    Values,
    add_values,
    levels,
    sum_rows,
)
from scheduler.visibility.histogram import BOUNDS_MS, LatencyHistogram
from scheduler.visibility.retention import LIVE_MS
from scheduler.visibility.writer import STOPPED

LATENESS_WINDOW_MS = 5 * MINUTE_MS
"""The lateness percentiles are over this last stretch (or `since`, if shorter)."""


@dataclass(frozen=True)
class ShardRow:
    shard: int
    owner: str | None
    token: int | None
    cursor_ms: int | None
    lag_ms: int | None
    """now - cursor: how far behind now the shard has handled everything."""


@dataclass(frozen=True)
class Lateness:
    kind: str
    count: int
    p50_ms: float | None
    p99_ms: float | None
    max_bucket_ms: int | None
    """The upper bound of the highest bucket with a value (None: no value)."""


@dataclass
class Status:
    at_ms: int
    since_ms: int
    tenant: str | None
    type: str | None
    levels: dict[Pair, Levels]
    total: Levels
    per_minute: list[tuple[int, dict[str, int]]]
    """(minute start ms, events in it) from `since` to now, every minute, zeros included."""
    lateness: dict[str, Lateness]
    shards: list[ShardRow]
    processes: list[ProcessReport]
    stalest_ms: int | None
    """Age of the oldest last report of a live dispatcher or worker: how stale their
    counts can be (a producer writes its last counts as it closes)."""
    dead_by_tenant: dict[str, int] = field(default_factory=dict)
    consumer_lag: dict[str, int] = field(default_factory=dict)
    lateness_per_minute: dict[str, list[tuple[int, Lateness]]] = field(default_factory=dict)
    """kind -> (minute start ms, that minute's lateness) over `since`; only when asked."""


def _matches(pair: Pair, tenant: str | None, type_: str | None) -> bool:
    return (tenant is None or pair[0] == tenant) and (type_ is None or pair[1] == type_)


def current_totals(counts: CountStore, now_ms: int) -> dict[Pair, Values]:
    """Event totals of all time per (tenant, type): the snapshot plus every hour since."""
    snapshot = counts.read_snapshot()
    if snapshot is None:
        return {}
    hour, base = snapshot
    return sum_rows(counts.read_hours(list(range(hour + 1, now_ms // HOUR_MS + 1))), base)


def running_by_pair(processes: Iterable[ProcessReport]) -> dict[Pair, int]:
    running: dict[Pair, int] = {}
    for process in processes:
        for pair, n in process.running.items():
            running[pair] = running.get(pair, 0) + n
    return running


def _lateness(kind: str, merged: LatencyHistogram) -> Lateness:
    top = None
    if merged.total:
        i = max(i for i, n in enumerate(merged.counts) if n)
        top = BOUNDS_MS[min(i, len(BOUNDS_MS) - 1)]
    return Lateness(kind, merged.total, merged.quantile(0.5), merged.quantile(0.99), top)


def lateness_of(counts: CountStore, kind: str, first_minute: int, last_minute: int) -> Lateness:
    merged = LatencyHistogram()
    for row in counts.read_lateness(kind, first_minute, last_minute):
        merged.merge(row.histogram)
    return _lateness(kind, merged)


def lateness_by_minute(counts: CountStore, kind: str, first_minute: int,
                       last_minute: int) -> list[tuple[int, Lateness]]:
    """Each minute's lateness from `first_minute` to `last_minute`, empty minutes included."""
    merged: dict[int, LatencyHistogram] = {}
    for row in counts.read_lateness(kind, first_minute, last_minute):
        merged.setdefault(row.minute, LatencyHistogram()).merge(row.histogram)
    return [(m * MINUTE_MS, _lateness(kind, merged.get(m, LatencyHistogram())))
            for m in range(first_minute, last_minute + 1)]


def per_minute(counts: CountStore, first_minute: int, last_minute: int, tenant: str | None,
               type_: str | None) -> list[tuple[int, dict[str, int]]]:
    rows = counts.read_minutes(first_minute, last_minute, AGGREGATE_TENANT if tenant is None else tenant)
    sums: dict[int, Values] = {}
    for row in rows:
        if type_ is None or row.type == type_:
            sums[row.period] = add_values(sums.get(row.period, ZERO), row.values)
    return [(m * MINUTE_MS, dict(zip(EVENTS, sums.get(m, ZERO), strict=True)))
            for m in range(first_minute, last_minute + 1)]


SHARD_READERS = 16
"""Shard rows read at once: 64 one after another cost 64 round trips (~100 ms on
loopback), most of a status read."""


def shard_rows(store: TaskStore, now_ms: int) -> list[ShardRow]:
    with ThreadPoolExecutor(SHARD_READERS, thread_name_prefix="status-shards") as pool:
        states = list(pool.map(store.read_shard, range(store.shard_count)))
    rows = []
    for shard, state in enumerate(states):
        cursor = state.fired_through_ms
        rows.append(ShardRow(shard, state.owner, state.lease_token, cursor,
                             None if cursor is None else max(now_ms - cursor, 0)))
    return rows


def read_status(store: TaskStore, counts: CountStore, *, since_ms: int = HOUR_MS, tenant: str | None = None,
                type_: str | None = None, now_ms: int | None = None, shards: bool = True,
                consumer_lag: Mapping[str, int] | None = None, minute_lateness: bool = False) -> Status:
    """The status as of `now_ms`; `consumer_lag` (ready topic -> messages behind) is the
    queue's to say (`backends.consumer_lag`), passed through. With `minute_lateness`, also
    each minute's lateness over `since` (the status page's chart)."""
    now = time.time_ns() // 1_000_000 if now_ms is None else now_ms
    processes = [p for p in counts.read_processes() if now - p.updated_ms <= LIVE_MS and not p.detail.get(STOPPED)]
    running = running_by_pair(processes)
    totals = current_totals(counts, now)
    pairs = {pair for pair in (*totals, *running) if _matches(pair, tenant, type_)}
    by_pair = {pair: levels(totals.get(pair, ZERO), running.get(pair, 0)) for pair in sorted(pairs)}
    total = Levels(*(sum(getattr(lv, name) for lv in by_pair.values()) for name in Levels.__dataclass_fields__))
    last_minute = now // MINUTE_MS
    first_minute = (now - since_ms) // MINUTE_MS + 1
    window_first = max(first_minute, (now - LATENESS_WINDOW_MS) // MINUTE_MS + 1)
    dead: dict[str, int] = {}
    for (t, _), lv in by_pair.items():
        if lv.dead:
            dead[t] = dead.get(t, 0) + lv.dead
    ages = [now - p.updated_ms for p in processes if p.role != "producer"]
    return Status(
        at_ms=now, since_ms=since_ms, tenant=tenant, type=type_, levels=by_pair, total=total,
        per_minute=per_minute(counts, first_minute, last_minute, tenant, type_),
        lateness={kind: lateness_of(counts, kind, window_first, last_minute) for kind in ("fire", "start")},
        shards=shard_rows(store, now) if shards else [], processes=processes,
        stalest_ms=max(ages) if ages else None, dead_by_tenant=dead, consumer_lag=dict(consumer_lag or {}),
        lateness_per_minute={kind: lateness_by_minute(counts, kind, first_minute, last_minute)
                             for kind in ("fire", "start")} if minute_lateness else {})


def status_document(status: Status) -> dict[str, object]:
    """The status as JSON-able values (`scheduler status --json`, the status page)."""
    return {
        "at_ms": status.at_ms,
        "since_s": status.since_ms // 1000,
        "tenant": status.tenant,
        "type": status.type,
        "stalest_ms": status.stalest_ms,
        "total": status.total.as_dict(),
        "counts": [{"tenant": t, "type": k, **lv.as_dict()} for (t, k), lv in status.levels.items()],
        "per_minute": [{"minute_ms": at, **events} for at, events in status.per_minute],
        "lateness": {kind: {"count": lt.count, "p50_ms": lt.p50_ms, "p99_ms": lt.p99_ms,
                            "max_bucket_ms": lt.max_bucket_ms} for kind, lt in status.lateness.items()},
        "shards": [{"shard": s.shard, "owner": s.owner, "token": s.token, "cursor_ms": s.cursor_ms,
                    "lag_ms": s.lag_ms} for s in status.shards],
        "processes": [{"writer": p.writer, "role": p.role, "host": p.host, "pid": p.pid,
                       "started_ms": p.started_ms, "updated_ms": p.updated_ms,
                       "running": sum(p.running.values()), "detail": dict(p.detail)} for p in status.processes],
        "dead_by_tenant": status.dead_by_tenant,
        "consumer_lag": status.consumer_lag,
    }
