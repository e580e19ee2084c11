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
   older than `MAX_AGE_MS`. A message whose shard was marked since `REACH_MS` before
   the task's *home* time (the `run_at` its id carries, which every attempt and copy of
   the task shares) is checked against its home row before it is placed: one query per
   partition per batch, as for repeats, and required (tried again until it answers,
   never skipped) whatever `--check` says. A message already placed is started only if
   its shard's count is still the one it was placed under and the copy is fresh; the
   handler's own thread asks that at the moment the handler would begin (however late
   that is: behind a slow job of its chunk, on a busy event loop, after a workflow
   step's check), and sends a job that fails it back to be checked.
4. The cancel's status outranks every attempt of the task (`ports.report_order`),
   reported or not: an attempt that was starting as the cancel was written reports
   `running` and `failed` under it, and the next attempt's check finds `cancelled`.
5. The cancel returns `SETTLE_MS` (> `MAX_AGE_MS`) after its mark was written.

Why no attempt starts after the return: take a handler that begins at S, under a copy
of the marks whose read began at R, with S - R <= `MAX_AGE_MS` (the start rule of 3).
If the mark was written before R, the copy has it: the shard's count moved since the
message was placed (or the message was placed under it, after a check that began
after the mark), so the message was checked against the home row after the cancel was
written and found it cancelled (4). Otherwise the mark was written after R, so
S <= R + `MAX_AGE_MS` < mark + `SETTLE_MS`: the handler began before the cancel
returned. The bound rests on nothing but the worker's own monotonic clock, whatever
comes between the main loop's decision and the handler.

Why the home time and `REACH_MS`: a dispatcher reads a row at most one bucket plus its
one-minute look-ahead before the row is due (two minutes), so a first attempt fired
despite a cancel was read after the cancel's write began, less than two minutes before
its `run_at`; the rest is room for clocks that disagree (up to `CLOCK_SKEW_LIMIT_MS`
between any two machines). A cancel written earlier than that stops the first attempt
in the store, and with it every later one (a retry is made only by an attempt that
ran). A retry or a deferred copy is another row, fired whenever it is due, which never
holds the cancel: it is checked because its home time is what counts, not its own. A
shard's mark costs its messages a home-row check for about `REACH_MS` after a cancel of
a task due soon (and retries of tasks due before it, for as long as marks keep coming);
cancels of tasks due later cost nothing.

What it does not cover: a status written into the store by other means (a CQL UPDATE)
raises no mark, so a worker may start a task already queued when it was written. Only
`TaskStore.cancel` (the SDK, `scheduler cancel`) is definite.
"""

from __future__ import annotations

from collections.abc import Mapping

REACH_MS = 240_000
"""A cancel of a task due within this of now (or past due) raises its shard's mark; a
worker checks a message whose shard was marked since this before the task's home time."""

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


def needs_check(marked_at_ms: int | None, home_run_at_ms: int) -> bool:
    """Whether a message of a task whose home row is due at `home_run_at_ms` (its id's
    time, not the message's own `run_at`, which a retry moves) must be checked against
    that row, its shard's mark being `marked_at_ms` (None: never marked)."""
    return marked_at_ms is not None and marked_at_ms >= home_run_at_ms - REACH_MS


def mark_changed(counts: Mapping[int, int], shard: int, seen: int) -> bool:
    """Whether the shard had a cancel since its count was `seen`."""
    return counts.get(shard, 0) != seen
