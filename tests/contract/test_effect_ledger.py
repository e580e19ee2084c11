"""The `EffectLedger` contract (`scheduler.ports`), run against every adapter: the
embedded SQLite ledger (in the task store's file) and the Cassandra ledger on the real
server (fresh keyspace, on the task store's session)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

import pytest

from scheduler.adapters.embedded.effects import DEFAULT_RETENTION_S, SqliteEffectLedger
from scheduler.adapters.embedded.store import SqliteTaskStore
from scheduler.ports import EffectClaim, EffectLedger
from scheduler.settings import CassandraSettings
from tests.support import all_at_once, wait_until

LedgerFactory = Callable[..., EffectLedger]
"""Opens a ledger on the test's store; optionally `retention_s=` (seconds)."""

CLAIMED, DONE, BUSY = EffectClaim.CLAIMED, EffectClaim.DONE, EffectClaim.BUSY
LONG_S = 300.0
EXPIRY_WAIT_S = 15.0
"""Generous: Cassandra expires by the second, and the server is shared by parallel tests."""


@pytest.fixture(params=["sqlite", pytest.param("cassandra", marks=pytest.mark.integration)])
def make_ledger(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LedgerFactory]:
    closers: list[Callable[[], None]] = []
    if request.param == "sqlite":
        path = tmp_path / "tasks.db"
        store = SqliteTaskStore(path)  # the ledger shares the task store's file
        closers.append(store.close)

        def make(retention_s: float = DEFAULT_RETENTION_S) -> EffectLedger:
            ledger = SqliteEffectLedger(path, retention_s=retention_s)
            closers.append(ledger.close)
            return ledger
    else:
        from scheduler.adapters.cassandra.effects import CassandraEffectLedger
        from scheduler.adapters.cassandra.store import CassandraTaskStore

        cassandra_store = CassandraTaskStore.open(request.getfixturevalue("keyspace"))
        closers.append(cassandra_store.close)

        def make(retention_s: float = DEFAULT_RETENTION_S) -> EffectLedger:
            ledger = CassandraEffectLedger.for_store(cassandra_store, retention_s=retention_s)
            closers.append(ledger.close)
            return ledger
    try:
        yield make
    finally:
        for close in reversed(closers):
            close()


@pytest.fixture
def ledger(make_ledger: LedgerFactory) -> EffectLedger:
    return make_ledger()


def test_a_claim_is_held_by_its_owner_and_refused_to_others(ledger: EffectLedger) -> None:
    assert ledger.claim("college", "sms:result:17", "attempt-1", LONG_S) is CLAIMED
    assert ledger.claim("college", "sms:result:17", "attempt-2", LONG_S) is BUSY
    assert ledger.claim("college", "sms:result:17", "attempt-1", LONG_S) is CLAIMED  # its own, again
    assert ledger.claim("college", "sms:result:18", "attempt-2", LONG_S) is CLAIMED  # another key
    assert ledger.claim("board", "sms:result:17", "attempt-2", LONG_S) is CLAIMED  # another scope


def test_a_done_effect_is_done_for_everyone_including_its_owner(ledger: EffectLedger) -> None:
    assert ledger.claim("college", "charge", "a", LONG_S) is CLAIMED
    ledger.done("college", "charge", "a")
    assert ledger.claim("college", "charge", "a", LONG_S) is DONE
    assert ledger.claim("college", "charge", "b", LONG_S) is DONE
    ledger.done("college", "charge", "b")  # recording it again changes nothing
    assert ledger.claim("college", "charge", "c", LONG_S) is DONE
    assert ledger.claim("board", "charge", "c", LONG_S) is CLAIMED


def test_a_released_claim_can_be_taken_by_another_owner(ledger: EffectLedger) -> None:
    assert ledger.claim("college", "email", "a", LONG_S) is CLAIMED
    ledger.release("college", "email", "b")  # not b's claim: nothing happens
    assert ledger.claim("college", "email", "c", LONG_S) is BUSY
    ledger.release("college", "email", "a")
    assert ledger.claim("college", "email", "c", LONG_S) is CLAIMED
    ledger.release("college", "nothing-here", "a")  # no claim at all: no error


def test_a_release_never_undoes_a_done_record(ledger: EffectLedger) -> None:
    assert ledger.claim("college", "push", "a", LONG_S) is CLAIMED
    ledger.done("college", "push", "a")
    ledger.release("college", "push", "a")
    assert ledger.claim("college", "push", "b", LONG_S) is DONE


def test_an_expired_claim_can_be_taken_by_another_owner(ledger: EffectLedger) -> None:
    assert ledger.claim("college", "webhook", "a", 1) is CLAIMED
    assert ledger.claim("college", "webhook", "b", LONG_S) is BUSY
    wait_until(lambda: ledger.claim("college", "webhook", "b", LONG_S) is CLAIMED,
               timeout_s=EXPIRY_WAIT_S, interval_s=0.1, what="a's claim to expire")
    assert ledger.claim("college", "webhook", "a", LONG_S) is BUSY  # a's claim is gone for good


def test_done_is_recorded_even_after_the_claim_expired_or_passed_to_another(ledger: EffectLedger) -> None:
    """The effect happened, however late its owner says so: later attempts must skip it,
    and the owner that took the claim over cannot release it away."""
    assert ledger.claim("college", "late", "a", 1) is CLAIMED
    wait_until(lambda: ledger.claim("college", "late", "b", LONG_S) is CLAIMED,
               timeout_s=EXPIRY_WAIT_S, interval_s=0.1, what="a's claim to expire")
    ledger.done("college", "late", "a")
    ledger.release("college", "late", "b")
    assert ledger.claim("college", "late", "c", LONG_S) is DONE

    ledger.done("college", "never-claimed", "a")
    assert ledger.claim("college", "never-claimed", "b", LONG_S) is DONE


def test_a_done_record_is_kept_for_the_retention_only(make_ledger: LedgerFactory) -> None:
    ledger = make_ledger(retention_s=1)
    assert ledger.claim("college", "daily-digest", "a", LONG_S) is CLAIMED
    ledger.done("college", "daily-digest", "a")
    assert ledger.claim("college", "daily-digest", "b", LONG_S) is DONE
    wait_until(lambda: ledger.claim("college", "daily-digest", "b", LONG_S) is CLAIMED,
               timeout_s=EXPIRY_WAIT_S, interval_s=0.1, what="the done record's retention to end")


def test_a_done_record_asked_to_be_kept_longer_outlives_the_retention(make_ledger: LedgerFactory) -> None:
    """What `ctx.once` asks when its task may retry for longer than the retention; one
    that would end past what Cassandra can expire (2038) is kept for good, not refused."""
    ledger = make_ledger(retention_s=1)
    for key, keep_s in (("plain", 0.0), ("retried", 600.0), ("for-good", 1e10)):
        assert ledger.claim("college", key, "a", LONG_S) is CLAIMED
        ledger.done("college", key, "a", keep_s)
    wait_until(lambda: ledger.claim("college", "plain", "b", LONG_S) is CLAIMED,
               timeout_s=EXPIRY_WAIT_S, interval_s=0.1, what="the retention to end")
    assert ledger.claim("college", "retried", "b", LONG_S) is DONE
    assert ledger.claim("college", "for-good", "b", LONG_S) is DONE


def test_owners_racing_for_one_key_leave_exactly_one_holding_it(ledger: EffectLedger) -> None:
    owners = [f"attempt-{n}" for n in range(8)]
    for key in ("race-1", "race-2", "race-3"):
        answers = all_at_once([partial(ledger.claim, "college", key, owner, LONG_S) for owner in owners])
        assert sorted(answer.value for answer in answers) == sorted(["claimed"] + ["busy"] * (len(owners) - 1))
        winner = owners[answers.index(CLAIMED)]
        assert all(ledger.claim("college", key, owner, LONG_S) is (CLAIMED if owner == winner else BUSY)
                   for owner in owners)


def test_racing_done_and_claims_never_lose_the_done(ledger: EffectLedger) -> None:
    assert ledger.claim("college", "settle", "a", LONG_S) is CLAIMED
    calls: list[Callable[[], object]] = [partial(ledger.done, "college", "settle", "a")]
    calls += [partial(ledger.claim, "college", "settle", f"other-{n}", LONG_S) for n in range(5)]
    answers = all_at_once(calls)
    assert all(answer in (BUSY, DONE) for answer in answers[1:])
    assert ledger.claim("college", "settle", "other-0", LONG_S) is DONE


@pytest.mark.parametrize(("scope", "key", "owner", "ttl_s"), [
    ("", "k", "o", 10), ("s", "", "o", 10), ("s", "k", "", 10), ("s", "k", "o", 0), ("s", "k", "o", -1),
    ("s", "k", "o", float("nan")),
])
def test_empty_names_and_non_positive_ttls_are_refused(
    ledger: EffectLedger, scope: str, key: str, owner: str, ttl_s: float
) -> None:
    with pytest.raises(ValueError):
        ledger.claim(scope, key, owner, ttl_s)


def test_a_sqlite_claim_expires_by_the_ledgers_clock(tmp_path: Path) -> None:
    now = [1_000_000]
    ledger = SqliteEffectLedger(tmp_path / "tasks.db", retention_s=60, clock_ms=lambda: now[0])
    try:
        assert ledger.claim("college", "k", "a", 2.5) is CLAIMED
        now[0] += 2499
        assert ledger.claim("college", "k", "b", 10) is BUSY
        now[0] += 1
        assert ledger.claim("college", "k", "b", 10) is CLAIMED
        ledger.done("college", "k", "b")
        now[0] += 59_999
        assert ledger.claim("college", "k", "c", 10) is DONE
        now[0] += 1
        assert ledger.claim("college", "k", "c", 10) is CLAIMED
        now[0] += 10_000
        assert ledger.purge() == 1
        ledger.done("college", "k", "c", 120.5)  # longer than the retention: kept what it asks
        now[0] += 120_499
        assert ledger.claim("college", "k", "d", 10) is DONE
        now[0] += 1
        assert ledger.claim("college", "k", "d", 10) is CLAIMED
    finally:
        ledger.close()


@pytest.mark.integration
def test_a_cassandra_ledger_can_open_a_connection_of_its_own(keyspace: CassandraSettings) -> None:
    from scheduler.adapters.cassandra.effects import CassandraEffectLedger

    first = CassandraEffectLedger.open(keyspace)
    second = CassandraEffectLedger.open(keyspace)
    try:
        assert first.claim("college", "k", "a", LONG_S) is CLAIMED
        assert second.claim("college", "k", "b", LONG_S) is BUSY
        first.done("college", "k", "a")
        assert second.claim("college", "k", "b", LONG_S) is DONE
    finally:
        first.close()
        second.close()
