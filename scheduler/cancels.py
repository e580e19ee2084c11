"""Definite cancels: once `Client.cancel` answered `CANCELLED`, no attempt of the task
starts, wherever the task is (in the store, a dispatcher's wheel or release gate, a
ready topic, a worker's buffer), however the cancelling client was built, and without
a store read per task on the worker's path.

How
---
1. The cancel writes `cancelled` on the task's home row (as it always did). A task due
   more than `REACH_MS` from now is in no wheel and no queue yet: the dispatcher that
   loads it later reads the status and never fires it. That is the whole cancel.
2. A task due sooner (or already due) may be loaded, fired, or queued. The cancel then
   also raises its shard's **cancel mark** in the store (`TaskStore.read_cancel_marks`):
   the time of the cancel and a count that changes with every cancel. With a hand-off it
   also tells the shard's owner, which drops the task from its wheel or gate (that only
   saves a publish; correctness does not rest on it).
3. Every worker reads all marks every `REFRESH_MS` and starts nothing while its copy is
   older than `MAX_AGE_MS`. A message whose shard was marked within `REACH_MS` of the
   task's `run_at` is checked against its home row before it is placed (one query per
   partition per batch, as for repeats). A message already placed whose shard's count
   changed since is checked again before it starts.
4. The cancel returns `SETTLE_MS` (> `MAX_AGE_MS`) after its mark was written. By then
   every worker has read the marks since, so any start after the return sees the mark
   and, through the check, the cancelled row. (A start is decided on the worker's main
   loop and the handler begins within milliseconds: a free thread takes it, or a chunk
   of handlers that take under a millisecond each; the 500 ms between the two bounds
   covers that.)

Why `REACH_MS`: a dispatcher reads a row at most one bucket plus its one-minute
look-ahead before the row is due (two minutes), so a task fired despite a cancel was
read after the cancel's write began, less than two minutes before its `run_at`; the rest
is room for clocks that disagree (up to `CLOCK_SKEW_LIMIT_MS` between any two machines).
A shard's mark costs its messages a home-row check for about `REACH_MS` after a cancel
of a task due soon; cancels of tasks due later cost nothing.

What it does not cover: a status written into the store by other means (a CQL UPDATE)
raises no mark, so a worker may start a task already queued when it was written. Only
`TaskStore.cancel` (the SDK, `scheduler cancel`) is definite.
"""

from __future__ import annotations

from collections.abc import Mapping

REACH_MS = 240_000
"""A cancel of a task due within this of now (or past due) raises its shard's mark; a
worker checks a message whose shard was marked within this of the task's `run_at`."""

CLOCK_SKEW_LIMIT_MS = 60_000
"""The largest disagreement between machines' clocks that cancels allow for."""

REFRESH_MS = 200
"""How often a worker reads the cancel marks."""

MAX_AGE_MS = 1_500
"""A worker starts nothing while its copy of the marks was read longer ago than this."""

SETTLE_MS = 2_000
"""How long a cancel that raised a mark waits before it returns (see the module docstring)."""


def may_be_in_flight(run_at_ms: int, now_ms: int) -> bool:
    """Whether a task due at `run_at_ms` may already be in a wheel, a gate or a queue."""
    return run_at_ms <= now_ms + REACH_MS


def needs_check(marked_at_ms: int | None, run_at_ms: int) -> bool:
    """Whether a message due at `run_at_ms` must be checked against its home row, its
    shard's mark being `marked_at_ms` (None: never marked)."""
    return marked_at_ms is not None and marked_at_ms >= run_at_ms - REACH_MS


def mark_changed(counts: Mapping[int, int], shard: int, seen: int) -> bool:
    """Whether the shard had a cancel since its count was `seen`."""
    return counts.get(shard, 0) != seen
