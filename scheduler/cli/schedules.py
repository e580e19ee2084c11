"""`scheduler schedule add|list|pause|resume|delete|preview`: recurring schedules.

Every input is checked before the store is opened, so bad input (a bad cron
expression, an unknown zone, a bad misfire policy, negative jitter) is exit 2 with the
reason, and nothing is written.
"""

from __future__ import annotations

import json
import time
from datetime import datetime
from pathlib import Path
from typing import Any, NoReturn

import click

from scheduler import backends
from scheduler.cli.options import Exit, backend_settings, parse_payload, store_options, tenant_option
from scheduler.errors import InvalidSchedule
from scheduler.model import Priority, from_ms, to_ms
from scheduler.ports import CancelOutcome, ScheduleStore
from scheduler.recurring import preview as previews
from scheduler.recurring.cron import NEVER_MS, CronRule
from scheduler.recurring.schedule import DEFAULT_GRACE_S, Schedule, new_schedule, schedule_id


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _no_such(tenant: str, name: str) -> NoReturn:
    click.echo(f"tenant {tenant!r} has no schedule {name!r}", err=True)
    raise click.exceptions.Exit(Exit.FAILURE)


def _named(schedules: ScheduleStore, tenant: str, name: str) -> Schedule:
    """The tenant's schedule of that name, or exit 1 saying there is none."""
    found = schedules.get(schedule_id(tenant, name))
    if found is None:
        _no_such(tenant, name)
    return found


@click.group()
def schedule() -> None:
    """Recurring schedules: a cron expression in a time zone that creates a task per slot.

    \b
    The dispatcher holding a schedule's shard creates each run about 90 s ahead, as an
    ordinary task whose id follows from the schedule and the slot (never twice). Fixed
    times (`30 2 * * *`) follow the local clock across DST changes: a time that does not
    exist runs once at the next valid time, a repeated one runs once; interval schedules
    (`*/5 * * * *`, `0 * * * *`) follow elapsed time.
    """


@schedule.command("add")
@click.argument("name")
@tenant_option("Tenant that owns the schedule and its runs.")
@click.option("--cron", "cron", required=True, help="5-field cron expression, e.g. '30 9 * * 1-5'.")
@click.option("--zone", "zone", required=True, help="IANA time zone the expression is read in, e.g. Asia/Kolkata.")
@click.option("--type", "task_type", required=True, help="Task type of every run (its handler).")
@click.option("--payload", "payload", default="null", show_default=True, help="Every run's payload, as JSON.")
@click.option("--priority", "priority", type=click.Choice([p.value for p in Priority]), default="normal",
              show_default=True, help="Priority of every run.")
@click.option("--max-attempts", "max_attempts", type=int, default=3, show_default=True,
              help="Attempts of every run before it is dead-lettered.")
@click.option("--misfire", "misfire", default="once", show_default=True,
              help="Slots missed while the scheduler was down (past the grace): once (one catch-up run), "
                   "all (every missed slot), skip (none).")
@click.option("--grace", "grace_s", type=int, default=DEFAULT_GRACE_S, show_default=True,
              help="Seconds a slot may be late and still run as usual, before the misfire policy applies.")
@click.option("--jitter", "jitter_s", type=int, default=0, show_default=True,
              help="Run each slot up to this many seconds late (a fixed offset per slot), to spread peaks.")
@store_options
def schedule_add(name: str, tenant: str, cron: str, zone: str, task_type: str, payload: str, priority: str,
                 max_attempts: int, misfire: str, grace_s: int, jitter_s: int, backend: str, db: Path,
                 **options: Any) -> None:
    """Store a schedule NAME of the tenant (exit 4 if the tenant has one of that name)."""
    try:
        made = new_schedule(tenant=tenant, name=name, cron=cron, zone=zone, type=task_type,
                            payload=parse_payload(payload), priority=priority, max_attempts=max_attempts,
                            misfire=misfire, grace_s=grace_s, jitter_s=jitter_s, now_ms=_now_ms())
    except InvalidSchedule as exc:
        raise click.UsageError(str(exc)) from None
    settings = backend_settings(backend, db, **options)
    with backends.open_store(settings) as store, backends.open_schedules(settings, store) as schedules:
        created = schedules.create(made)
        existing = schedules.get(made.id)
    if not created:
        click.echo(f"tenant {tenant!r} already has a schedule {name!r}" + (
            f" ({existing.cron} in {existing.zone}); delete it first to change it" if existing else ""), err=True)
        raise click.exceptions.Exit(Exit.CONFLICT)
    click.echo(f"schedule {name} ({made.id}) added: {made.cron} in {made.zone}, first run "
               f"{_when(made.rule, made.next_slot_ms)}")


def _when(rule: CronRule, slot_ms: int) -> str:
    if slot_ms >= NEVER_MS:
        return "never"
    return f"{rule.local(slot_ms):%Y-%m-%d %H:%M %Z} ({from_ms(slot_ms):%Y-%m-%d %H:%MZ})"


def _describe(item: Schedule) -> dict[str, Any]:
    return {
        "id": str(item.id), "tenant": item.tenant, "name": item.name, "cron": item.cron, "zone": item.zone,
        "type": item.template.type, "payload": item.template.decoded_payload(),
        "priority": item.template.priority.value, "max_attempts": item.template.max_attempts,
        "misfire": item.misfire.value, "grace_s": item.grace_s, "jitter_s": item.jitter_s,
        "paused": item.paused,
        "next_slot": None if item.next_slot_ms >= NEVER_MS else from_ms(item.next_slot_ms).isoformat()
        .replace("+00:00", "Z"),
        "skipped": item.skipped,
        "last_skipped": None if item.last_skipped_ms is None else from_ms(item.last_skipped_ms).isoformat()
        .replace("+00:00", "Z"),
    }


@schedule.command("list")
@tenant_option("Only this tenant's schedules.", required=False)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@store_options
def schedule_list(tenant: str | None, as_json: bool, backend: str, db: Path, **options: Any) -> None:
    """List schedules with their state and next run."""
    settings = backend_settings(backend, db, **options)
    with backends.open_store(settings) as store, backends.open_schedules(settings, store) as schedules:
        found = schedules.list_all(tenant or None)
    for item in found:
        if as_json:
            click.echo(json.dumps(_describe(item)))
            continue
        state = "paused" if item.paused else "active"
        click.echo(f"{item.tenant}/{item.name}  {item.cron!r} {item.zone}  {item.template.type}  {state}  "
                   f"misfire={item.misfire.value} grace={item.grace_s}s jitter={item.jitter_s}s  "
                   f"next: {_when(item.rule, item.next_slot_ms)}"
                   + (f"  skipped {item.skipped}, last {_when(item.rule, item.last_skipped_ms)}"
                      if item.skipped and item.last_skipped_ms is not None else ""))
    if not as_json:
        click.echo(f"{len(found)} schedule(s)")


@schedule.command("pause")
@click.argument("name")
@tenant_option("Tenant that owns the schedule.")
@store_options
def schedule_pause(name: str, tenant: str, backend: str, db: Path, **options: Any) -> None:
    """Stop creating runs (runs already created, at most ~90 s ahead, stay; exit 1 if none)."""
    settings = backend_settings(backend, db, **options)
    with backends.open_store(settings) as store, backends.open_schedules(settings, store) as schedules:
        changed = schedules.pause(_named(schedules, tenant, name).id)
    click.echo(f"schedule {name}: {'paused' if changed else 'already paused'}")


@schedule.command("resume")
@click.argument("name")
@tenant_option("Tenant that owns the schedule.")
@store_options
def schedule_resume(name: str, tenant: str, backend: str, db: Path, **options: Any) -> None:
    """Create runs again, from the first slot after now: slots that passed while paused
    get no run (a pause is deliberate, not an outage). Exit 1 if there is no such schedule."""
    settings = backend_settings(backend, db, **options)
    with backends.open_store(settings) as store, backends.open_schedules(settings, store) as schedules:
        found = _named(schedules, tenant, name)
        next_slot = found.rule.next_slot(_now_ms())
        changed = schedules.resume(found.id, next_slot)
    click.echo(f"schedule {name}: " + (f"resumed, next run {_when(found.rule, next_slot)}" if changed
                                       else "was not paused"))


@schedule.command("delete")
@click.argument("name")
@tenant_option("Tenant that owns the schedule.")
@store_options
def schedule_delete(name: str, tenant: str, backend: str, db: Path, **options: Any) -> None:
    """Delete a schedule, and cancel its runs already created that are not yet due (at
    most ~90 s ahead), so a schedule added again under the name never runs a slot
    twice. Runs already due are left to run. Exit 1 if there is no such schedule."""
    from scheduler.producer import Client
    from scheduler.recurring.runner import runs_ahead

    settings = backend_settings(backend, db, **options)
    with (backends.open_store(settings) as store, backends.open_schedules(settings, store) as schedules,
          backends.open_handoff(settings, store.shard_count) as handoff):
        found = schedules.get(schedule_id(tenant, name))
        deleted = found is not None and found.tenant == tenant and schedules.delete(found.id)
        cancelled = 0
        if deleted and found is not None:
            client = Client(store, handoff=handoff)
            outcomes = client.cancel_many(runs_ahead(found, _now_ms()), tenant)  # one settle wait for all
            cancelled = sum(outcome is CancelOutcome.CANCELLED for outcome in outcomes.values())
    if not deleted:
        _no_such(tenant, name)
    click.echo(f"schedule {name}: deleted" + (f"; {cancelled} run(s) created ahead cancelled" if cancelled else ""))


@schedule.command("preview")
@click.argument("name", required=False)
@tenant_option("Tenant that owns the schedule NAME.", required=False)
@click.option("--cron", "cron", help="Preview this expression instead of a stored schedule (with --zone).")
@click.option("--zone", "zone", help="IANA time zone of --cron.")
@click.option("--count", "count", type=click.IntRange(1, 1000), default=10, show_default=True,
              help="How many fire times to print.")
@click.option("--from", "start", help="Start after this time (ISO 8601 with a zone). Default: now.")
@store_options
def schedule_preview(name: str | None, tenant: str | None, cron: str | None, zone: str | None, count: int,
                     start: str | None, backend: str, db: Path, **options: Any) -> None:
    """Print the next fire times in local time and UTC, marking DST changes.

    Either a stored schedule (NAME --tenant T) or an expression (--cron C --zone Z), which
    needs no store."""
    after_ms = _now_ms()
    if start is not None:
        try:
            after_ms = to_ms(datetime.fromisoformat(start)) - 1
        except ValueError as exc:  # not ISO 8601, or no zone (InvalidTask)
            raise click.BadParameter(f"{start!r} is not an ISO 8601 time with a zone ({exc})",
                                     param_hint="--from") from None
    if cron is not None or zone is not None:
        if name is not None or cron is None or zone is None:
            raise click.UsageError("preview takes NAME --tenant T, or --cron and --zone (not both)")
        try:
            rule = CronRule(cron, zone)
        except InvalidSchedule as exc:
            raise click.UsageError(str(exc)) from None
    else:
        if name is None or not tenant:
            raise click.UsageError("preview takes NAME --tenant T, or --cron and --zone")
        settings = backend_settings(backend, db, **options)
        with backends.open_store(settings) as store, backends.open_schedules(settings, store) as schedules:
            found = _named(schedules, tenant, name)
        rule = found.rule
        if start is None:
            after_ms = found.next_slot_ms - 1
    for line in previews.render(rule, previews.preview(rule, after_ms, count)):
        click.echo(line)
