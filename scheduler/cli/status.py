"""`scheduler status`: tasks by tenant, type and state, what happened minute by minute,
how late firing and handling run, the shards and their owners, the live processes.

Everything comes from the counts the scheduler's own processes write
(`scheduler.visibility`) and the shards table: no task is read, so the answer takes the
same time with ten tasks stored or ten million.
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click

from scheduler import backends
from scheduler.cli.options import Exit, backend_settings, parse_delay, store_options
from scheduler.errors import QueueError
from scheduler.visibility.counts import STATES
from scheduler.visibility.status import Status, read_status, status_document

SHOWN_EVENTS = ("submitted", "fired", "started", "done", "retried", "dead", "cancelled")


def _time(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _ms(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value / 1000:.1f} s" if value >= 10_000 else f"{value:.0f} ms"


UNFINISHED = ("waiting", "queued", "running", "retrying")


def busiest_first(status: Status) -> list[tuple[tuple[str, str], dict[str, int]]]:
    """The (tenant, type) rows, those with the most tasks not yet finished first, then the
    most tasks, then by name: the rows an operator looks for when thousands are shown."""
    rows = [(pair, lv.as_dict()) for pair, lv in status.levels.items()]
    rows.sort(key=lambda row: (-sum(row[1][s] for s in UNFINISHED), -sum(row[1].values()), row[0]))
    return rows


def render(status: Status, *, all_shards: bool, limit: int = 0) -> list[str]:
    """The status as lines; at most `limit` (tenant, type) rows, the busiest (0: all)."""
    lines = [f"status at {_time(status.at_ms)}"
             + (f"; counts written up to {_ms(status.stalest_ms)} ago" if status.stalest_ms is not None else
                "; no live process has written counts")]
    scope = " ".join(part for part in (f"tenant {status.tenant}" if status.tenant else "",
                                       f"type {status.type}" if status.type else "") if part)
    lines += ["", f"tasks by state{' (' + scope + ')' if scope else ''}:"]
    header = ["tenant", "type", *STATES]
    ordered = busiest_first(status)
    shown = ordered[:limit] if limit else ordered
    rows = [[tenant, type_, *(f"{states[state]:,}" for state in STATES)] for (tenant, type_), states in shown]
    rows.append(["all", "", *(f"{status.total.as_dict()[state]:,}" for state in STATES)])
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        lines.append("  " + "  ".join(str(cell).ljust(widths[i]) if i < 2 else str(cell).rjust(widths[i])
                                      for i, cell in enumerate(row)))
    if len(shown) < len(ordered):
        lines.append(f"  ({len(ordered) - len(shown):,} more rows, with fewer tasks: --tenant T or "
                     "--type X to narrow, --limit 0 for all, --json for everything)")
    since_min = status.since_ms // 60_000
    sums = {event: sum(events[event] for _, events in status.per_minute) for event in SHOWN_EVENTS}
    busiest = max(status.per_minute, key=lambda m: m[1]["fired"] + m[1]["refired"], default=None)
    lines += ["", f"last {since_min} min: " + ", ".join(f"{event} {n:,}" for event, n in sums.items())]
    if busiest is not None and busiest[1]["fired"] + busiest[1]["refired"]:
        lines.append(f"  busiest minute {_time(busiest[0])}: {busiest[1]['fired'] + busiest[1]['refired']:,} published")
    fire, start = status.lateness["fire"], status.lateness["start"]
    lines += ["", "lateness, last minutes:",
              f"  fire (publish - run_at):          p50 {_ms(fire.p50_ms)}, p99 {_ms(fire.p99_ms)} ({fire.count:,} tasks)",
              f"  handler start (start - run_at):   p50 {_ms(start.p50_ms)}, p99 {_ms(start.p99_ms)} "
              f"({start.count:,} tasks)"]
    if status.shards:
        owners: dict[str, list[int]] = {}
        unowned = []
        for shard in status.shards:
            if shard.owner is None:
                unowned.append(shard.shard)
            else:
                owners.setdefault(shard.owner, []).append(shard.shard)
        lags = sorted(s.lag_ms for s in status.shards if s.lag_ms is not None)
        lines += ["", f"shards: {len(status.shards)}, {len(owners)} owners"
                  + (f", cursor lag p50 {_ms(lags[len(lags) // 2])}, max {_ms(lags[-1])}" if lags else "")]
        by_shard = {s.shard: s for s in status.shards}
        for owner, shards in sorted(owners.items()):
            worst = max((by_shard[s].lag_ms or 0) for s in shards)
            lines.append(f"  {owner}: {len(shards)} shards, max cursor lag {_ms(worst)}")
        if unowned:
            lines.append(f"  never owned: {', '.join(map(str, unowned))}")
        if all_shards:
            lines.append("  shard  owner  token  cursor  lag")
            for s in status.shards:
                lines.append(f"  {s.shard:5}  {s.owner or '-'}  {s.token if s.token is not None else '-'}  "
                             f"{_time(s.cursor_ms) if s.cursor_ms else '-'}  {_ms(s.lag_ms)}")
    roles: dict[str, int] = {}
    for process in status.processes:
        roles[process.role] = roles.get(process.role, 0) + 1
    lines += ["", "live processes: " + (", ".join(f"{n} {role}s" for role, n in sorted(roles.items())) or "none")]
    for process in status.processes:
        if process.role == "producer":
            continue
        detail = process.detail
        what = (f"{detail.get('shards', 0)} shards, {detail.get('wheel_tasks', 0):,} in the wheel"
                if process.role == "dispatcher" else
                f"{sum(process.running.values())} running, {detail.get('buffered', 0):,} buffered")
        lines.append(f"  {process.role} {detail.get('member', process.writer)} on {process.host} "
                     f"(pid {process.pid}): {what}")
    lines += ["", "consumer lag (messages not yet committed by the workers): "
              + (", ".join(f"{t} {n:,}" for t, n in sorted(status.consumer_lag.items())) or "none")]
    if status.dead_by_tenant:
        lines += ["", "dead by tenant: " + ", ".join(f"{t} {n:,}" for t, n in sorted(status.dead_by_tenant.items()))]
    return lines


@click.command()
@click.option("--tenant", "tenant", default=None, help="Only this tenant's counts and minutes.")
@click.option("--type", "type_", default=None, help="Only this task type's counts and minutes.")
@click.option("--since", "since", default="1h", show_default=True,
              help="How far back the minute-by-minute figures go: 90s, 15m, 1h, 1d (at most 2d).")
@click.option("--shards", "all_shards", is_flag=True, help="List every shard with its owner, token and cursor.")
@click.option("--limit", "limit", type=click.IntRange(0), default=20, show_default=True,
              help="Show at most this many (tenant, type) rows, those with the most tasks not yet finished first "
              "(0: all). The totals always count every row; --json has every row.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
@store_options
def status(tenant: str | None, type_: str | None, since: str, all_shards: bool, limit: int, as_json: bool,
           backend: str, db: Path, **options: Any) -> None:
    """Show tasks by tenant, type and state (waiting, queued, running, retrying, done,
    dead, cancelled), the last minutes' events and lateness, the shards and the live
    dispatchers, workers and producers. Reads only the counts the processes write every
    two seconds, never the tasks. Exit 1 when there is no store to read."""
    window = parse_delay(since)
    if not 0 < window.total_seconds() <= 2 * 86_400:
        raise click.BadParameter(f"{since!r}: the minutes are kept two days; give from 1s to 2d", param_hint="--since")
    settings = backend_settings(backend, db, **options)
    if settings.backend == "embedded" and not settings.db.exists():
        click.echo(f"no embedded store at {settings.db}: nothing has been submitted there yet", err=True)
        raise click.exceptions.Exit(Exit.FAILURE)
    started = time.monotonic()
    with backends.open_store(settings) as store, backends.open_counts(settings, store) as counts:
        try:
            lag: dict[str, int] | None = backends.consumer_lag(settings)
        except QueueError as exc:
            click.echo(f"warning: the consumer lag is not known: {exc}", err=True)
            lag = None
        result = read_status(store, counts, since_ms=int(window.total_seconds() * 1000), tenant=tenant, type_=type_,
                             consumer_lag=lag)
    took_ms = (time.monotonic() - started) * 1000
    if as_json:
        document = status_document(result)
        document["read_ms"] = round(took_ms, 1)
        click.echo(json.dumps(document))
        return
    for line in render(result, all_shards=all_shards, limit=limit):
        click.echo(line)
    click.echo(f"\n(read in {took_ms:.0f} ms)")
