"""The event of a failover or pause run (`Disruption`): one dispatcher, the victim, is
killed (SIGKILL) or stopped (SIGSTOP, then SIGCONT after the pause) at a set moment of
the burst, and the bench follows the other dispatchers' stats files until they hold
every shard again.

Re-owning is read from the stats files, which each dispatcher rewrites about once a
second with the shards it holds (`shards`) and their lease tokens (`tokens`). The
moment all shards are held again is the write time (`at_ms`) of the first file that
shows a member's latest change of shards, so it is known to within that interval
(`STATS_RESOLUTION_MS`). Before the event the victim's own file tells which shards it
held and under which tokens: `takeover.py` sets the messages of those shards against
them."""

from __future__ import annotations

import signal
from dataclasses import dataclass, field
from typing import Any

from .common import echo, now_ms
from .deployment import DispatcherProcess
from .settings import LEASE_TIMEOUT_S, REOWN_TIMEOUT_S, SHARDS

STATS_RESOLUTION_MS = 1000
"""How often a dispatcher rewrites its stats file (the dispatcher's `stats_interval_ms`)."""
KINDS = {"failover": "kill", "pause": "pause"}
WATCH_AFTER_RESUME_MS = 5000
"""How long the run goes on after a pause ends, to see whether the continued dispatcher
publishes from the wheels of shards it no longer holds."""


@dataclass
class Holding:
    """What one member's stats file last said: its shards, and since which write."""

    shards: frozenset[int] = frozenset()
    at_ms: int = 0
    since_ms: int = 0


@dataclass
class Disruption:
    kind: str
    """"kill" (SIGKILL) or "pause" (SIGSTOP, then SIGCONT)."""
    victim: DispatcherProcess
    others: list[DispatcherProcess]
    at_ms: int
    pause_ms: int = 0
    fired_ms: int | None = None
    resumed_ms: int | None = None
    shards_before: list[int] = field(default_factory=list)
    tokens_before: dict[int, int] = field(default_factory=dict)
    stats_before_at_ms: int | None = None
    reowned_ms: int | None = None
    """Write time of the stats file that completed the set of shards held again."""
    reowned_seen_ms: int | None = None
    """When the bench read that file."""
    holdings: dict[str, Holding] = field(default_factory=dict)
    rejoined_ms: int | None = None
    """pause: write time of the continued victim's first stats file holding shards again."""
    rejoined_shards: int = 0

    @classmethod
    def plan(cls, scenario: str, members: list[DispatcherProcess], at_ms: int, pause_s: float) -> Disruption:
        """The event of `scenario` on the first dispatcher, at `at_ms`."""
        kind = KINDS[scenario]
        return cls(kind, members[0], members[1:], at_ms, round(pause_s * 1000) if kind == "pause" else 0)

    @property
    def done(self) -> bool:
        """Fired, over (a pause continued `WATCH_AFTER_RESUME_MS` ago, so what the victim
        does once continued is seen) and the shards held again, or given up on."""
        if self.fired_ms is None:
            return False
        if self.kind == "pause" and (self.resumed_ms is None or now_ms() < self.resumed_ms + WATCH_AFTER_RESUME_MS):
            return False
        return self.reowned_ms is not None or self.gave_up

    @property
    def gave_up(self) -> bool:
        start = self.resumed_ms if self.kind == "pause" else self.fired_ms
        return start is not None and now_ms() > start + REOWN_TIMEOUT_S * 1000

    def step(self, now: int) -> None:
        """Fire, continue or watch, whichever is due at `now` (called every ~0.1 s)."""
        if self.fired_ms is None:
            if now >= self.at_ms:
                self.fire(now)
            return
        if self.kind == "pause" and self.resumed_ms is None and now >= self.fired_ms + self.pause_ms:
            self.resume()
        if self.reowned_ms is None:
            self.watch(now)
        if self.resumed_ms is not None and self.rejoined_ms is None:
            stats = self.victim.stats()
            if int(stats.get("at_ms") or 0) > self.resumed_ms and stats.get("shards"):
                self.rejoined_ms, self.rejoined_shards = int(stats["at_ms"]), len(stats["shards"])

    def fire(self, now: int) -> None:
        stats = self.victim.stats()
        self.shards_before = [int(shard) for shard in stats.get("shards", [])]
        self.tokens_before = {int(shard): int(token) for shard, token in stats.get("tokens", {}).items()}
        self.stats_before_at_ms = stats.get("at_ms")
        if self.victim.alive():
            self.victim.process.send_signal(signal.SIGKILL if self.kind == "kill" else signal.SIGSTOP)
        self.fired_ms = now_ms()
        echo(f"event: {self.victim.name} {'killed (SIGKILL)' if self.kind == 'kill' else 'stopped (SIGSTOP)'} "
             f"holding {len(self.shards_before)} shards")

    def resume(self) -> None:
        if self.victim.alive():
            self.victim.process.send_signal(signal.SIGCONT)
        self.resumed_ms = now_ms()
        echo(f"event: {self.victim.name} continued (SIGCONT) after {(self.resumed_ms - (self.fired_ms or 0)) / 1000:.1f} s")

    def release(self) -> None:
        """Continue a victim still stopped (on the way out), so SIGTERM can stop it."""
        if self.kind == "pause" and self.fired_ms is not None and self.resumed_ms is None:
            self.resume()

    def watch(self, now: int) -> None:
        """Read the stats files written since the event; note when they hold every shard."""
        assert self.fired_ms is not None
        members = list(self.others)
        if self.resumed_ms is not None:
            members.append(self.victim)  # back, and may take shards again by rebalance
        held: set[int] = set()
        latest = 0
        for member in members:
            stats = member.stats()
            at_ms = int(stats.get("at_ms") or 0)
            holding = self.holdings.setdefault(member.name, Holding())
            shards = frozenset(int(s) for s in stats.get("shards", []))
            if at_ms > holding.at_ms:
                if shards != holding.shards:
                    holding.shards, holding.since_ms = shards, at_ms
                holding.at_ms = at_ms
            fresh_after = self.resumed_ms if member is self.victim else self.fired_ms
            if fresh_after is not None and holding.at_ms > fresh_after:
                held |= holding.shards
                latest = max(latest, holding.since_ms)
        if len(held) == SHARDS:
            self.reowned_ms, self.reowned_seen_ms = max(latest, self.fired_ms), now
            echo(f"event: every shard held again {(self.reowned_ms - self.fired_ms) / 1000:.1f} s after the "
                 f"{'SIGKILL' if self.kind == 'kill' else 'SIGSTOP'} (lease timeout {LEASE_TIMEOUT_S} s)")

    def figures(self, minute_ms: int) -> dict[str, Any]:
        """The `event` block of the JSON document (times in ms after M, and after the event)."""
        fired = self.fired_ms

        def after_minute(ms: int | None) -> int | None:
            return None if ms is None else ms - minute_ms

        return {
            "kind": self.kind, "dispatcher": self.victim.name, "pid": self.victim.process.pid,
            "planned_at_ms": self.at_ms - minute_ms, "at_ms": after_minute(fired),
            "duration_ms": (self.resumed_ms - fired if self.resumed_ms is not None and fired is not None
                            else None),
            "resumed_at_ms": after_minute(self.resumed_ms),
            "shards": self.shards_before, "tokens": {str(k): v for k, v in sorted(self.tokens_before.items())},
            "lease_timeout_s": LEASE_TIMEOUT_S,
            "reowned_at_ms": after_minute(self.reowned_ms),
            "reown_s": (round((self.reowned_ms - fired) / 1000, 1) if self.reowned_ms is not None
                        and fired is not None else None),
            "reown_resolution_ms": STATS_RESOLUTION_MS,
            "reowned_seen_at_ms": after_minute(self.reowned_seen_ms),
            "held_when_reowned": {name: sorted(h.shards) for name, h in self.holdings.items()},
            "victim_rejoined_at_ms": after_minute(self.rejoined_ms),
            "victim_shards_on_rejoining": self.rejoined_shards,
        }
