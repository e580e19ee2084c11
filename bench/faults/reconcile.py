"""Every acknowledged task set against what the ready topics and the handlers say.

From the messages read back (broker timestamps, `LogAppendTime`) and the handler
starts the workers recorded (`bench.worker_app`), for the tasks the burst stored and
the producer had acknowledged:

- lost: acknowledged but never published, and acknowledged but never handled;
- early: first published, or first handled, before its time;
- duplicates: tasks published more than once, split by cause: copies under different
  lease tokens (a new owner of the shard fired it again, from the old owner's last
  recorded cursor or hand-off position) and copies under one token (the same owner
  published it again after a flush it could not confirm); and tasks whose handler ran
  more than once;
- lateness: first publish - run_at (p50, p99, max) of every task, and of the tasks
  due while the fault lasted (from its start to 10 s after it was undone);
- recovery: from the fault's start to the last publish that was more than a second
  late, or 0 if none was (firing never fell behind).

Nothing here touches a server."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from bench.nine.reader import Record
from bench.nine.report import lateness_figures
from bench.nine.workers import Handled, tally
from scheduler.errors import InvalidMessage
from scheduler.model import decode_message

LATE_MS = 1000
AFTER_RECOVERY_MS = 10_000


def published_copies(records: Sequence[Record], expected: Mapping[bytes, int]) -> dict[bytes, list[tuple[int, int]]]:
    """Task id -> [(broker timestamp ms, lease token)] of every message of an expected task."""
    copies: dict[bytes, list[tuple[int, int]]] = defaultdict(list)
    for value, stamp, _kind in records:
        try:
            message = decode_message(value)
        except InvalidMessage:
            continue
        key = message.task.id.bytes
        if key in expected:
            copies[key].append((stamp, message.fence))
    return copies


def reconcile(records: Sequence[Record], handled: Sequence[Handled], expected: Mapping[bytes, int],
              injected_ms: int | None, recovered_ms: int | None) -> dict[str, Any]:
    copies = published_copies(records, expected)
    first_publish = {key: min(stamp for stamp, _ in found) for key, found in copies.items()}
    lateness = {key: first_publish[key] - expected[key] for key in first_publish}
    owner_change = same_owner = 0
    for found in copies.values():
        if len(found) > 1:
            if len({fence for _, fence in found}) > 1:
                owner_change += 1
            else:
                same_owner += 1
    handling = tally(handled, expected)
    handler_lateness = [start - expected[key] for key, start in handling.first_start.items()]

    window: list[int] = []
    recovery_ms: int | None = None
    late_after_fault = 0
    if injected_ms is not None:
        window_end = (recovered_ms or injected_ms) + AFTER_RECOVERY_MS
        window = [late for key, late in lateness.items() if injected_ms <= expected[key] <= window_end]
        late_publishes = [first_publish[key] for key, late in lateness.items()
                          if late > LATE_MS and first_publish[key] >= injected_ms]
        late_after_fault = len(late_publishes)
        recovery_ms = max(late_publishes) - injected_ms if late_publishes else 0
    return {
        "acknowledged": len(expected),
        "published": len(copies),
        "handled": handling.handled,
        "lost_unpublished": len(expected) - len(copies),
        "lost_unhandled": handling.lost,
        "early_published": sum(1 for late in lateness.values() if late < 0),
        "early_handled": sum(1 for late in handler_lateness if late < 0),
        "duplicates": {
            "published_more_than_once": owner_change + same_owner,
            "after_an_owner_change": owner_change,
            "by_the_same_owner": same_owner,
            "handled_more_than_once": handling.repeated_tasks,
            "extra_handler_starts": handling.extra_starts,
        },
        "lateness_ms": lateness_figures(list(lateness.values())),
        "lateness_ms_while_faulted": lateness_figures(window),
        "handler_lateness_ms": lateness_figures(handler_lateness),
        "late_publishes_after_fault": late_after_fault,
        "recovery_s": None if recovery_ms is None else round(recovery_ms / 1000, 1),
        "unexpected_handled": handling.unexpected,
    }


def lost_sample(expected: Mapping[bytes, int], records: Sequence[Record], handled: Sequence[Handled],
                limit: int = 10) -> list[dict[str, Any]]:
    """A few lost tasks, for the report: id, run_at, and whether any copy was published."""
    copies = published_copies(records, expected)
    done = {record.task_id for record in handled}
    missing = [key for key in expected if key not in done]
    return [{"id": key.hex(), "run_at_ms": expected[key], "published": key in copies} for key in missing[:limit]]
