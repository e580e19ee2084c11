"""`scheduler retention show|set`: how long a task's rows are kept (`scheduler.retention`).

The value is checked before the store is opened, so bad input is exit 2 with the
reason, and nothing is written.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from scheduler import retention as rule
from scheduler.cli.options import open_store, store_options
from scheduler.errors import ConfigError


@click.group()
def retention() -> None:
    """How long finished tasks are kept.

    \b
    A task's rows (its status, error and history, and its retries' rows) are kept
    until the end of the minute it was due plus the retention, then removed: on
    Cassandra by TTLs written with every row, on the embedded backend by the
    dispatcher, a bounded number of rows at a time. A task due in a month is kept a
    month plus the retention; a cancelled task at least 15 days. On Cassandra a task
    not fired by then (an outage longer than the retention) is removed too: keep
    days in production. Default 7d.

    \b
    Writers read the retention when they open the store: restart the dispatchers,
    workers and producers for a change to reach them. A change applies to rows
    written from then on (on the embedded backend a longer one also keeps the rows
    already stored longer).
    """


@retention.command()
@click.option("--json", "as_json", is_flag=True, help="Print {\"retention_s\": N} instead.")
@store_options
def show(as_json: bool, backend: str, db: Path, **cassandra: Any) -> None:
    """Print the store's retention, e.g. 7d."""
    with open_store(backend, db, **cassandra) as store:
        seconds = store.retention_s
    click.echo(json.dumps({"retention_s": seconds}) if as_json else rule.describe(seconds))


@retention.command(name="set")
@click.argument("duration")
@store_options
def set_(duration: str, backend: str, db: Path, **cassandra: Any) -> None:
    """Keep tasks DURATION after their minute: 7d, 36h, 1d12h, 90m or seconds
    (at least 1h, which outlasts a dispatcher's stall and the sweep after it;
    at most 3650d)."""
    try:
        seconds = rule.parse_retention(duration)
    except ConfigError as exc:
        raise click.BadParameter(str(exc), param_hint="DURATION") from None
    with open_store(backend, db, **cassandra) as store:
        before = store.retention_s
        store.set_retention(seconds)
    click.echo(f"retention {rule.describe(seconds)} (was {rule.describe(before)})")
