"""The count store's port: what `scheduler status` reads instead of scanning tasks.

Writers' absolute event counts per hour and per minute (`scheduler.visibility.counts`),
the snapshot that folds past hours into totals, each process's heartbeat with its gauges,
and lateness histograms per minute. Kept by two adapters that meet
`tests/contract/test_count_store.py`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from scheduler.visibility.counts import AGGREGATE_TENANT, CountRow, Pair, Values
from scheduler.visibility.histogram import LatencyHistogram

__all__ = ["AGGREGATE_TENANT", "CountStore", "LatenessRow", "ProcessReport"]


@dataclass(frozen=True)
class ProcessReport:
    """A process's heartbeat: who it is and its gauges, as of `updated_ms`."""

    writer: str
    role: str
    """`dispatcher`, `worker` or `producer`."""
    host: str
    pid: int
    started_ms: int
    updated_ms: int
    running: Mapping[Pair, int] = field(default_factory=dict)
    """Workers: attempts running now, by (tenant, type)."""
    detail: Mapping[str, object] = field(default_factory=dict)
    """Role-specific figures (JSON values): shards held, tasks in the wheel, lag..."""


@dataclass(frozen=True)
class LatenessRow:
    """One writer's histogram of one kind of lateness over one minute."""

    minute: int
    kind: str
    """`fire` (publish - run_at) or `start` (handler start - run_at)."""
    writer: str
    histogram: LatencyHistogram


class CountStore(Protocol):
    """Thread-safe. Failures raise `StoreError`. Rows are written whole, over any earlier
    row of the same key (last write wins): writers send absolute values."""

    def write_counts(self, hours: Sequence[CountRow], minutes: Sequence[CountRow]) -> None:
        """Hour rows (`period` an hour number) and minute rows (a minute number; kept by
        the hour of that minute)."""
        ...

    def read_hours(self, hours: Sequence[int]) -> list[CountRow]:
        """Every writer's rows of these hours."""
        ...

    def read_minutes(self, first_minute: int, last_minute: int, tenant: str) -> list[CountRow]:
        """Every writer's minute rows of `tenant` (`AGGREGATE_TENANT`: all tenants added
        up by each writer) from `first_minute` through `last_minute`."""
        ...

    def start_snapshots(self, hour: int) -> None:
        """If no snapshot exists yet, record an empty one at `hour`; else nothing. Every
        writer calls it before its first write, with an hour before its first row's."""
        ...

    def read_snapshot(self) -> tuple[int, dict[Pair, Values]] | None:
        """The newest snapshot: the hour it covers through, and totals per (tenant, type)."""
        ...

    def write_snapshot(self, hour: int, totals: Mapping[Pair, Values], drop: int | None) -> None:
        """Record the totals through `hour`, make it the newest, then drop the snapshot
        at `drop` (an older one, no longer read).
        Idempotent: the same inputs write the same snapshot."""
        ...

    def write_process(self, report: ProcessReport) -> None: ...

    def read_processes(self) -> list[ProcessReport]:
        """Processes heard from in the last minute (older reports expire)."""
        ...

    def write_lateness(self, rows: Sequence[LatenessRow]) -> None: ...

    def read_lateness(self, kind: str, first_minute: int, last_minute: int) -> list[LatenessRow]: ...

    def close(self) -> None: ...
