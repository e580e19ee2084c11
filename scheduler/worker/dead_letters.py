"""Dead letters: what a worker parks on the dead-letter topic, and the markers that
say a letter was replayed.

A dead letter keeps the message exactly as it was consumed, so a replay (or a human)
has everything the worker had, plus why it was parked:

    [1, "dead", message, task_id|None, tenant|None, type|None, attempt, reason, error,
     source_topic, dead_at_ms]

`reason` is one of `REASONS`; `error` is the last error's text. A message that could
not be decoded has no task id, tenant or type; its raw bytes are kept. A dispatcher
parks a stored row it cannot read the same way (`for_bad_row`): the message is then the
row's columns as a msgpack map, the source `store:<bucket>/<shard>`.

`scheduler dlq replay` appends a marker for each letter it re-submits,

    [1, "replayed", letter, new_task_id, replayed_at_ms]

where `letter` names the dead letter by its place in the topic (`partition:offset`).
A topic is append-only, so the markers are how `dlq list` knows which letters are
still waiting, on Kafka and on the embedded queue alike.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgpack

from scheduler.errors import InvalidMessage, InvalidTask
from scheduler.model import TaskId
from scheduler.ports import BadRow, Delivery

VERSION = 1

PERMANENT = "permanent error"
EXHAUSTED = "attempts exhausted"
UNDECODABLE = "undecodable message"
UNKNOWN_TYPE = "no handler for the task type"
UNREADABLE_ROW = "unreadable stored row"
REASONS = (PERMANENT, EXHAUSTED, UNDECODABLE, UNKNOWN_TYPE, UNREADABLE_ROW)

MAX_ERROR_CHARS = 2000
MAX_MESSAGE_BYTES = 256 * 1024
"""A message kept in a dead letter is cut to this (a task's is far smaller; garbage may
not be), so the letter always fits the topic's message size limit."""


@dataclass(frozen=True)
class DeadLetter:
    message: bytes
    task_id: TaskId | None
    tenant: str | None
    type: str | None
    attempt: int
    reason: str
    error: str
    source_topic: str
    dead_at_ms: int
    letter: str = ""
    """Where the letter sits in the dead-letter topic (`partition:offset`), once read."""


@dataclass(frozen=True)
class Replayed:
    letter: str
    new_task_id: TaskId
    replayed_at_ms: int


def bounded(error: str) -> str:
    """`error` cut to `MAX_ERROR_CHARS`, saying so: a traceback can be megabytes."""
    if len(error) <= MAX_ERROR_CHARS:
        return error
    return error[:MAX_ERROR_CHARS] + f"... [{len(error) - MAX_ERROR_CHARS} more characters]"


def encode_dead_letter(letter: DeadLetter) -> bytes:
    message = letter.message
    error = letter.error
    if len(message) > MAX_MESSAGE_BYTES:
        error = f"{error} (message cut from {len(message)} to {MAX_MESSAGE_BYTES} bytes)"
        message = message[:MAX_MESSAGE_BYTES]
    data: bytes = msgpack.packb(
        [VERSION, "dead", message, None if letter.task_id is None else letter.task_id.bytes,
         letter.tenant, letter.type, letter.attempt, letter.reason, bounded(error),
         letter.source_topic, letter.dead_at_ms],
        use_bin_type=True,
    )
    return data


def for_bad_row(bad: BadRow, dead_at_ms: int) -> bytes:
    """The dead letter of a stored row that is not a valid task: its columns as read."""
    try:
        task_id: TaskId | None = TaskId.from_bytes(bad.task_id)
    except InvalidTask:
        task_id = None
    tenant, type_, attempt = bad.fields.get("tenant"), bad.fields.get("type"), bad.fields.get("attempt")
    raw: bytes = msgpack.packb(dict(bad.fields), use_bin_type=True, default=repr)
    return encode_dead_letter(DeadLetter(
        raw, task_id, tenant if isinstance(tenant, str) else None, type_ if isinstance(type_, str) else None,
        attempt if isinstance(attempt, int) else 0, UNREADABLE_ROW, bad.reason,
        f"store:{bad.partition.minute_bucket}/{bad.partition.shard}", dead_at_ms,
    ))


def encode_replayed(marker: Replayed) -> bytes:
    data: bytes = msgpack.packb(
        [VERSION, "replayed", marker.letter, marker.new_task_id.bytes, marker.replayed_at_ms], use_bin_type=True
    )
    return data


def decode_record(delivery: Delivery) -> DeadLetter | Replayed:
    """The dead letter or marker in `delivery`, or `InvalidMessage`."""
    try:
        fields = msgpack.unpackb(delivery.value, raw=False)
    except Exception as exc:  # msgpack raises several unrelated types on garbage
        raise InvalidMessage(f"dead-letter record is not msgpack: {exc}") from None
    try:
        if not isinstance(fields, list) or fields[0] != VERSION:
            raise InvalidMessage("dead-letter record is not a version-1 array")
        if fields[1] == "dead":
            _, _, message, task_id, tenant, type_, attempt, reason, error, source, dead_at = fields
            return DeadLetter(
                message, None if task_id is None else TaskId.from_bytes(task_id), tenant, type_, attempt, reason,
                error, source, dead_at, letter=f"{delivery.partition}:{delivery.offset}",
            )
        if fields[1] == "replayed":
            _, _, letter, new_id, at = fields
            return Replayed(letter, TaskId.from_bytes(new_id), at)
    except (ValueError, TypeError, IndexError) as exc:
        raise InvalidMessage(f"dead-letter record has the wrong shape: {exc}") from None
    raise InvalidMessage(f"unknown dead-letter record kind {fields[1]!r}")


def waiting(deliveries: list[Delivery]) -> tuple[list[DeadLetter], dict[str, Replayed], int]:
    """The dead letters not yet replayed, the replay markers by letter, and how many
    records could not be read."""
    letters: list[DeadLetter] = []
    replayed: dict[str, Replayed] = {}
    unreadable = 0
    for delivery in deliveries:
        try:
            record = decode_record(delivery)
        except InvalidMessage:
            unreadable += 1
            continue
        if isinstance(record, DeadLetter):
            letters.append(record)
        else:
            replayed[record.letter] = record
    # A letter written twice (a worker that died between the letter and the task's
    # status, then ran the message again) is listed and replayed once.
    seen: set[tuple[TaskId, int]] = set()
    distinct = []
    for letter in letters:
        if letter.task_id is not None:
            if (letter.task_id, letter.attempt) in seen:
                continue
            seen.add((letter.task_id, letter.attempt))
        distinct.append(letter)
    return [letter for letter in distinct if letter.letter not in replayed], replayed, unreadable
