"""The slots of a cron expression in an IANA time zone, and what happens to them when
the zone's clocks change.

Parsing and matching are cronsim's (a maintained library that follows Debian's cron,
including its handling of daylight saving time); this module fixes the rules the
scheduler promises on top, turns matches into UTC milliseconds and guarantees that
slots strictly increase.

A *slot* is the UTC instant (ms) at which a schedule is due. Slots are computed from
the schedule's local wall clock:

Daylight saving time
--------------------
Two kinds of expression are treated differently (the classic cron rule, which Debian's
cron and cronsim follow):

- **Fixed-time** schedules: neither the minute nor the hour field starts with `*`
  (`30 2 * * *`, `0 9 * * 1-5`, `30 9 1 * *`). They follow the local wall clock:
  - a local time that does not exist (clocks go forward: 02:30 on 2026-03-08 in
    America/New_York) runs once, at the first valid instant after it (03:00 EDT);
  - a local time that occurs twice (clocks go back: 01:30 on 2026-11-01 in
    America/New_York) runs once, at its first occurrence (01:30 EDT, not 01:30 EST);
  - the same holds for zones that shift by 30 minutes (Australia/Lord_Howe: 02:15 on
    the day clocks go from 02:00 to 02:30 runs at 02:30).
- **Interval** schedules: the minute or the hour field starts with `*` (`*/5 * * * *`,
  `0 * * * *`, `15 */2 * * *`). They follow real elapsed time: across a fall-back they
  run in both passes of the repeated hour (`*/30 * * * *` runs at 01:00 and 01:30 EDT,
  then 01:00 and 01:30 EST), and a local hour that does not exist has no slots
  (`*/15 2 * * *` does not run on the day 02:00-02:59 is skipped).

Slots never repeat and never go backwards: two matches that fall on one instant (e.g.
`0 2,3 * * *` on a spring-forward day, where 02:00 moves to 03:00) are one slot.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from scheduler.errors import InvalidSchedule
from scheduler.model import from_ms, to_ms

NEVER_MS = 253_402_300_799_000
"""9999-12-31T23:59:59Z: the next slot of a schedule that will never fire again."""


def load_zone(name: str) -> ZoneInfo:
    """The IANA zone `name`, or `InvalidSchedule` saying it is unknown."""
    if not isinstance(name, str) or not name.strip():
        raise InvalidSchedule("a schedule needs a time zone: an IANA name such as Asia/Kolkata or UTC")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise InvalidSchedule(
            f"unknown time zone {name!r}: use an IANA name such as Asia/Kolkata, Europe/London or UTC"
        ) from None


class CronRule:
    """A 5-field cron expression evaluated in one time zone. Immutable; checks its input.

    >>> rule = CronRule("0 2 * * *", "Asia/Kolkata")
    >>> from_ms(rule.next_slot(to_ms(datetime(2026, 1, 1, tzinfo=UTC)))).isoformat()
    '2026-01-01T20:30:00+00:00'
    """

    def __init__(self, expression: str, zone: str) -> None:
        if not isinstance(expression, str):
            raise InvalidSchedule(f"a cron expression is text, got {expression!r}")
        fields = expression.split()
        if len(fields) != 5:
            raise InvalidSchedule(
                f"bad cron expression {expression!r}: expected 5 fields (minute hour day-of-month month "
                f"day-of-week), e.g. '30 9 * * 1-5', got {len(fields)}"
            )
        self.expression = " ".join(fields)
        self.zone_name = zone
        self.zone = load_zone(zone)
        try:
            CronSim(self.expression, datetime(2000, 1, 1, tzinfo=self.zone))
        except CronSimError as exc:
            raise InvalidSchedule(f"bad cron expression {expression!r}: {exc}") from None
        self.fixed_time = not fields[0].startswith("*") and not fields[1].startswith("*")
        """Follows the local wall clock across DST changes (see the module docstring)."""

    def slots_after(self, after_ms: int) -> Iterator[int]:
        """Slots strictly after `after_ms`, in increasing order (ends after ~50 years
        without a match)."""
        start = from_ms(after_ms).astimezone(self.zone)
        previous = after_ms
        try:
            for match in CronSim(self.expression, start):
                slot = to_ms(match)
                if slot > previous:  # a fold-0 match before the start, or two matches on one instant
                    previous = slot
                    yield slot
        except CronSimError:  # pragma: no cover - checked at construction
            return

    def next_slot(self, after_ms: int) -> int:
        """The first slot strictly after `after_ms`, or `NEVER_MS` if there is none."""
        return next(self.slots_after(after_ms), NEVER_MS)

    def nominal_after(self, local: datetime) -> datetime | None:
        """The next match after `local` on a naive wall clock, as if the zone had no DST:
        what a fixed-time slot was meant to be before a missing local time moved it."""
        try:
            return next(CronSim(self.expression, local.replace(tzinfo=None)))
        except StopIteration:
            return None

    def local(self, slot_ms: int) -> datetime:
        """The slot on the schedule's local wall clock."""
        return datetime.fromtimestamp(slot_ms / 1000, UTC).astimezone(self.zone)

    def offset_change(self, after_ms: int, through_ms: int) -> tuple[datetime, datetime] | None:
        """The zone's first UTC offset change in `(after_ms, through_ms]`, to the minute:
        (the last local minute before it, the first local time after it), or None."""
        before = self.local(after_ms).utcoffset()
        if self.local(through_ms).utcoffset() == before:
            return None  # two changes between two slots (a yearly schedule) cancel out: neither run moves
        low, high = after_ms // 60_000, through_ms // 60_000 + 1  # minutes: offset(low) == before != offset(high)
        while high - low > 1:
            middle = (low + high) // 2
            if self.local(middle * 60_000).utcoffset() == before:
                low = middle
            else:
                high = middle
        return self.local(low * 60_000), self.local(high * 60_000)

    def __repr__(self) -> str:
        return f"CronRule({self.expression!r}, {self.zone_name!r})"
