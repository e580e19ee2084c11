"""`scheduler schedule preview`: the next fire times of a schedule, in its local time and
in UTC, with every change of the zone's offset (daylight saving time) marked where it
falls and what it does to the runs (see `cron` for the rules).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from itertools import islice

from scheduler.recurring.cron import CronRule


@dataclass(frozen=True, slots=True)
class PreviewRow:
    slot_ms: int
    local: datetime
    notes: tuple[str, ...]


def preview(rule: CronRule, after_ms: int, count: int) -> list[PreviewRow]:
    """The first `count` slots after `after_ms`, each with notes on DST changes."""
    rows: list[PreviewRow] = []
    previous = after_ms
    for slot in islice(rule.slots_after(after_ms), count):
        local = rule.local(slot)
        notes: list[str] = []
        change = rule.offset_change(previous, slot)
        if change is not None:
            notes.append(describe_change(*change))
        if rule.fixed_time:
            nominal = rule.nominal_after(rule.local(previous))
            if nominal is not None and nominal < local.replace(tzinfo=None):
                notes.append(f"{nominal:%H:%M} does not exist that day: runs once at the next valid time")
        if _repeated(local):
            if rule.fixed_time:
                notes.append(f"{local:%H:%M} happens twice that day: runs once, at the first")
            else:
                notes.append(f"repeated hour, {'first' if local.fold == 0 else 'second'} pass: runs by elapsed time")
        rows.append(PreviewRow(slot, local, tuple(notes)))
        previous = slot
    return rows


def describe_change(before: datetime, after: datetime) -> str:
    """The change between `before` (the last local minute on the old offset) and `after`
    (the first local time on the new one), as `CronRule.offset_change` gives them.

    The date and time named are those of the instant of the change on the old offset's
    wall clock, i.e. the minute after `before`. The new wall clock follows the arrow,
    with its date when that is another day, as it is when a change happens at local
    midnight:

    - `DST: clocks go forward 1h on 2026-03-08 at 02:00 EST -> 03:00 EDT` (New York);
    - `DST: clocks go back 1h on 2027-04-04 at 00:00 -03 -> 23:00 -04 on 2027-04-03`
      (Santiago: at midnight of the 4th, clocks go back to 23:00 of the 3rd).
    """
    before_offset, after_offset = before.utcoffset(), after.utcoffset()
    assert before_offset is not None and after_offset is not None
    shift = after_offset - before_offset
    direction = "forward" if shift > timedelta(0) else "back"
    # Naive arithmetic: `before + 1 minute` on an aware datetime would be looked up in the
    # zone again, and the wall time it names may not exist there (or exist twice).
    edge = before.replace(tzinfo=None) + timedelta(minutes=1)
    new_day = f" on {after:%Y-%m-%d}" if after.date() != edge.date() else ""
    return (f"DST: clocks go {direction} {_duration(abs(shift))} on {edge:%Y-%m-%d} at {edge:%H:%M} "
            f"{before:%Z} -> {after:%H:%M} {after:%Z}{new_day}")


def render(rule: CronRule, rows: list[PreviewRow]) -> list[str]:
    kind = ("fixed time: follows the local clock across DST changes" if rule.fixed_time
            else "interval: follows elapsed time across DST changes")
    lines = [f"{rule.expression}  in {rule.zone_name}  ({kind})",
             f"{'local (' + rule.zone_name + ')':<36}  {'UTC':<17}  notes"]
    for row in rows:
        local = f"{row.local:%Y-%m-%d %a %H:%M} {row.local:%Z} {_offset(row.local)}"
        utc = f"{datetime.fromtimestamp(row.slot_ms / 1000, UTC):%Y-%m-%d %H:%M}Z"
        lines.append(f"{local:<36}  {utc:<17}  {'; '.join(row.notes)}".rstrip())
    return lines


def _repeated(local: datetime) -> bool:
    return local.replace(fold=1 - local.fold).utcoffset() != local.utcoffset()


def _offset(local: datetime) -> str:
    offset = local.utcoffset()
    assert offset is not None
    minutes = int(offset.total_seconds()) // 60
    sign = "+" if minutes >= 0 else "-"
    return f"{sign}{abs(minutes) // 60:02d}:{abs(minutes) % 60:02d}"


def _duration(delta: timedelta) -> str:
    minutes = int(delta.total_seconds()) // 60
    hours, minutes = divmod(minutes, 60)
    return (f"{hours}h" if hours else "") + (f"{minutes}m" if minutes else "")
