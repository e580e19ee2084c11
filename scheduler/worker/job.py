"""`Job`: one message on its way through a worker, from the buffer it was placed in to
its outcome. Made by `intake`, run by `execution`, settled by `outcomes`. Only the main
loop changes a job; a handler thread only reads the one it runs."""

from __future__ import annotations

from dataclasses import dataclass, field

from scheduler.model import Message
from scheduler.ports import Delivery
from scheduler.worker.app import Handler


@dataclass(eq=False, slots=True)
class Job:
    """A message on its way through the worker."""

    delivery: Delivery
    message: Message
    handler: Handler
    topic: str
    started_at: float = 0.0
    started_ms: int = 0
    """The wall-clock moment it started (`started_at` is the monotonic one)."""
    deadline: float | None = None
    finished: bool = False
    followers: list[Delivery] = field(default_factory=list)
    """Deliveries of the same attempt that arrived while this one was held."""
    shard: int = 0
    mark_seen: int = 0
    """Its shard's cancel count when it was placed: a start under another count checks again."""
