"""`AttemptRecord`: what `scheduler get ID --history` shows of each attempt of a task:
when it was published, when its handler started and finished, on which worker, how it
ended and why.

The worker writes an attempt's record with the report that ends it (`done`, `failed`,
`dead`), in the same write, into the task's home row (one more cell per attempt, no
more requests): a map from attempt number to the record as compact JSON, each attempt a
cell of its own. An attempt still running has no record yet; its status says so.
"""

from __future__ import annotations

import json
from dataclasses import dataclass


@dataclass(frozen=True)
class AttemptRecord:
    attempt: int
    fired_ms: int | None
    """When the queue took the message (its record's timestamp: the publish, or the
    release stamp of a task the fairness gate held)."""
    started_ms: int | None
    finished_ms: int | None
    worker: str | None
    outcome: str
    """`done`, `failed` (a retry follows) or `dead`."""
    error: str | None = None

    def encode(self) -> str:
        """Compact JSON, without the attempt (the map's key). Written out by hand: one is
        made per task a worker finishes, and `json.dumps` of a dict cost ~25 µs a task."""
        parts = [f'"outcome":{json.dumps(self.outcome)}']
        for name, value in (("fired_ms", self.fired_ms), ("started_ms", self.started_ms),
                            ("finished_ms", self.finished_ms)):
            if value is not None:
                parts.append(f'"{name}":{int(value)}')
        if self.worker is not None:
            parts.append(f'"worker":{json.dumps(self.worker)}')
        if self.error is not None:
            parts.append(f'"error":{json.dumps(self.error)}')
        return "{" + ",".join(parts) + "}"

    @classmethod
    def decode(cls, attempt: int, text: str) -> AttemptRecord:
        """The record of `attempt` from `encode`'s text; a text that is not one gives a
        record whose outcome says so (a row written by hand must not fail a `get`)."""
        try:
            fields = json.loads(text)
            if not isinstance(fields, dict):
                raise ValueError("not an object")
            return cls(attempt, _int(fields.get("fired_ms")), _int(fields.get("started_ms")),
                       _int(fields.get("finished_ms")), _str(fields.get("worker")), str(fields.get("outcome", "?")),
                       _str(fields.get("error")))
        except ValueError:
            return cls(attempt, None, None, None, None, "unreadable record", text[:200])


def _int(value: object) -> int | None:
    return value if isinstance(value, int) else None


def _str(value: object) -> str | None:
    return value if isinstance(value, str) else None
