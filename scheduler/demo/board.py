"""The demo's live view: tasks per tenant and status, SMS sent, processes, events.

On a terminal it is a table redrawn in place (rich's `Live`); otherwise (a log, a
test) a line every few seconds and each event as it happens, so the output stays
readable when captured."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from .outcome import COLUMNS

PLAIN_EVERY_S = 5.0


@dataclass(frozen=True)
class Frame:
    """One moment of the story, as the board shows it."""

    at_s: float
    counts: Mapping[str, Mapping[str, int]]
    sms_sent: int
    sms_expected: int
    absorbed: int
    processes: Sequence[tuple[str, str]]
    """(name, state) of each dispatcher and worker, e.g. ("dispatcher-2", "64 shards")."""
    events: Sequence[Mapping[str, Any]]


class Board:
    def __init__(self, console: Console) -> None:
        self.console = console
        self.live: Live | None = None
        self._last_plain = -PLAIN_EVERY_S
        self._events_shown = 0

    def __enter__(self) -> Board:
        if self.console.is_terminal:
            self.live = Live(console=self.console, refresh_per_second=4, transient=False)
            self.live.__enter__()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        if self.live is not None:
            self.live.__exit__(kind, error, trace)

    def show(self, frame: Frame) -> None:
        if self.live is not None:
            self.live.update(self.render(frame))
            return
        for event in frame.events[self._events_shown:]:
            self.console.print(f"t+{event['at_s']:5.1f}s {event['what']}", highlight=False)
        self._events_shown = len(frame.events)
        if time.monotonic() - self._last_plain >= PLAIN_EVERY_S:
            self._last_plain = time.monotonic()
            tenants = "; ".join(
                f"{tenant}: " + ", ".join(f"{counts[c]} {c}" for c in COLUMNS if counts.get(c))
                for tenant, counts in frame.counts.items())
            self.console.print(f"t+{frame.at_s:5.1f}s {tenants} | SMS {frame.sms_sent:,}/{frame.sms_expected:,} "
                               f"sent, {frame.absorbed:,} repeats absorbed", highlight=False)

    @staticmethod
    def render(frame: Frame) -> Group:
        tasks = Table(title=f"results day, t+{frame.at_s:.0f}s", title_justify="left")
        tasks.add_column("tenant")
        for column in COLUMNS[:-1]:
            tasks.add_column(column, justify="right")
        for tenant, counts in frame.counts.items():
            tasks.add_row(tenant, *(f"{counts.get(column, 0):,}" for column in COLUMNS[:-1]))
        processes = Text("  ".join(f"{name}: {state}" for name, state in frame.processes))
        sms = Text(f"SMS sent {frame.sms_sent:,} of {frame.sms_expected:,}; "
                   f"repeats absorbed by the provider {frame.absorbed:,}")
        events = Text("\n".join(f"t+{e['at_s']:5.1f}s {e['what']}" for e in frame.events[-8:]) or "(no events yet)")
        return Group(tasks, sms, processes, Text(""), events)
