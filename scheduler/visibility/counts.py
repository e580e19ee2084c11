"""Counts of tasks by tenant, type and state, kept without scanning a task.

Events, not rows
----------------
Each component counts the transitions it makes, per (tenant, type):

- the producer: `submitted` (a new task acknowledged by the store), `cancelled` (a
  cancel answered `cancelled`); a dispatcher's schedule pass counts the runs it creates
  as `submitted` too;
- the dispatcher: `fired` (a first attempt acknowledged by the queue), `refired` (a
  retry);
- the worker: `started`, then `done`, `retried` (a retry stored) or `dead`; `skipped`
  (a repeat of an attempt already finished or superseded) and `skipped_cancelled` (a
  message of a cancelled task).

A writer (one process: `writer` is unique per process start) keeps, per hour and per
minute, the *absolute* number of each event it made, and writes those values over its
previous ones every couple of seconds (`CountWriter`). Rewriting an absolute value is
idempotent, so a write retried or repeated never counts twice (Cassandra's counters
would). Readers add the writers' rows up.

States from events
------------------
From the totals of all time (a snapshot of every hour folded so far, plus the hours
since):

- waiting   = submitted - fired - cancelled + skipped_cancelled
- retrying  = retried - refired
- queued    = fired + refired - done - retried - dead - skipped - skipped_cancelled - running
- running   = what live workers report running now (a gauge, not a flow: a worker that
  dies takes its count with it, where a flow would count its tasks as running forever)
- done, dead, cancelled: totals.

How exact
---------
- A writer that crashes loses the events of its last unwritten interval (at most
  `CountWriter.interval_s`): its tasks are counted one state behind.
- Events are counted where they are made, so a transition made twice counts twice: a
  task fired again after a dispatcher's take-over (the design's repeats: up to about a
  second of the old owner's rate) is `fired` twice and then `skipped` once by the
  worker, which nets out; a message delivered again after a worker died mid-attempt is
  `started` twice, which running (a gauge) does not see.
- A cancel of a task already published counts it `cancelled` (from waiting) before the
  worker skips it; `skipped_cancelled` gives it back to waiting, so both nets are right.
  A cancel of a retry copy counts it out of waiting, not retrying.
- Tasks written without this SDK (a CQL insert, another language) are not `submitted`:
  when they fire, waiting would go below zero. Every state is shown at least 0.

How stale: a count is as old as its writer's last write (every `interval_s`, 2 s) plus
the read.
"""

from __future__ import annotations

import operator
import threading
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

AGGREGATE_TENANT = ""
"""The tenant of a writer's minute rows that add up all its tenants (no real tenant has an
empty name), so a chart of everything reads one slice of an hour."""

HOUR_MS = 3_600_000
MINUTE_MS = 60_000

EVENTS: tuple[str, ...] = (
    "submitted", "fired", "refired", "started", "done", "retried", "dead", "cancelled", "skipped",
    "skipped_cancelled",
)
"""The events counted, in the order of `CountRow.values`; stores keep one column each."""

EVENT_INDEX = {name: i for i, name in enumerate(EVENTS)}

STATES: tuple[str, ...] = ("waiting", "queued", "running", "retrying", "done", "dead", "cancelled")
"""The states shown, in display order."""

Pair = tuple[str, str]
"""(tenant, type)."""

Values = tuple[int, ...]
"""One number per event of `EVENTS`."""

ZERO: Values = (0,) * len(EVENTS)


@dataclass(frozen=True, slots=True)
class CountRow:
    """One writer's absolute counts of one (tenant, type) over one hour or minute
    (`period`: the hour's or minute's number since the epoch)."""

    period: int
    tenant: str
    type: str
    writer: str
    values: Values


def add_values(a: Values, b: Values) -> Values:
    if len(a) != len(b):
        raise ValueError(f"event counts of {len(a)} and {len(b)} events cannot be added")
    return tuple(map(operator.add, a, b))  # in C: a status adds up tens of thousands of rows


class EventCounter:
    """A writer's counts, per hour and per minute of its own clock. `add` is called by
    the part that makes the transition, from any thread; `take` by the writer thread.

    Events since the last `take` are put in the hour and minute of that `take`, not of
    each event: a row is thus written only during its own period (by the writer's
    clock), and never after it, which is what lets a reader fold a past hour for good.
    """

    def __init__(self, writer: str) -> None:
        self.writer = writer
        self._lock = threading.Lock()
        self._pending: dict[Pair, list[int]] = {}
        self._hour = -1
        self._minute = -1
        self._by_hour: dict[Pair, list[int]] = {}
        self._by_minute: dict[Pair, list[int]] = {}
        self._unwritten: set[Pair] = set()
        """Tenants' (tenant, type) whose minute row changed since it was last given out."""

    def add(self, event: str, tenant: str, type: str, n: int = 1) -> None:
        i = EVENT_INDEX[event]
        with self._lock:
            values = self._pending.get((tenant, type))
            if values is None:
                values = self._pending[(tenant, type)] = [0] * len(EVENTS)
            values[i] += n

    def add_many(self, event: str, counts: Mapping[Pair, int]) -> None:
        if not counts:
            return
        i = EVENT_INDEX[event]
        with self._lock:
            pending = self._pending
            for pair, n in counts.items():
                values = pending.get(pair)
                if values is None:
                    values = pending[pair] = [0] * len(EVENTS)
                values[i] += n

    def take(self, now_ms: int, *, tenant_minutes: bool = True) -> tuple[list[CountRow], list[CountRow]]:
        """The hour rows and minute rows that changed since the last take, with their
        absolute values (to be written over the previous ones). Minute rows come also
        added up over tenants, under `AGGREGATE_TENANT`, at every take; each tenant's
        own minute rows only when `tenant_minutes` is asked for, and when their minute
        ends (so a writer with thousands of tenants does not rewrite them all every
        take: the per-tenant minutes are then as old as the last take that asked)."""
        with self._lock:
            pending, self._pending = self._pending, {}
        hour, minute = now_ms // HOUR_MS, now_ms // MINUTE_MS
        minutes: list[CountRow] = []
        if minute != self._minute:
            # The minute that ended: its tenants' rows not written since they last changed.
            minutes += [CountRow(self._minute, t, k, self.writer, tuple(self._by_minute[(t, k)]))
                        for t, k in self._unwritten]
            self._minute, self._by_minute, self._unwritten = minute, {}, set()
        if hour != self._hour:
            self._hour, self._by_hour = hour, {}
        hours: list[CountRow] = []
        everyone: dict[Pair, list[int]] = {}
        for pair, values in pending.items():
            self._accumulate(self._by_hour, hour, pair, values, hours)
            self._accumulate(self._by_minute, minute, pair, values, None)
            self._unwritten.add(pair)
            sums = everyone.get((AGGREGATE_TENANT, pair[1]))
            if sums is None:
                everyone[(AGGREGATE_TENANT, pair[1])] = list(values)
            else:
                for i, n in enumerate(values):
                    sums[i] += n
        for pair, values in everyone.items():
            self._accumulate(self._by_minute, minute, pair, values, minutes)
        if tenant_minutes:
            minutes += [CountRow(minute, t, k, self.writer, tuple(self._by_minute[(t, k)])) for t, k in self._unwritten]
            self._unwritten = set()
        return hours, minutes

    def _accumulate(self, table: dict[Pair, list[int]], period: int, pair: Pair, values: list[int],
                    out: list[CountRow] | None) -> None:
        total = table.get(pair)
        if total is None:
            total = table[pair] = [0] * len(EVENTS)
        for i, n in enumerate(values):
            total[i] += n
        if out is not None:
            out.append(CountRow(period, pair[0], pair[1], self.writer, tuple(total)))


def sum_rows(rows: Iterable[CountRow], base: Mapping[Pair, Values] | None = None) -> dict[Pair, Values]:
    """Totals per (tenant, type): `base` plus every row."""
    totals: dict[Pair, Values] = dict(base or {})
    for row in rows:
        pair = (row.tenant, row.type)
        totals[pair] = add_values(totals.get(pair, ZERO), row.values)
    return totals


@dataclass(frozen=True)
class Levels:
    """How many tasks of one (tenant, type) are in each state (each at least 0)."""

    waiting: int
    queued: int
    running: int
    retrying: int
    done: int
    dead: int
    cancelled: int

    def as_dict(self) -> dict[str, int]:
        return {state: getattr(self, state) for state in STATES}


def levels(totals: Values, running: int) -> Levels:
    """The states of one (tenant, type) from its event totals and its running gauge."""
    e = dict(zip(EVENTS, totals, strict=True))
    waiting = e["submitted"] - e["fired"] - e["cancelled"] + e["skipped_cancelled"]
    retrying = e["retried"] - e["refired"]
    queued = (e["fired"] + e["refired"] - e["done"] - e["retried"] - e["dead"] - e["skipped"]
              - e["skipped_cancelled"] - running)
    return Levels(max(waiting, 0), max(queued, 0), max(running, 0), max(retrying, 0), e["done"], e["dead"],
                  e["cancelled"])


def count_pairs(pairs: Iterable[Pair]) -> Counter[Pair]:
    """(tenant, type) -> how many times it occurs: `Counter` counts in C."""
    return Counter(pairs)
