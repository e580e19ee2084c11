"""The `LimitsStore` contract (`scheduler.ports`), run against every adapter: the
embedded SQLite store (in the task store's file) and the Cassandra store on the real
server (fresh keyspace, on the task store's session)."""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from scheduler.adapters.embedded.limits import SqliteLimitsStore
from scheduler.adapters.embedded.store import SqliteTaskStore
from scheduler.errors import StoreError
from scheduler.fairness.limits import NO_LIMITS, UNLIMITED, Limits, TenantLimits
from scheduler.ports import LimitsStore

pytestmark = pytest.mark.timeout(120)

Row = tuple[str, int | None, int | None, float | None]


@dataclass
class Opened:
    store: LimitsStore
    write_row: Callable[[Row], None]
    """Writes `(scope, weight, cap, rate)` straight into the table, past every check."""


@pytest.fixture(params=["sqlite", pytest.param("cassandra", marks=pytest.mark.integration)])
def opened(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Opened]:
    if request.param == "sqlite":
        path = tmp_path / "tasks.db"
        tasks = SqliteTaskStore(path)
        store: LimitsStore = SqliteLimitsStore(path)
        close = tasks.close

        def write_row(row: Row) -> None:
            with sqlite3.connect(path) as db:
                db.execute("INSERT OR REPLACE INTO tenant_limits (scope, weight, cap, rate, updated_ms) "
                           "VALUES (?, ?, ?, ?, 0)", row)
            db.close()
    else:
        from scheduler.adapters.cassandra.limits import CassandraLimitsStore
        from scheduler.adapters.cassandra.store import CassandraTaskStore

        cassandra = CassandraTaskStore.open(request.getfixturevalue("keyspace"))
        store = CassandraLimitsStore.for_store(cassandra)
        close = cassandra.close

        def write_row(row: Row) -> None:
            cassandra.connection.session.execute(
                f"INSERT INTO {cassandra.keyspace}.tenant_limits (scope, weight, cap, rate) VALUES (%s, %s, %s, %s)",
                row)
    try:
        yield Opened(store, write_row)
    finally:
        store.close()
        close()


@pytest.fixture
def limits(opened: Opened) -> LimitsStore:
    return opened.store


def test_an_empty_store_reads_as_no_limits(limits: LimitsStore) -> None:
    read = limits.read()
    assert read == NO_LIMITS
    assert read.unlimited and read.of("anyone") == UNLIMITED


def test_a_tenant_reads_back_as_set(limits: LimitsStore) -> None:
    limits.set_tenant("college", TenantLimits(weight=3, cap=40, rate=12.5))
    read = limits.read()
    assert read.tenants == {"college": TenantLimits(3, 40, 12.5)}
    assert read.of("college") == TenantLimits(3, 40, 12.5)
    assert read.of("board") == UNLIMITED and read.global_rate is None


def test_setting_a_tenant_again_replaces_its_whole_row(limits: LimitsStore) -> None:
    limits.set_tenant("college", TenantLimits(weight=3, cap=40, rate=12.5))
    limits.set_tenant("board", TenantLimits(weight=2))
    limits.set_tenant("college", TenantLimits(weight=5, cap=7, rate=1000))
    assert limits.read().tenants == {"college": TenantLimits(5, 7, 1000.0), "board": TenantLimits(2)}


def test_a_cap_and_a_rate_are_cleared_by_none(limits: LimitsStore) -> None:
    limits.set_tenant("college", TenantLimits(weight=3, cap=40, rate=12.5))
    limits.set_tenant("college", TenantLimits(weight=3, cap=None, rate=None))
    assert limits.read().tenants == {"college": TenantLimits(3, None, None)}


def test_the_default_applies_to_tenants_without_a_row(limits: LimitsStore) -> None:
    limits.set_default(TenantLimits(weight=2, cap=10, rate=5))
    limits.set_tenant("college", TenantLimits(weight=4))
    read = limits.read()
    assert read.default == TenantLimits(2, 10, 5.0)
    assert read.of("board") == TenantLimits(2, 10, 5.0)
    assert read.of("college") == TenantLimits(4)
    assert "default" not in read.tenants
    limits.set_default(TenantLimits())
    assert limits.read().default == UNLIMITED


def test_the_global_rate_is_set_and_cleared(limits: LimitsStore) -> None:
    limits.set_tenant("college", TenantLimits(weight=3))
    limits.set_global_rate(2000)
    read = limits.read()
    assert read.global_rate == 2000.0 and not read.unlimited
    assert read.tenants == {"college": TenantLimits(3)} and read.default == UNLIMITED
    limits.set_global_rate(0.5)
    assert limits.read().global_rate == 0.5
    limits.set_global_rate(None)
    assert limits.read() == Limits({"college": TenantLimits(3)})
    limits.set_global_rate(None)  # clearing what is not there is no error
    assert limits.read().global_rate is None


def test_deleting_a_tenant_says_whether_it_had_a_row(limits: LimitsStore) -> None:
    limits.set_tenant("college", TenantLimits(weight=3))
    limits.set_tenant("board", TenantLimits(weight=2))
    assert limits.delete_tenant("college") is True
    assert limits.delete_tenant("college") is False
    assert limits.delete_tenant("nobody") is False
    assert limits.read().tenants == {"board": TenantLimits(2)}


@pytest.mark.parametrize(("row", "reason"), [
    (("tenant:bad", 0, None, None), "weight must be a whole number"),
    (("tenant:bad", 2, None, -1.0), "rate must be a number"),
    (("tenant:bad", None, None, None), "weight must be a whole number"),
    (("tenant:bad", 2, 0, None), "cap must be a whole number"),
    (("tenant:", 2, None, None), "the scope is none of"),
    (("mystery", 2, None, None), "the scope is none of"),
    (("default", 0, None, None), "weight must be a whole number"),
    (("global", None, None, -5.0), "rate must be a number"),
])
def test_a_row_that_fails_the_checks_is_skipped_with_a_warning(
        opened: Opened, caplog: pytest.LogCaptureFixture, row: Row, reason: str) -> None:
    opened.store.set_tenant("college", TenantLimits(weight=3, cap=40, rate=12.5))
    opened.store.set_default(TenantLimits(weight=2))
    opened.store.set_global_rate(100)
    opened.write_row(row)
    with caplog.at_level(logging.WARNING):
        read = opened.store.read()
    expected = Limits({"college": TenantLimits(3, 40, 12.5)}, TenantLimits(2), 100.0)
    if row[0] == "default":
        expected = Limits(expected.tenants, UNLIMITED, 100.0)  # the bad row replaced the good one
    elif row[0] == "global":
        expected = Limits(expected.tenants, TenantLimits(2), None)
    assert read == expected
    (warning,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert repr(row[0]) in warning.getMessage() and reason in warning.getMessage()


def test_tenant_names_with_colons_and_unicode_round_trip(limits: LimitsStore) -> None:
    names = ["acme:eu:prod", "tenant:nested", "शिक्षा बोर्ड", "Zürich ☎", "default", "global", ":"]
    for weight, name in enumerate(names, start=1):
        limits.set_tenant(name, TenantLimits(weight=weight))
    read = limits.read()
    assert read.tenants == {name: TenantLimits(weight) for weight, name in enumerate(names, start=1)}
    assert read.default == UNLIMITED and read.global_rate is None  # tenants named so are not those rows
    assert limits.delete_tenant("tenant:nested") and limits.delete_tenant("शिक्षा बोर्ड")
    assert set(limits.read().tenants) == set(names) - {"tenant:nested", "शिक्षा बोर्ड"}


@pytest.mark.integration
def test_a_keyspace_made_before_the_table_is_told_to_apply_the_schema_which_adds_it(
        request: pytest.FixtureRequest) -> None:
    from scheduler.adapters.cassandra import schema
    from scheduler.adapters.cassandra.limits import CassandraLimitsStore
    from scheduler.adapters.cassandra.store import CassandraTaskStore

    keyspace = request.getfixturevalue("keyspace")
    connection = request.getfixturevalue("cassandra")
    connection.session.execute(f"DROP TABLE {keyspace.keyspace}.tenant_limits")
    store = CassandraTaskStore.open(keyspace)
    try:
        with pytest.raises(StoreError, match=r"`scheduler schema apply`.*tenant_limits table"):
            CassandraLimitsStore.for_store(store)
        schema.apply(connection, keyspace)
        assert CassandraLimitsStore.for_store(store).read() == NO_LIMITS
    finally:
        store.close()
