"""`scheduler limits ...` on the embedded backend: set, show and reset, partial updates,
and bad input refused with exit 2 and the reason before anything is written."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from scheduler.adapters.embedded.limits import SqliteLimitsStore
from scheduler.cli import Exit, cli
from scheduler.fairness.limits import Limits, TenantLimits

pytestmark = pytest.mark.timeout(60)


def run(db: Path, *args: str) -> Result:
    return CliRunner().invoke(cli, ["limits", *args, "--db", str(db)], env={"SCHEDULER_BACKEND": "embedded"})


def stored(db: Path) -> Limits:
    store = SqliteLimitsStore(db)
    try:
        return store.read()
    finally:
        store.close()


def shown(db: Path) -> dict[str, Any]:
    result = run(db, "show", "--json")
    assert result.exit_code == Exit.OK, result.output
    document: dict[str, Any] = json.loads(result.output)
    return document


@pytest.mark.parametrize("command", ["set", "show", "reset"])
def test_every_limits_command_has_help(command: str) -> None:
    result = CliRunner().invoke(cli, ["limits", command, "--help"])
    assert result.exit_code == 0 and "SCHEDULER_BACKEND" in result.output


def test_the_group_help_explains_the_units_and_the_reload() -> None:
    result = CliRunner().invoke(cli, ["limits", "--help"])
    assert result.exit_code == 0
    for words in ("round robin", "running at once", "cost units a second", "provider's limit", "5 s",
                  "no restart", "shards it owns"):
        assert words in result.output.replace("\n  ", " ")


def test_set_show_and_reset(tmp_path: Path) -> None:
    db = tmp_path / "tasks.db"
    assert shown(db) == {"global_rate": None, "default": {"weight": 1, "cap": None, "rate": None}, "tenants": {}}

    result = run(db, "set", "--tenant", "college", "--weight", "3", "--cap", "40", "--rate", "12.5")
    assert result.exit_code == Exit.OK, result.output
    assert result.output.strip() == "tenant college: weight 3, cap 40, rate 12.5"
    assert run(db, "set", "--default", "--weight", "2", "--rate", "100").exit_code == Exit.OK
    assert run(db, "set", "--global", "--rate", "2000").output.strip() == "global: rate 2000"
    assert stored(db) == Limits({"college": TenantLimits(3, 40, 12.5)}, TenantLimits(2, None, 100.0), 2000.0)

    assert shown(db) == {
        "global_rate": 2000.0, "default": {"weight": 2, "cap": None, "rate": 100.0},
        "tenants": {"college": {"weight": 3, "cap": 40, "rate": 12.5}},
    }
    table = run(db, "show")
    assert table.exit_code == Exit.OK, table.output
    lines = [line.split() for line in table.output.splitlines()]
    assert lines == [["TENANT", "WEIGHT", "CAP", "RATE"], ["(global)", "-", "-", "2000"],
                     ["(default)", "2", "none", "100"], ["college", "3", "40", "12.5"]]

    reset = run(db, "reset", "--tenant", "college")
    assert reset.exit_code == Exit.OK, reset.output
    assert stored(db).tenants == {}
    again = run(db, "reset", "--tenant", "college")
    assert again.exit_code == Exit.FAILURE and "has no limits of its own" in again.output

    assert run(db, "set", "--global", "--rate", "none").output.strip() == "global: rate none"
    assert stored(db).global_rate is None


def test_set_changes_only_the_values_given(tmp_path: Path) -> None:
    db = tmp_path / "tasks.db"
    assert run(db, "set", "--tenant", "college", "--weight", "3", "--cap", "40", "--rate", "12.5").exit_code == 0
    assert run(db, "set", "--tenant", "college", "--weight", "5").exit_code == Exit.OK
    assert stored(db).of("college") == TenantLimits(5, 40, 12.5)
    assert run(db, "set", "--tenant", "college", "--rate", "7").exit_code == Exit.OK
    assert stored(db).of("college") == TenantLimits(5, 40, 7.0)
    cleared = run(db, "set", "--tenant", "college", "--cap", "none")
    assert cleared.exit_code == Exit.OK and cleared.output.strip() == "tenant college: weight 5, cap none, rate 7"
    assert stored(db).of("college") == TenantLimits(5, None, 7.0)
    assert run(db, "set", "--tenant", "college", "--rate", "NONE").exit_code == Exit.OK
    assert stored(db).of("college") == TenantLimits(5)


def test_a_new_tenant_starts_from_the_default(tmp_path: Path) -> None:
    db = tmp_path / "tasks.db"
    assert run(db, "set", "--default", "--cap", "10", "--rate", "50").exit_code == Exit.OK
    assert run(db, "set", "--tenant", "board", "--weight", "4").exit_code == Exit.OK
    assert stored(db).tenants == {"board": TenantLimits(4, 10, 50.0)}
    assert run(db, "set", "--default", "--weight", "2").exit_code == Exit.OK
    assert stored(db).default == TenantLimits(2, 10, 50.0)


def test_show_one_tenant(tmp_path: Path) -> None:
    db = tmp_path / "tasks.db"
    assert run(db, "set", "--tenant", "acme:eu", "--weight", "3").exit_code == Exit.OK
    assert run(db, "set", "--tenant", "board", "--weight", "2").exit_code == Exit.OK
    one = run(db, "show", "--tenant", "acme:eu", "--json")
    assert json.loads(one.output)["tenants"] == {"acme:eu": {"weight": 3, "cap": None, "rate": None}}
    table = run(db, "show", "--tenant", "acme:eu").output
    assert "acme:eu" in table and "board" not in table
    missing = run(db, "show", "--tenant", "nobody")
    assert missing.exit_code == Exit.OK and "'nobody' has no limits of its own" in missing.output


BAD_INPUT = [
    (["--tenant", "college", "--weight", "0"], "weight must be a whole number from 1 to 1000"),
    (["--tenant", "college", "--weight", "1001"], "weight must be a whole number from 1 to 1000"),
    (["--tenant", "college", "--weight", "2.5"], "got 2.5"),
    (["--tenant", "college", "--weight", "abc"], "got 'abc'"),
    (["--tenant", "college", "--weight", "none"], "weight must be a whole number"),
    (["--tenant", "college", "--cap", "0"], "cap must be a whole number of running tasks"),
    (["--tenant", "college", "--cap", "1.5"], "cap must be a whole number of running tasks"),
    (["--tenant", "college", "--cap", "lots"], "got 'lots'"),
    (["--tenant", "college", "--rate", "0"], "rate must be a number of cost units a second above 0"),
    (["--tenant", "college", "--rate", "-1"], "got -1"),
    (["--tenant", "college", "--rate", "nan"], "got nan"),
    (["--tenant", "college", "--rate", "inf"], "got inf"),
    (["--default", "--rate", "fast"], "got 'fast'"),
    (["--global", "--rate", "0"], "rate must be a number"),
    (["--global", "--weight", "3"], "--global takes only --rate"),
    (["--global", "--cap", "3", "--rate", "10"], "--global takes only --rate"),
    (["--tenant", "college"], "nothing to set"),
    (["--weight", "3"], "one of --tenant NAME, --default or --global"),
    (["--tenant", "college", "--default", "--weight", "3"], "one of --tenant NAME, --default or --global"),
    (["--tenant", "", "--weight", "3"], "a task needs a tenant: a non-empty string"),
]


@pytest.mark.parametrize(("args", "reason"), BAD_INPUT)
def test_bad_input_is_exit_2_with_the_reason_and_nothing_written(tmp_path: Path, args: list[str],
                                                                 reason: str) -> None:
    db = tmp_path / "tasks.db"
    assert run(db, "set", "--tenant", "college", "--weight", "3", "--cap", "40", "--rate", "12.5").exit_code == 0
    assert run(db, "set", "--global", "--rate", "2000").exit_code == Exit.OK
    before = stored(db)
    result = run(db, "set", *args)
    assert result.exit_code == Exit.USAGE, result.output
    assert reason in result.output
    assert stored(db) == before


def test_bad_input_opens_no_store(tmp_path: Path) -> None:
    db = tmp_path / "tasks.db"
    assert run(db, "set", "--tenant", "college", "--weight", "0").exit_code == Exit.USAGE
    assert not db.exists()


def test_reset_needs_a_tenant(tmp_path: Path) -> None:
    result = run(tmp_path / "tasks.db", "reset")
    assert result.exit_code == Exit.USAGE and "--tenant" in result.output


def test_a_tenant_name_no_task_could_carry_is_refused_with_nothing_written(tmp_path: Path) -> None:
    for bad in ("x" * 101, "board\nfinance", "   "):
        result = CliRunner().invoke(cli, ["limits", "set", "--tenant", bad, "--weight", "3", "--db",
                                          str(tmp_path / "tasks.db")])
        assert result.exit_code == 2, result.output
        assert "tenant" in result.output
    assert not (tmp_path / "tasks.db").exists()
