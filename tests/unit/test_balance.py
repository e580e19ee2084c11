"""The split of shards among dispatchers, and the `--shards` flag."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler.dispatcher.balance import parse_shards, plan, quota
from scheduler.errors import ConfigError


def test_two_members_split_32_32_and_three_split_22_21_21() -> None:
    assert [quota(m, ["a", "b"], 64) for m in ["a", "b"]] == [32, 32]
    assert [quota(m, ["a", "b", "c"], 64) for m in ["a", "b", "c"]] == [22, 21, 21]
    assert quota("stranger", ["a", "b"], 64) == 0


@given(st.integers(1, 300), st.integers(1, 40))
def test_quotas_cover_every_shard_and_none_exceeds_the_ceiling(shards: int, n: int) -> None:
    members = [f"m{i:03}" for i in range(n)]
    quotas = [quota(m, members, shards) for m in members]
    assert sum(quotas) == shards
    assert max(quotas) == -(-shards // n)


def test_a_newcomer_takes_free_shards_and_the_old_members_give_back_their_highest() -> None:
    holders = {s: "a" for s in range(32)} | {s: "b" for s in range(32, 64)}
    members = ["a", "b", "c"]
    a = plan("a", members, holders, set(range(32)), 64)
    assert a.give_back == tuple(range(22, 32)) and a.take == ()
    c = plan("c", members, holders, set(), 64)
    assert c.take == () and c.give_back == ()  # nothing free yet
    after = {s: m for s, m in holders.items() if not 22 <= s < 32}
    assert plan("c", members, after, set(), 64).take == tuple(range(22, 32))


def test_orphaned_shards_are_taken_up_to_the_new_quota() -> None:
    holders = {s: "a" for s in range(32)}  # b died: its leases are gone
    decided = plan("a", ["a"], holders, set(range(32)), 64)
    assert decided.take == tuple(range(32, 64))


def test_a_pinned_member_wants_its_range_whatever_the_members() -> None:
    holders = {3: "other"}
    decided = plan("p", ["p", "other"], holders, {20}, 64, pinned=range(0, 8))
    assert decided.take == (0, 1, 2, 4, 5, 6, 7)
    assert decided.give_back == (20,)


@pytest.mark.parametrize(("text", "expected"), [
    ("auto", None), ("0-15", list(range(16))), ("3", [3]), ("0-1, 62-63", [0, 1, 62, 63]),
])
def test_shard_ranges_parse(text: str, expected: list[int] | None) -> None:
    assert parse_shards(text, 64) == expected


@pytest.mark.parametrize("text", ["", "x", "5-2", "0-64", "1,,2", "-3"])
def test_bad_shard_ranges_say_what_is_wrong(text: str) -> None:
    with pytest.raises(ConfigError, match="--shards"):
        parse_shards(text, 64)


def test_a_lease_of_mine_i_lost_track_of_is_taken_back_first_whatever_the_quota() -> None:
    holders = {s: "a" for s in range(32)} | {s: "b" for s in range(33, 64)}
    mine = set(range(31)) | {31}  # shard 32 is free; my lease on 40 is not in my own view
    holders[40] = "a"
    decided = plan("a", ["a", "b"], holders, mine, 64)
    assert decided.take[0] == 40
    over = plan("a", ["a", "b", "c"], holders, mine, 64)
    assert 40 in over.take and over.give_back  # even while over quota
