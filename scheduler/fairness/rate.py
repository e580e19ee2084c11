"""A rate limit that is never exceeded in any one-second window, yet paced evenly.

A plain token bucket of capacity C lets C + rate units out in some second (a full
bucket, then a second of refill). A provider contract of "2,000 SMS a second" means any
second, so `WindowRate` keeps two rules:

- **the window**: a log of what was released in the last `window_ms`; a release is
  allowed only if the log's sum plus its cost stays within `rate * window`. For any
  half-open window `[a, a + window)`, take the last release in it, at `t`: every other
  release in the window lies in `(t - window, t]`, which `t`'s check summed. So no
  window ever holds more than the limit.
- **the pace**: a virtual clock (GCRA's theoretical arrival time) that moves on by
  `cost / rate` with every release; a release is allowed only while it is at most
  `tolerance_ms` ahead of now. Backlogged work then leaves at an even rate, a tick's
  share at a time, instead of the whole second's allowance at once.

The times are the moments of release, and the dispatcher stamps each released message
with its moment (the Kafka record's timestamp), so the rule can be checked by anyone
reading the topics. (Stamping at produce time instead, a few milliseconds later by a
varying amount, would let a window catch eleven ticks' releases.)

A task whose cost alone exceeds the window's limit would never fit; it is let out when
the window is empty, and the pace then holds the next release back by its full cost.
"""

from __future__ import annotations

from collections import deque


class WindowRate:
    """One limiter; the rate is passed to each call, so a reloaded limit applies at once."""

    __slots__ = ("window_ms", "tolerance_ms", "_log", "_sum", "_tat")

    def __init__(self, *, window_ms: int = 1000, tolerance_ms: int = 250) -> None:
        self.window_ms = window_ms
        self.tolerance_ms = tolerance_ms
        self._log: deque[list[float]] = deque()
        """[time_ms, units] per release, oldest first."""
        self._sum = 0.0
        self._tat = 0.0

    def _evict(self, now_ms: float) -> None:
        log = self._log
        horizon = now_ms - self.window_ms
        while log and log[0][0] <= horizon:
            self._sum -= log.popleft()[1]
        if not log:
            self._sum = 0.0

    def allows(self, now_ms: int, units: int, rate: float) -> bool:
        self._evict(now_ms)
        if self._tat - self.tolerance_ms > now_ms:
            return False
        return self._sum == 0 or self._sum + units <= rate * self.window_ms / 1000

    def take(self, now_ms: int, units: int, rate: float) -> None:
        """Record a release allowed at `now_ms`."""
        log = self._log
        if log and log[-1][0] == now_ms:
            log[-1][1] += units
        else:
            log.append([float(now_ms), float(units)])
        self._sum += units
        self._tat = max(self._tat, float(now_ms)) + units * 1000 / rate

    def window_frees_at(self, units: int, rate: float) -> float | None:
        """When the window rule, if it is what holds `units` back, would let them out
        (the caller wakes then rather than at its next tick, so a full window loses no
        time); None when the window allows them (only the pace holds them, and its
        tolerance spans a tick)."""
        limit = rate * self.window_ms / 1000
        left = self._sum
        if left == 0 or left + units <= limit:
            return None
        for stamp, logged in self._log:
            left -= logged
            if left == 0 or left + units <= limit:
                return max(stamp + self.window_ms, self._tat - self.tolerance_ms)
        return None

    def in_window(self, now_ms: int) -> float:
        self._evict(now_ms)
        return self._sum

    def settled(self, now_ms: int) -> bool:
        """Nothing in the window and the pace caught up: forgetting this limiter now
        changes nothing a new one would allow."""
        self._evict(now_ms)
        return not self._log and self._tat - self.tolerance_ms <= now_ms
