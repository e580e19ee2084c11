"""The hand-off: how a producer tells a shard's owner of tasks, and cancels, due soon.

The dispatcher reads a minute of tasks a minute ahead. A task stored after that read
for a minute already loaded, or for a time already behind the shard's cursor, would be
missed; so the producer, once the store has acknowledged such a task, also appends it to
the hand-off log, in the partition of the task's shard, and the shard's owner merges it
into its wheel (or fires it at once if it is overdue). Cancels of tasks due soon travel
the same way, so a loaded task that was cancelled is never fired.

Workers send completions the same way, `[1, "done", [<id>, ...]]`, one record per shard
per batch of finished attempts: the shard's owner released those tasks, and frees their
places under their tenant's concurrency cap (`scheduler.fairness.gate`).

A record is a msgpack array, `[1, "task", <queue message>]`, `[1, "cancel", <id>]` or
`[1, "done", [<id>, ...]]`; the queue message is the one the dispatcher publishes
(`model.encode_message`, fence 0), so an owner re-encodes it only to put its own fencing
token in.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import mmh3
import msgpack

from scheduler.errors import InvalidMessage, InvalidTask
from scheduler.model import DEFAULT_SHARD_COUNT, Task, TaskId, decode_message, encode_message
from scheduler.ports import HandoffLog

HANDOFF_VERSION = 1


@dataclass(frozen=True, slots=True)
class HandedTask:
    task: Task


@dataclass(frozen=True, slots=True)
class HandedCancel:
    task_id: TaskId


@dataclass(frozen=True, slots=True)
class HandedCompletions:
    task_ids: tuple[bytes, ...]
    """The 16-byte ids of finished attempts."""


HandoffItem = HandedTask | HandedCancel | HandedCompletions


def encode_task(task: Task) -> bytes:
    data: bytes = msgpack.packb([HANDOFF_VERSION, "task", encode_message(task, 0)], use_bin_type=True)
    return data


def encode_cancel(task_id: TaskId) -> bytes:
    data: bytes = msgpack.packb([HANDOFF_VERSION, "cancel", task_id.bytes], use_bin_type=True)
    return data


def encode_completions(task_ids: Sequence[bytes]) -> bytes:
    data: bytes = msgpack.packb([HANDOFF_VERSION, "done", list(task_ids)], use_bin_type=True)
    return data


def decode(value: bytes) -> HandoffItem:
    """The hand-off record in `value`, or `InvalidMessage` saying what is wrong with it."""
    try:
        fields = msgpack.unpackb(value, raw=False)
    except Exception as exc:  # msgpack raises several unrelated types on garbage
        raise InvalidMessage(f"hand-off record is not msgpack: {exc}") from None
    if not isinstance(fields, list) or len(fields) != 3 or fields[0] != HANDOFF_VERSION:
        raise InvalidMessage(f"hand-off record is not a version-{HANDOFF_VERSION} [version, kind, body] array")
    _, kind, body = fields
    if kind == "done":
        if not isinstance(body, list) or not all(isinstance(item, bytes) and len(item) == 16 for item in body):
            raise InvalidMessage("hand-off completions are not a list of 16-byte task ids")
        return HandedCompletions(tuple(body))
    if not isinstance(body, bytes):
        raise InvalidMessage("hand-off record body is not bytes")
    if kind == "task":
        return HandedTask(decode_message(body).task)
    if kind == "cancel":
        try:
            return HandedCancel(TaskId.from_bytes(body))
        except InvalidTask as exc:
            raise InvalidMessage(f"hand-off cancel holds no task id: {exc}") from None
    raise InvalidMessage(f"hand-off record of unknown kind {kind!r}")


class LogHandoff:
    """The producer's `Handoff` port over a `HandoffLog`: one partition per shard."""

    def __init__(self, log: HandoffLog, shard_count: int = DEFAULT_SHARD_COUNT) -> None:
        self.log = log
        self.shard_count = shard_count

    def submitted(self, tasks: Sequence[Task]) -> None:
        by_shard: dict[int, list[bytes]] = defaultdict(list)
        for task in tasks:
            by_shard[task.id.shard(self.shard_count)].append(encode_task(task))
        self.log.append(sorted(by_shard.items()))

    def cancelled(self, task_id: TaskId) -> None:
        self.log.append([(task_id.shard(self.shard_count), [encode_cancel(task_id)])])

    def completed(self, task_ids: Sequence[bytes]) -> None:
        by_shard: dict[int, list[bytes]] = defaultdict(list)
        for task_id in task_ids:
            by_shard[mmh3.hash(task_id, 0, signed=False) % self.shard_count].append(task_id)
        self.log.append([(shard, [encode_completions(ids)]) for shard, ids in sorted(by_shard.items())])
