from __future__ import annotations

import re
from pathlib import Path

import pytest

from scheduler.adapters.cassandra.schema import render, schema_text, split_statements
from scheduler.errors import ConfigError, StoreError

NTS = "{'class': 'NetworkTopologyStrategy', 'dc1': 3}"


def test_the_top_level_schema_is_the_one_the_package_ships() -> None:
    top_level = Path(__file__).resolve().parents[2] / "schema.cql"
    assert top_level.read_text(encoding="utf-8") == schema_text()


def test_render_names_the_keyspace_and_replication_and_qualifies_every_table() -> None:
    statements = render("results_day", NTS)
    assert statements[0] == f"CREATE KEYSPACE IF NOT EXISTS results_day WITH replication = {NTS}"
    tables = [s.split()[5] for s in statements if s.startswith("CREATE TABLE")]
    altered = [s.split()[2] for s in statements if s.startswith("ALTER TABLE")]
    assert len(tables) + len(altered) == len(statements) - 1
    assert {name.split(".")[0] for name in tables + altered} == {"results_day"}
    assert set(tables) == {"results_day.tasks_by_bucket", "results_day.shards", "results_day.meta",
                           "results_day.effects", "results_day.schedules", "results_day.tenant_limits",
                           "results_day.cancel_marks", "results_day.cancel_counts", "results_day.count_hours",
                           "results_day.count_minutes", "results_day.count_snapshots",
                           "results_day.count_snapshot_latest", "results_day.processes", "results_day.lateness_minutes",
                           "results_day.workflows"}
    assert set(altered) <= set(tables)
    # Safe to run again: everything is made if missing, and a table option is set to its value.
    assert all(" IF NOT EXISTS " in s or re.fullmatch(r"ALTER TABLE \S+ WITH \w+ = \d+", s) for s in statements)
    assert "ALTER TABLE results_day.tasks_by_bucket WITH gc_grace_seconds = 10800" in statements
    assert not any(s.startswith("USE") for s in statements)


def test_columns_added_later_are_in_the_table_and_added_idempotently_to_older_keyspaces() -> None:
    statements = render("ks", NTS)
    (tasks,) = [s for s in statements if s.startswith("CREATE TABLE IF NOT EXISTS ks.tasks_by_bucket ")]
    added = [s for s in statements if s.startswith("ALTER TABLE") and " ADD " in s]
    assert added == ["ALTER TABLE ks.tasks_by_bucket ADD IF NOT EXISTS last_error text",
                     "ALTER TABLE ks.tasks_by_bucket ADD IF NOT EXISTS cost int",
                     "ALTER TABLE ks.tasks_by_bucket ADD IF NOT EXISTS history map<int, text>",
                     "ALTER TABLE ks.shards ADD IF NOT EXISTS baselines frozen<map<bigint, int>>",
                     "ALTER TABLE ks.schedules ADD IF NOT EXISTS skipped int",
                     "ALTER TABLE ks.schedules ADD IF NOT EXISTS last_skipped timestamp"]
    assert "last_error      text" in tasks
    assert "cost            int" in tasks
    assert all(statements.index(each) > statements.index(tasks) for each in added)
    (shards,) = [s for s in statements if s.startswith("CREATE TABLE IF NOT EXISTS ks.shards ")]
    assert "baselines     frozen<map<bigint, int>>" in shards
    (schedules,) = [s for s in statements if s.startswith("CREATE TABLE IF NOT EXISTS ks.schedules ")]
    assert "skipped       int" in schedules and "last_skipped  timestamp" in schedules


def test_the_effect_ledger_is_keyed_by_scope_and_effect_key() -> None:
    (effects,) = [s for s in render("ks", NTS) if ".effects " in s]
    assert "PRIMARY KEY ((scope, effect_key))" in effects


def test_tenant_limits_are_one_row_per_scope() -> None:
    (limits,) = [s for s in render("ks", NTS) if ".tenant_limits " in s]
    assert "scope       text PRIMARY KEY" in limits
    for column in ("weight      int", "cap         int", "rate        double", "updated_at  timestamp"):
        assert column in limits


def test_tasks_are_partitioned_by_minute_and_shard_with_a_static_fence() -> None:
    (tasks,) = [s for s in render("ks", NTS) if s.startswith("CREATE TABLE IF NOT EXISTS ks.tasks_by_bucket ")]
    assert "PRIMARY KEY ((minute_bucket, shard), run_at, task_id)" in tasks
    assert "fence           bigint static" in tasks


def test_comments_and_quoted_semicolons_are_handled() -> None:
    text = "-- a; comment\nCREATE TABLE IF NOT EXISTS t (a text) WITH comment = 'x; -- y';\n\n-- tail\n"
    assert split_statements(text) == ["CREATE TABLE IF NOT EXISTS t (a text) WITH comment = 'x; -- y'"]


def test_an_unterminated_statement_is_an_error() -> None:
    with pytest.raises(StoreError, match="closing"):
        split_statements("CREATE TABLE IF NOT EXISTS t (a text)")


@pytest.mark.parametrize("statement", [
    "DROP TABLE tasks_by_bucket;",
    "ALTER TABLE tasks_by_bucket DROP status;",
    "ALTER TABLE tasks_by_bucket ADD last_error text;",  # not idempotent: fails on a second apply
    "ALTER TABLE other.tasks_by_bucket ADD IF NOT EXISTS last_error text;",
])
def test_an_unknown_statement_kind_is_an_error_not_silently_run_elsewhere(statement: str) -> None:
    with pytest.raises(StoreError, match="does not know"):
        render("ks", NTS, statement)


@pytest.mark.parametrize("keyspace", ["", "1abc", "Upper", "a-b", "x" * 49, "ks; DROP"])
def test_unusable_keyspace_names_are_refused(keyspace: str) -> None:
    with pytest.raises(ConfigError, match="keyspace"):
        render(keyspace, NTS)


@pytest.mark.parametrize("replication", ["", "SimpleStrategy", "{'replication_factor': 1}", "{'class': 'X'}; DROP"])
def test_unusable_replication_is_refused(replication: str) -> None:
    with pytest.raises(ConfigError, match="replication"):
        render("ks", replication)
