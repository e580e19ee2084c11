"""Which shards a dispatcher should hold: the pure half of `--shards auto`.

Every dispatcher computes the same split from the same view: live members sorted by
name, the i-th taking `shards // n` shards, plus one if `i < shards % n`. So 64 shards
split 32/32 over two members and 22/21/21 over three; no member holds more than
`ceil(shards / n)`. A member over its quota gives back its highest-numbered shards
(after it has stopped firing them); a member under it takes free shards, lowest first.
Nobody takes a shard another member holds: a member's quota only grows when a member
leaves (its session expired, so its leases are already gone) or when others give back.

A pinned dispatcher (`--shards 0-15`) simply wants its range, whatever the members.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from scheduler.errors import ConfigError


def quota(member: str, members: Collection[str], shard_count: int) -> int:
    """How many shards `member` should hold (0 if it is not among `members`)."""
    ranked = sorted(members)
    if member not in ranked:
        return 0
    base, extra = divmod(shard_count, len(ranked))
    return base + (1 if ranked.index(member) < extra else 0)


@dataclass(frozen=True)
class Plan:
    take: tuple[int, ...]
    give_back: tuple[int, ...]


def plan(
    me: str,
    members: Collection[str],
    holders: Mapping[int, str],
    mine: Collection[int],
    shard_count: int,
    pinned: Collection[int] | None = None,
) -> Plan:
    """What `me` should do now: which free shards to try to take and which of its own to
    give back. `holders` is every live lease (shard -> member); `mine` the shards `me`
    holds and fires (its own view, which may lag `holders` by a moment)."""
    # A lease of mine that I do not fire (its acquire failed after the server made it) is
    # taken first, whatever the quota: acquiring it again adopts it, and nobody else can.
    orphans = tuple(shard for shard in range(shard_count) if holders.get(shard) == me and shard not in mine)
    free = [shard for shard in range(shard_count) if shard not in holders and shard not in mine]
    if pinned is not None:
        wanted = set(pinned)
        return Plan(
            take=orphans + tuple(shard for shard in free if shard in wanted),
            give_back=tuple(sorted(shard for shard in mine if shard not in wanted)),
        )
    target = quota(me, members, shard_count)
    held = sorted(mine)
    if len(held) > target:
        return Plan(take=orphans, give_back=tuple(held[target:]))
    return Plan(take=orphans + tuple(free[: max(target - len(held) - len(orphans), 0)]), give_back=())


def parse_shards(text: str, shard_count: int) -> list[int] | None:
    """`auto` -> None; `0-15`, `3`, `0-7,32-39` -> the listed shards, checked against the count."""
    text = text.strip()
    if text == "auto":
        return None
    shards: set[int] = set()
    for part in text.split(","):
        match = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", part)
        if match is None:
            raise ConfigError(f"--shards {text!r}: use 'auto' or ranges such as 0-15 or 0-7,32-39")
        low = int(match[1])
        high = int(match[2]) if match[2] is not None else low
        if low > high or high >= shard_count:
            raise ConfigError(f"--shards {text!r}: {part.strip()} is not a range within 0-{shard_count - 1}")
        shards.update(range(low, high + 1))
    return sorted(shards)
