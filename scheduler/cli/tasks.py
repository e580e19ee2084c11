"""`scheduler submit|get|cancel`: one task, or a file of them, through the producer client
that `scheduler.connect` gives applications."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

import click

from scheduler import retention
from scheduler.cli.options import (
    Exit,
    open_client,
    open_store,
    parse_delay,
    parse_payload,
    parse_run_at,
    store_options,
    tenant_option,
    unopened_client,
)
from scheduler.errors import InvalidTask
from scheduler.model import DEFAULT_MAX_ATTEMPTS, MAX_COST, Priority, TaskId, decode_payload
from scheduler.ports import CancelOutcome, StoredTask


@click.command()
@click.argument("task_type", metavar="TYPE", required=False)
@click.option("--payload", "payload", default="null", show_default=True, help="The task's payload as JSON.")
@tenant_option("Tenant that owns the task (with --file: of the lines that name none).", required=False)
@click.option("--run-at", "run_at", help="When it is due: ISO 8601 with a zone, e.g. 2026-12-02T10:00:00+05:30. "
              "A time in the past means due now.")
@click.option("--delay", "delay", help="Due this long from now: 90, 90s, 15m, 1h30m, 2d. Default: due now.")
@click.option("--priority", "priority", type=click.Choice([p.value for p in Priority]), default="normal",
              show_default=True, help="Ready topic it is published to; workers serve high, normal and low 7:2:1.")
@click.option("--key", "key", help="Idempotency key: the same tenant, key and --run-at always name the same "
              "task, so a repeated submit writes no second one. Needs --run-at.")
@click.option("--max-attempts", "max_attempts", type=int, default=DEFAULT_MAX_ATTEMPTS, show_default=True,
              help="Attempts before the task is dead-lettered (a handler's own limit may be lower).")
@click.option("--cost", "cost", type=click.IntRange(1, MAX_COST), default=1, show_default=True,
              help="Units of the tenant's rate limit the task uses, e.g. 500 for a task that sends 500 SMS.")
@click.option("--file", "file", type=click.File("r"), help="Submit every task of a JSON-lines file (`-` for "
              "stdin) instead: one object per line with the fields type, payload, tenant, run_at, delay "
              "(seconds), priority, idempotency_key, max_attempts, cost; --tenant and --cost are the defaults "
              "of lines without them.")
@store_options
def submit(task_type: str | None, payload: str, tenant: str | None, run_at: str | None, delay: str | None, priority: str,
           key: str | None, max_attempts: int, cost: int, file: TextIO | None, backend: str, db: Path,
           **cassandra: Any) -> None:
    """Store a task and print its id once the store acknowledged the write.

    With --file, submits a whole file, shows progress, and reports every line that was
    not stored with its reason; the exit code is 1 if any line was not stored.
    """
    # Everything is checked before a store is opened (`connect` checks the settings and
    # the default max attempts first), so a failed submit leaves no file behind.
    if file is not None:
        if task_type is not None:
            raise click.UsageError("give TYPE or --file, not both")
        with open_client(backend, db, tenant=tenant, default_max_attempts=max_attempts, **cassandra) as client:
            submit_file(client, file, cost)
        return
    if task_type is None:
        raise click.UsageError("missing TYPE (the task's handler name), or --file")
    if not tenant:
        raise click.UsageError("missing --tenant (or SCHEDULER_TENANT): the tenant that owns the task")
    task: dict[str, Any] = {
        "type": task_type, "payload": parse_payload(payload), "tenant": tenant,
        "run_at": parse_run_at(run_at) if run_at else None, "delay": parse_delay(delay) if delay else None,
        "priority": priority, "idempotency_key": key, "max_attempts": max_attempts, "cost": cost,
    }
    unopened_client().task(**task)  # InvalidTask, as submit would raise it
    with open_client(backend, db, **cassandra) as client:
        task_id = client.submit(**task)
    click.echo(str(task_id))


def submit_file(client: Any, file: TextIO, cost: int = 1) -> None:
    """Submit the lines of `file`; `cost` is the cost of the lines that give none."""
    from scheduler.producer import SubmitReport

    line_of: list[int] = []  # the file line of each item: blank lines are not items

    def items() -> Iterator[Any]:
        for number, line in enumerate(file, start=1):
            if not line.strip():
                continue
            line_of.append(number)
            try:
                item = json.loads(line)
            except json.JSONDecodeError as exc:
                item = InvalidTask(f"not JSON: {exc.msg} at column {exc.colno}")
            if isinstance(item, dict) and isinstance(item.get("run_at"), str):
                try:
                    item["run_at"] = datetime.fromisoformat(item["run_at"])
                except ValueError:
                    item = InvalidTask(f"run_at {item['run_at']!r} is not an ISO 8601 time")
            if isinstance(item, dict):
                item.setdefault("cost", cost)
            yield item

    with click.progressbar(length=0, label="submitting", show_pos=True, file=sys.stderr) as bar:
        def progress(report: SubmitReport) -> None:
            bar.length = report.consumed
            bar.update(report.stored + len(report.failed) + len(report.rejected) - bar.pos)

        report = client.submit_many(items(), progress=progress, keep_ids=False)
    for error in report.rejected:
        click.echo(f"line {line_of[error.index]}: not stored, invalid: {error.reason}", err=True)
    for error in report.failed:
        click.echo(f"line {line_of[error.index]}: task {error.task_id} not stored for certain: {error.reason}",
                   err=True)
    unread = " (stopped: lines after the last one reported were not read)" if report.stopped_early else ""
    click.echo(f"{report.stored} stored, {len(report.rejected)} invalid, {len(report.failed)} not stored for certain"
               f"{unread}")
    if report.failed:
        click.echo("Lines with an idempotency_key can be submitted again safely; a line without one would get a "
                   "new id, so check with `scheduler get` first.", err=True)
    if not report.complete:
        raise click.exceptions.Exit(Exit.FAILURE)


def describe(stored: StoredTask) -> dict[str, Any]:
    task = stored.task
    return {
        "id": str(task.id),
        "tenant": task.tenant,
        "type": task.type,
        "status": stored.status.value,
        "run_at": task.run_at.isoformat().replace("+00:00", "Z"),
        "priority": task.priority.value,
        "attempt": task.attempt,
        "max_attempts": task.max_attempts,
        "cost": task.cost,
        "idempotency_key": task.idempotency_key,
        "payload": decode_payload(task.payload),
    }


@click.command()
@click.argument("task_id")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--history", "history", is_flag=True,
              help="Also show every attempt: published, started, finished, on which worker, how it ended, why.")
@tenant_option("Only show the task if it belongs to this tenant (as a tenant's own tools should).",
               required=False)
@store_options
def get(task_id: str, as_json: bool, history: bool, tenant: str | None, backend: str, db: Path,
        **cassandra: Any) -> None:
    """Show a task and its status (exit 1 if there is none with this id, or it belongs
    to another tenant than --tenant)."""
    from scheduler.producer import Client
    from scheduler.visibility.history import AttemptRecord

    parsed = TaskId.parse(task_id)
    with open_store(backend, db, **cassandra) as store:
        stored = Client(store).get(parsed, tenant=tenant or None)
        records = store.attempts(parsed) if history and stored is not None else {}
        retention_s = store.retention_s
    if stored is None:
        click.echo(retention.missing_task(parsed, retention_s, time.time_ns() // 1_000_000), err=True)
        raise click.exceptions.Exit(Exit.FAILURE)
    fields = describe(stored)
    attempts = [AttemptRecord.decode(attempt, text) for attempt, text in sorted(records.items())]
    if history:
        fields["history"] = [asdict(record) for record in attempts]
    if as_json:
        click.echo(json.dumps(fields, default=repr))
        return
    for name, value in fields.items():
        if name == "history":
            continue
        click.echo(f"{name + ':':17}{json.dumps(value, default=repr) if name == 'payload' else value}")
    if history:
        click.echo("history:" + ("" if attempts else " no attempt has ended yet"))
        for record in attempts:
            click.echo(f"  attempt {record.attempt}: {record.outcome}; published {_at(record.fired_ms)}, started "
                       f"{_at(record.started_ms)}, finished {_at(record.finished_ms)} on {record.worker or '?'}"
                       + (f"; {record.error}" if record.error else ""))


def _at(ms: int | None) -> str:
    if ms is None:
        return "?"
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@click.command()
@click.argument("task_id")
@tenant_option("Tenant that owns the task; another tenant's task reads as not found.")
@store_options
def cancel(task_id: str, tenant: str, backend: str, db: Path, **cassandra: Any) -> None:
    """Cancel a task that has not run yet.

    Exit 0 when it is (or already was) cancelled, 1 when no task of this tenant has
    this id, 4 when it already finished. Once it answers "cancelled", no attempt of the
    task starts; for a task due within minutes that answer takes about 2 s.
    """
    parsed = TaskId.parse(task_id)  # before anything is opened: a bad id creates no file
    with open_client(backend, db, **cassandra) as client:
        outcome = client.cancel(parsed, tenant)
        retention_s = client.store.retention_s
    click.echo(f"{task_id}: {outcome.value}")
    if outcome is CancelOutcome.NOT_FOUND:
        if client.expired(parsed):
            click.echo(retention.missing_task(parsed, retention_s, time.time_ns() // 1_000_000), err=True)
        raise click.exceptions.Exit(Exit.FAILURE)
    if outcome is CancelOutcome.FINISHED:
        raise click.exceptions.Exit(Exit.CONFLICT)
