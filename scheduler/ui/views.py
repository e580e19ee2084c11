"""What the status page shows, as plain values computed from a `Status`: the tenants'
rows, the shard owners, the charts. No web code here, so it is tested without a server.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from scheduler.visibility.counts import STATES, Levels
from scheduler.visibility.status import ShardRow, Status

from .charts import Series, line_chart

MAX_TENANT_ROWS = 100
"""Rows in the tenants table; past that the page says how many more, and a tenant is
found with the filter. (A results-day deployment has thousands of tenants.)"""

UNFINISHED = ("waiting", "queued", "running", "retrying")


@dataclass(frozen=True)
class StateRow:
    tenant: str
    type: str | None
    """None in the tenants table (all of a tenant's types added up)."""
    states: dict[str, int]

    @property
    def unfinished(self) -> int:
        return sum(self.states[s] for s in UNFINISHED)


@dataclass(frozen=True)
class Owner:
    owner: str
    shards: list[int]
    max_lag_ms: int | None


@dataclass(frozen=True)
class Overview:
    status: Status
    rows: list[StateRow]
    """By tenant, or by (tenant, type) when the status is of one tenant or type."""
    hidden_rows: int
    owners: list[Owner]
    unowned: list[int]
    charts: list[str] = field(default_factory=list)

    def colour(self, owner: str | None) -> str:
        """The shard grid's colour class of an owner: one of six, `x` for no owner."""
        names = [o.owner for o in self.owners]
        return str(names.index(owner) % 6) if owner in names else "x"


def _add(a: dict[str, int], b: Levels) -> dict[str, int]:
    values = b.as_dict()
    return {state: a.get(state, 0) + values[state] for state in STATES}


def state_rows(status: Status) -> list[StateRow]:
    """One row per tenant (per tenant and type when the status is narrowed to a tenant or
    a type): the busiest first (most tasks not yet finished), then the most tasks."""
    rows: dict[tuple[str, str | None], dict[str, int]] = {}
    by_type = status.tenant is not None or status.type is not None
    for (tenant, type_), lv in status.levels.items():
        key = (tenant, type_ if by_type else None)
        rows[key] = _add(rows.get(key, {}), lv)
    result = [StateRow(tenant, type_, states) for (tenant, type_), states in rows.items()]
    result.sort(key=lambda r: (-r.unfinished, -sum(r.states.values()), r.tenant, r.type or ""))
    return result


def shard_owners(shards: list[ShardRow]) -> tuple[list[Owner], list[int]]:
    by_owner: dict[str, list[ShardRow]] = {}
    unowned = []
    for shard in shards:
        if shard.owner is None:
            unowned.append(shard.shard)
        else:
            by_owner.setdefault(shard.owner, []).append(shard)
    owners = [Owner(owner, [s.shard for s in rows],
                    max((s.lag_ms for s in rows if s.lag_ms is not None), default=None))
              for owner, rows in sorted(by_owner.items())]
    return owners, unowned


def charts(status: Status) -> list[str]:
    """Tasks published, done and dead per minute, and the fire and handler-start
    lateness p99 per minute, over the status's `since`."""
    minutes = [at for at, _ in status.per_minute]
    rate = line_chart("Tasks per minute", minutes, [
        Series("published", [e["fired"] + e["refired"] for _, e in status.per_minute], "published"),
        Series("done", [e["done"] for _, e in status.per_minute], "done"),
        Series("dead", [e["dead"] for _, e in status.per_minute], "dead"),
    ])
    result = [rate]
    if status.lateness_per_minute:
        late_minutes = [at for at, _ in status.lateness_per_minute["fire"]]
        result.append(line_chart("Lateness p99 per minute", late_minutes, [
            Series(f"{label} p99", [lt.p99_ms for _, lt in status.lateness_per_minute[kind]], kind)
            for kind, label in (("fire", "fire"), ("start", "handler start"))
        ], unit="ms", floor=100))
    return result


def overview(status: Status, max_rows: int = MAX_TENANT_ROWS) -> Overview:
    rows = state_rows(status)
    owners, unowned = shard_owners(status.shards)
    return Overview(status, rows[:max_rows], max(len(rows) - max_rows, 0), owners, unowned, charts(status))
