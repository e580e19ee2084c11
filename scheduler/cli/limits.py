"""`scheduler limits set|show|reset`: fairness limits between tenants.

Every value is checked (`scheduler.fairness.limits`) before the store is opened, so bad
input is exit 2 with the reason, and nothing is written.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import click

from scheduler import backends
from scheduler.cli.options import Exit, backend_settings, store_options
from scheduler.errors import InvalidTask
from scheduler.fairness.limits import Limits, LimitsError, TenantLimits, check_cap, check_rate, check_weight
from scheduler.model import check_name


@click.group()
def limits() -> None:
    """Fairness between tenants: plan weights, concurrency caps and rates.

    \b
    Dispatchers release due tasks tenant by tenant, in deficit round robin:
    - weight: a tenant's turns among the tenants with due work (a weight-3 tenant
      gets three times the releases of a weight-1 tenant while both have work);
    - cap: the most tasks of the tenant running at once;
    - rate: cost units a second the tenant may release. A task's cost is 1 unless
      its producer says otherwise (e.g. the number of SMS it sends).
    The global rate (--global) is the provider's limit across all tenants, in the
    same cost units. A tenant without limits of its own gets the default's
    (--default; weight 1, no cap, no rate unless set).

    \b
    Dispatchers reload the limits within about 5 s; no restart is needed. Each
    dispatcher enforces its share of every rate and cap: the shards it owns over
    the shard count.
    """


def _number(text: str) -> object:
    """`text` as an int or a float if it reads as one, else the text itself, so that the
    checks of `scheduler.fairness.limits` say what was wrong with it."""
    for parse in (int, float):
        try:
            return parse(text)
        except ValueError:
            pass
    return text


def _optional_number(text: str) -> object:
    return None if text.strip().lower() == "none" else _number(text)


def _show(value: float | None) -> str:
    if value is None:
        return "none"
    return str(int(value)) if float(value).is_integer() else str(value)


def _describe(limits: TenantLimits) -> str:
    return f"weight {limits.weight}, cap {_show(limits.cap)}, rate {_show(limits.rate)}"


def _fields(limits: TenantLimits) -> dict[str, Any]:
    return {"weight": limits.weight, "cap": limits.cap, "rate": limits.rate}


@limits.command("set")
@click.option("--tenant", "tenant", metavar="NAME", help="Set this tenant's limits.")
@click.option("--default", "is_default", is_flag=True, help="Set the default: the limits of every tenant "
              "without limits of its own.")
@click.option("--global", "is_global", is_flag=True, help="Set the global rate, across all tenants (only --rate).")
@click.option("--weight", "weight", metavar="N", help="Turns in the round robin, 1 to 1000.")
@click.option("--cap", "cap", metavar="N|none", help="Most tasks running at once, or none.")
@click.option("--rate", "rate", metavar="R|none", help="Cost units a second, or none.")
@store_options
def limits_set(tenant: str | None, is_default: bool, is_global: bool, weight: str | None, cap: str | None,
               rate: str | None, backend: str, db: Path, **options: Any) -> None:
    """Change a tenant's limits, the default's, or the global rate.

    Only the values given change; the others keep what is stored. A tenant without
    limits of its own starts from the default's (copied: later changes to the default
    no longer reach it; `limits reset` makes it follow the default again).
    """
    if [tenant is not None, is_default, is_global].count(True) != 1:
        raise click.UsageError("name what to set: one of --tenant NAME, --default or --global")
    if tenant is not None:
        try:
            check_name("tenant", tenant)  # the rule every task's tenant follows
        except InvalidTask as exc:
            raise click.BadParameter(str(exc), param_hint="--tenant") from None
    if weight is None and cap is None and rate is None:
        raise click.UsageError("nothing to set: give at least one of --weight, --cap and --rate")
    if is_global and (weight is not None or cap is not None):
        raise click.UsageError("--global takes only --rate: the global limit is a rate across all tenants "
                               "(weights and caps are per tenant)")
    changes: dict[str, Any] = {}  # the values given, checked
    try:
        if weight is not None:
            changes["weight"] = check_weight(_number(weight))
        if cap is not None:
            changes["cap"] = check_cap(_optional_number(cap))
        if rate is not None:
            changes["rate"] = check_rate(_optional_number(rate))
    except LimitsError as exc:
        raise click.UsageError(str(exc)) from None

    settings = backend_settings(backend, db, **options)
    with backends.open_store(settings) as store, backends.open_limits(settings, store) as stored:
        if is_global:
            stored.set_global_rate(changes["rate"])
            click.echo(f"global: rate {_show(changes['rate'])}")
            return
        current = stored.read()
        after = replace(current.default if tenant is None else current.of(tenant), **changes)
        if tenant is None:
            stored.set_default(after)
        else:
            stored.set_tenant(tenant, after)
    click.echo(f"{'default' if tenant is None else f'tenant {tenant}'}: {_describe(after)}")


@limits.command("show")
@click.option("--tenant", "tenant", metavar="NAME", help="Only this tenant (with the default and global rows).")
@click.option("--json", "as_json", is_flag=True, help="One JSON document.")
@store_options
def limits_show(tenant: str | None, as_json: bool, backend: str, db: Path, **options: Any) -> None:
    """Print the global rate, the default, and each tenant's limits ("none": no limit)."""
    settings = backend_settings(backend, db, **options)
    with backends.open_store(settings) as store, backends.open_limits(settings, store) as stored:
        current = stored.read()
    tenants = dict(sorted(current.tenants.items()))
    if tenant is not None:
        tenants = {name: found for name, found in tenants.items() if name == tenant}
    if as_json:
        click.echo(json.dumps({
            "global_rate": current.global_rate, "default": _fields(current.default),
            "tenants": {name: _fields(found) for name, found in tenants.items()},
        }, ensure_ascii=False))
        return
    for line in _table(current, tenants):
        click.echo(line)
    if tenant is not None and tenant not in tenants:
        click.echo(f"tenant {tenant!r} has no limits of its own: the default's apply")


def _table(current: Limits, tenants: dict[str, TenantLimits]) -> list[str]:
    rows = [("TENANT", "WEIGHT", "CAP", "RATE"), ("(global)", "-", "-", _show(current.global_rate))]
    rows += [("(default)", *_cells(current.default))]
    rows += [(name, *_cells(found)) for name, found in tenants.items()]
    widths = [max(len(row[column]) for row in rows) for column in range(4)]
    return ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows]


def _cells(limits: TenantLimits) -> tuple[str, str, str]:
    return str(limits.weight), _show(limits.cap), _show(limits.rate)


@limits.command("reset")
@click.option("--tenant", "tenant", metavar="NAME", required=True, help="The tenant whose limits to remove.")
@store_options
def limits_reset(tenant: str, backend: str, db: Path, **options: Any) -> None:
    """Remove a tenant's own limits, so the default's apply to it (exit 1 if it had none)."""
    if not tenant:
        raise click.BadParameter("a tenant is a non-empty name", param_hint="--tenant")
    settings = backend_settings(backend, db, **options)
    with backends.open_store(settings) as store, backends.open_limits(settings, store) as stored:
        deleted = stored.delete_tenant(tenant)
    if not deleted:
        click.echo(f"tenant {tenant!r} has no limits of its own (the default's apply already)", err=True)
        raise click.exceptions.Exit(Exit.FAILURE)
    click.echo(f"tenant {tenant}: limits removed, the default's apply")
