"""The values every part of the scheduler agrees on: task ids, tasks, buckets, shards
and the message a dispatcher publishes for a worker.

A task id carries its own address
---------------------------------
`TaskId` is 128 bits laid out as a UUIDv7 (RFC 9562)::

    | unix_ts_ms: 48 | ver=7: 4 | rand_a: 12 | var=0b10: 2 | rand_b: 62 |

with `unix_ts_ms` set to the task's scheduled `run_at`, not to the time it was made.
From the id alone follow the task's partition and clustering key:

    bucket = run_at_ms - run_at_ms % 60_000          (the minute it falls due)
    shard  = murmur3_x86_32(id bytes, seed 0) % 64   (unsigned; same on every machine)
    row    = (bucket, shard) / (run_at, id)

so `get` and `cancel` need no second table and a submit costs one partition write.

Worked example: a task due 2026-12-02T09:00:00.250Z has `run_at_ms = 1796202000250`,
i.e. the id starts `01a235fb-6f7a-7…` and its bucket is `1796202000000`
(09:00:00.000Z). Its shard depends on all 128 bits, so tasks due in the same
millisecond still spread evenly over the 64 shards.

When the producer gives an idempotency key, the 74 random bits are instead taken
from a hash of `(tenant, key)`: the same tenant, key and `run_at` (to the millisecond)
always make the same id, so a retried submit overwrites the one row it wrote before.

Payloads travel as msgpack bytes (never pickle): a task holds its payload already
encoded, and the queue message embeds those bytes unchanged.

A task's cost
-------------
`Task.cost` (1 by default) is how many units of its tenant's rate limit the task uses
when it is released: a task that sends 500 SMS has cost 500, so a provider limit of
2,000 messages a second lets four such tasks through a second. The queue message
carries it only when it is not 1 (see `encode_message`), and a dispatcher reads it,
with the tenant and priority, from the encoded message (`peek_release_fields`).
"""

from __future__ import annotations

import collections
import enum
import hashlib
import os
import threading
import unicodedata
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, NamedTuple

import mmh3
import msgpack

from scheduler.errors import ConfigError, InvalidMessage, InvalidPayload, InvalidTask, InvalidTaskId

BUCKET_MS = 60_000
"""Width of a bucket: tasks are partitioned by the minute they fall due."""

LATE_WRITE_LIMIT_MS = 5 * BUCKET_MS
"""How long after its run_at a task may be written with no hand-off and still fire: a
dispatcher's sweep looks back at least this far, plus a minute for clocks, behind its
cursor (`scheduler dispatcher --sweep-horizon`). A task handed off fires however late it
was written."""

DEFAULT_SHARD_COUNT = 64
"""Shards per keyspace. Fixed when the keyspace is created and recorded in it."""

MAX_SHARD_COUNT = 4096

MAX_PAYLOAD_BYTES = 64 * 1024
"""Largest encoded payload a task may carry: tasks are many and loaded a minute ahead."""

DEFAULT_MAX_ATTEMPTS = 5

MAX_ATTEMPTS_LIMIT = 100
"""Most attempts a task may be given; keeps status write timestamps within a millisecond
of the task's time (see `status_write_timestamp_us`)."""

MAX_RETRY_DELAY_S = 7 * 86_400.0
"""Longest wait before a retry: what a handler may ask for with `RetryableError(delay_s=...)`
and the most a policy's backoff may be. A cancel is kept at least this long (plus a day)
past its retention, so no retry it stops outlives it (`scheduler.retention`)."""

MAX_COST = 1_000_000
"""Largest cost a task may have (units of its tenant's rate limit; see `Task.cost`)."""

MAX_NAME_CHARS = 100
"""Longest tenant or type name, in characters (see `check_name`).

Both names are stored in every task row and travel in every queue message, hand-off
record and dead letter, beside a payload of typically 100 bytes: 100 characters (at
most 400 bytes of UTF-8, usually 100) keeps them from outweighing the task they name,
while leaving room for any name a person or a program means (a DNS label is 63
characters; a dotted handler name such as `results.board.sms_reminder` is under 40).
A longer "name" is almost always an id, a payload or a message passed by mistake."""

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_ONE_MS = timedelta(milliseconds=1)
_MAX_RUN_AT_MS = (1 << 48) - 1  # the id's timestamp field: good until the year 10889
_RAND_A_BITS = 12
_RAND_B_BITS = 62
_VERSION = 7
_VARIANT = 0b10


class Priority(enum.Enum):
    """Which ready topic a task is published to; workers serve high:normal:low as 7:2:1."""

    HIGH = "high"
    NORMAL = "normal"
    LOW = "low"

    @property
    def code(self) -> int:
        """Compact form for storage and messages: 0 high, 1 normal, 2 low."""
        return _PRIORITY_CODES[self]

    @classmethod
    def from_code(cls, code: int) -> Priority:
        try:
            return _PRIORITIES_BY_CODE[code]
        except (KeyError, TypeError):
            raise InvalidTask(f"unknown priority code {code!r}: expected 0, 1 or 2") from None

    @classmethod
    def parse(cls, value: str | Priority) -> Priority:
        if isinstance(value, Priority):
            return value
        try:
            return cls(value)
        except ValueError:
            names = ", ".join(p.value for p in cls)
            raise InvalidTask(f"unknown priority {value!r}: use one of {names}") from None


_PRIORITY_CODES = {Priority.HIGH: 0, Priority.NORMAL: 1, Priority.LOW: 2}
_PRIORITIES_BY_CODE = {code: priority for priority, code in _PRIORITY_CODES.items()}


class _Entropy:
    """74-bit random numbers for new ids, cut from 4 KiB reads of OS randomness: one
    `getrandom` call per 409 ids instead of one per id, on the submit path of every task.

    Threads share one queue; `deque.popleft` is atomic, so no two threads ever take the
    same number. A forked child empties the queue, so it never mints from bytes its
    parent also holds.
    """

    def __init__(self) -> None:
        self._ready: collections.deque[int] = collections.deque()

    def bits74(self) -> int:
        while True:
            try:
                return self._ready.popleft()
            except IndexError:
                data = os.urandom(4090)
                self._ready.extend(int.from_bytes(data[i:i + 10]) >> 6 for i in range(0, 4090, 10))

    def forget(self) -> None:
        self._ready.clear()


_entropy = _Entropy()
os.register_at_fork(after_in_child=_entropy.forget)


def valid_max_attempts(max_attempts: object) -> bool:
    """Whether `max_attempts` is an attempt count a task may have (1 to `MAX_ATTEMPTS_LIMIT`)."""
    return isinstance(max_attempts, int) and 1 <= max_attempts <= MAX_ATTEMPTS_LIMIT


def valid_cost(cost: object) -> bool:
    """Whether `cost` is a cost a task may have: an int (not a bool) from 1 to `MAX_COST`."""
    return isinstance(cost, int) and not isinstance(cost, bool) and 1 <= cost <= MAX_COST


def check_cost(cost: int) -> int:
    """`cost` if it is a valid task cost, else `InvalidTask` saying what a cost is."""
    if not valid_cost(cost):
        raise InvalidTask(
            f"cost must be an integer from 1 to {MAX_COST} (units of the tenant's rate limit, e.g. SMS in the task), "
            f"got {cost!r}"
        )
    return cost


_NAME_ROLES = {"tenant": "naming who owns it", "type": "naming its handler"}

_SHOWN_CHARS = 40
"""How much of a refused name an error message quotes."""

_ZERO_WIDTH_JOINERS = frozenset("\u200c\u200d")
"""Format characters a name may hold: Persian and Indic words and emoji sequences need them."""

_REFUSED_CATEGORIES = {
    "Cc": "a control character",
    "Cf": "an invisible formatting character",
    "Cs": "a lone surrogate, which is not valid Unicode text",
    "Zl": "a line separator",
    "Zp": "a paragraph separator",
}


def valid_name(text: object) -> bool:
    """Whether `text` is a name `check_name` accepts: True or False, never an error, and
    cheap for the usual name (one C-level scan), so a worker can check every message."""
    if not isinstance(text, str) or not 0 < len(text) <= MAX_NAME_CHARS:
        return False
    if text.isprintable():  # stricter than the rule: if it passes, only whitespace can be wrong
        return not text.isspace()
    return _bad_character(text) is None and not text.isspace()


def check_name(what: str, text: object) -> str:
    """`text` if it may name a task's `what` (its tenant or its type), else `InvalidTask`
    naming the field, the rule and the offending value (shortened when long).

    A name is a string of 1 to `MAX_NAME_CHARS` characters, not all whitespace, without
    control characters (NUL, newline, tab, DEL, ...), line or paragraph separators, lone
    surrogates, or invisible formatting characters (bidirectional overrides, zero-width
    spaces; the zero-width joiners that some scripts need are allowed). Names are printed
    by the CLI and logs and compared byte for byte: a character that breaks a line, hides
    or reorders text makes two tenants look alike or a log line lie. Any letter of any
    script is fine ("कॉलेज", "東京"), and so are characters this Python's Unicode database
    does not know yet: a name a newer producer accepts must still read back everywhere.

    `Task` (the checked constructor), the producer and the worker's message decoder all
    apply this one rule.
    """
    if not isinstance(text, str) or not text:
        role = _NAME_ROLES.get(what, f"naming its {what}")
        raise InvalidTask(f"a task needs a {what}: a non-empty string {role}")
    if valid_name(text):
        return text
    shown = text if len(text) <= _SHOWN_CHARS else text[:_SHOWN_CHARS] + "…"
    if len(text) > MAX_NAME_CHARS:
        raise InvalidTask(
            f"a task's {what} is at most {MAX_NAME_CHARS} characters, got {len(text)}: {shown!r}"
        )
    found = _bad_character(text)
    if found is not None:
        position, char, kind = found
        raise InvalidTask(
            f"a task's {what} may hold only printable characters, got {shown!r}: {kind} "
            f"(U+{ord(char):04X}) at position {position}"
        )
    raise InvalidTask(f"a task's {what} must not be only whitespace, got {shown!r}")


def _bad_character(text: str) -> tuple[int, str, str] | None:
    """The first character a name may not hold: (position, character, what it is)."""
    for position, char in enumerate(text):
        kind = _REFUSED_CATEGORIES.get(unicodedata.category(char))
        if kind is not None and char not in _ZERO_WIDTH_JOINERS:
            return position, char, kind
    return None


def check_shard_count(shard_count: int) -> int:
    if not isinstance(shard_count, int) or not 1 <= shard_count <= MAX_SHARD_COUNT:
        raise ConfigError(f"shard count must be an integer from 1 to {MAX_SHARD_COUNT}, got {shard_count!r}")
    return shard_count


def check_run_at_ms(run_at_ms: int) -> int:
    if not isinstance(run_at_ms, int) or not 0 <= run_at_ms <= _MAX_RUN_AT_MS:
        raise InvalidTask(f"run_at must be between 1970-01-01 and the year 10889, got {run_at_ms!r} ms")
    return run_at_ms


def to_ms(moment: datetime) -> int:
    """Milliseconds since the Unix epoch of an aware datetime (truncated to the ms)."""
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise InvalidTask(
            f"run_at {moment.isoformat()} has no time zone: pass an aware datetime, "
            "e.g. datetime(..., tzinfo=ZoneInfo('Asia/Kolkata')) or datetime.now(timezone.utc)"
        )
    return check_run_at_ms((moment - _EPOCH) // _ONE_MS)


def from_ms(ms: int) -> datetime:
    """The UTC datetime of a millisecond timestamp."""
    return _EPOCH + ms * _ONE_MS



def minute_bucket(run_at_ms: int) -> int:
    """The start (ms) of the minute in which `run_at_ms` falls: the partition's time key."""
    return run_at_ms - run_at_ms % BUCKET_MS


@dataclass(frozen=True, slots=True, order=True)
class TaskId:
    """A task's identity and address; see the module docstring for the layout.

    Ids order by `run_at` first, then by their random bits.
    """

    value: int

    def __post_init__(self) -> None:
        if not isinstance(self.value, int) or not 0 <= self.value < 1 << 128:
            raise InvalidTaskId(f"a task id is a 128-bit unsigned integer, got {self.value!r}")
        if (self.value >> 76) & 0xF != _VERSION or (self.value >> 62) & 0b11 != _VARIANT:
            raise InvalidTaskId(f"{uuid.UUID(int=self.value)} is not a task id (not a version-7 UUID)")

    @classmethod
    def new(cls, run_at_ms: int) -> TaskId:
        """A fresh id for a task due at `run_at_ms`, with 74 bits from the OS's CSPRNG."""
        return cls._compose(run_at_ms, _entropy.bits74())

    @classmethod
    def for_key(cls, run_at_ms: int, tenant: str, idempotency_key: str) -> TaskId:
        """The one id of the task `(tenant, idempotency_key)` due at `run_at_ms`.

        The pair is hashed in an unambiguous encoding, so ("a", "bc") and ("ab", "c")
        differ, and so do equal keys of different tenants.
        """
        digest = hashlib.blake2b(
            msgpack.packb([tenant, idempotency_key]), digest_size=16, person=b"scheduler.key"
        ).digest()
        return cls._compose(run_at_ms, int.from_bytes(digest) >> (128 - _RAND_A_BITS - _RAND_B_BITS))

    @classmethod
    def _compose(cls, run_at_ms: int, random74: int) -> TaskId:
        """The id of these parts; valid by construction, so the checks of `__init__` are
        skipped (this is on the submit path of every task)."""
        check_run_at_ms(run_at_ms)
        rand_a = random74 >> _RAND_B_BITS
        rand_b = random74 & ((1 << _RAND_B_BITS) - 1)
        task_id = object.__new__(cls)
        object.__setattr__(task_id, "value", (run_at_ms << 80) | (_VERSION << 76) | (rand_a << 64) | (_VARIANT << 62) | rand_b)
        return task_id

    @classmethod
    def parse(cls, text: str) -> TaskId:
        """Read the canonical text form, e.g. `019ad6ce-4ba2-7b1e-8c4f-0d2e6b7f1a93`."""
        try:
            value = uuid.UUID(text.strip()).int
        except (ValueError, AttributeError):
            raise InvalidTaskId(f"{text!r} is not a task id: expected a UUID such as 019ad6ce-4ba2-7b1e-8c4f-0d2e6b7f1a93") from None
        return cls(value)

    @classmethod
    def from_bytes(cls, data: bytes) -> TaskId:
        if len(data) != 16:
            raise InvalidTaskId(f"a task id is 16 bytes, got {len(data)}")
        return cls(int.from_bytes(data))

    @classmethod
    def from_uuid(cls, value: uuid.UUID) -> TaskId:
        return cls(value.int)

    @property
    def run_at_ms(self) -> int:
        """The time the task was scheduled for when the id was made."""
        return self.value >> 80

    @property
    def bytes(self) -> bytes:
        return self.value.to_bytes(16)

    @property
    def uuid(self) -> uuid.UUID:
        return uuid.UUID(int=self.value)

    def shard(self, shard_count: int = DEFAULT_SHARD_COUNT) -> int:
        """The shard that owns this task: stable across processes, machines and versions."""
        return mmh3.hash(self.bytes, 0, signed=False) % shard_count

    def __str__(self) -> str:
        return str(self.uuid)


@dataclass(frozen=True, slots=True)
class Partition:
    """The Cassandra partition `(minute_bucket, shard)` that holds a task's row."""

    minute_bucket: int
    shard: int


def encode_payload(payload: Any, *, max_bytes: int = MAX_PAYLOAD_BYTES) -> bytes:
    """msgpack bytes of `payload`, or `InvalidPayload` saying why it cannot be a payload."""
    packer = getattr(_packers, "packer", None)
    if packer is None:
        packer = _packers.packer = msgpack.Packer(use_bin_type=True)
    try:
        data: bytes = packer.pack(payload)  # on failure the packer resets its buffer
    except (TypeError, ValueError, OverflowError) as exc:
        raise InvalidPayload(
            f"payload cannot be encoded as msgpack ({exc}); use dicts, lists, str, bytes, int, float, bool and None"
        ) from None
    if len(data) > max_bytes:
        raise InvalidPayload(
            f"payload is {len(data)} bytes encoded, over the {max_bytes}-byte limit; "
            "store large data elsewhere and pass a reference"
        )
    return data


_packers = threading.local()
"""One msgpack Packer per thread: `packb` makes a new one per call, a third of its cost."""


def decode_payload(data: bytes) -> Any:
    return msgpack.unpackb(data, raw=False)


@dataclass(frozen=True, slots=True)
class Task:
    """One unit of work as stored and as fired. `payload` holds msgpack bytes.

    `run_at_ms` equals `id.run_at_ms` for a first attempt; a retry is the same task
    (same id) stored again at a later `run_at_ms` with `attempt + 1`. `cost` is how many
    units of its tenant's rate limit the task uses (see the module docstring); it is the
    last field so that tasks built from positional fields need not name it.
    """

    id: TaskId
    tenant: str
    type: str
    payload: bytes
    run_at_ms: int
    priority: Priority = Priority.NORMAL
    attempt: int = 1
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    idempotency_key: str | None = None
    cost: int = 1

    def __post_init__(self) -> None:
        check_name("tenant", self.tenant)
        check_name("type", self.type)
        if not isinstance(self.payload, bytes):
            raise InvalidTask("Task.payload holds msgpack bytes; encode with encode_payload()")
        check_run_at_ms(self.run_at_ms)
        if not isinstance(self.priority, Priority):
            raise InvalidTask(f"priority must be a Priority, got {self.priority!r}")
        if not valid_max_attempts(self.max_attempts):
            raise InvalidTask(f"max_attempts must be an integer from 1 to {MAX_ATTEMPTS_LIMIT}, got {self.max_attempts!r}")
        if not isinstance(self.attempt, int) or not 1 <= self.attempt <= self.max_attempts:
            raise InvalidTask(f"attempt must be from 1 to max_attempts ({self.max_attempts}), got {self.attempt!r}")
        if self.idempotency_key is not None and (not isinstance(self.idempotency_key, str) or not self.idempotency_key):
            raise InvalidTask("an idempotency key, when given, must be a non-empty string")
        check_cost(self.cost)

    @classmethod
    def unchecked(
        cls,
        id: TaskId,
        tenant: str,
        type: str,
        payload: bytes,
        run_at_ms: int,
        priority: Priority,
        attempt: int,
        max_attempts: int,
        idempotency_key: str | None,
        cost: int = 1,
    ) -> Task:
        """A task from fields its caller has already checked, without checking them again.

        Only for the producer's hot path, which checks every field item by item with
        its own, more specific messages; a property test holds the two sets of checks
        to the same verdicts.
        """
        task = object.__new__(cls)
        assign = object.__setattr__
        assign(task, "id", id)
        assign(task, "tenant", tenant)
        assign(task, "type", type)
        assign(task, "payload", payload)
        assign(task, "run_at_ms", run_at_ms)
        assign(task, "priority", priority)
        assign(task, "attempt", attempt)
        assign(task, "max_attempts", max_attempts)
        assign(task, "idempotency_key", idempotency_key)
        assign(task, "cost", cost)
        return task

    @property
    def run_at(self) -> datetime:
        return from_ms(self.run_at_ms)

    @property
    def minute_bucket(self) -> int:
        return minute_bucket(self.run_at_ms)

    def partition(self, shard_count: int = DEFAULT_SHARD_COUNT) -> Partition:
        return Partition(self.minute_bucket, self.id.shard(shard_count))


def check_in_partition(tasks: Iterable[Task], partition: Partition, shard_count: int) -> None:
    """`ValueError` unless every task belongs to `partition` (fenced writes are per partition)."""
    for task in tasks:
        if task.partition(shard_count) != partition:
            raise ValueError(f"task {task.id} belongs to {task.partition(shard_count)}, not {partition}")


MESSAGE_VERSION = 1


class Message(NamedTuple):
    """What a dispatcher publishes: the task and the fencing token of the shard lease
    under which it was fired, so a worker can drop work from a fenced-out publisher.
    (A named tuple: a worker decodes one per task.)"""

    task: Task
    fence: int


MESSAGE_ID_SLICE = slice(4, 20)
"""Where an encoded message holds the task id's 16 bytes (after the array header, the
version and the bin header), so a dispatcher can check an id without decoding. The
array header is one byte for both the 11- and the 12-field form."""


def encode_message(task: Task, fence: int) -> bytes:
    """The queue message for `task` fired under `fence`: a msgpack array, ~30 bytes plus
    the tenant, type, key and payload. `run_at` travels as its distance from the time
    the id carries, which is 0 (one byte) for every first attempt.

    The fields, in order: version, id (16 bytes), tenant, type, priority code, run_at
    delta (ms), attempt, max_attempts, fence, idempotency key (or nil), payload, and,
    only when it is not 1, the cost. A task of cost 1 is thus the 11-field message it
    was before tasks had a cost, byte for byte, and a cost costs 1 to 5 bytes."""
    fields: list[object] = [
        MESSAGE_VERSION,
        task.id.bytes,
        task.tenant,
        task.type,
        task.priority.code,
        task.run_at_ms - task.id.run_at_ms,  # 0 for a first attempt: one byte, not nine
        task.attempt,
        task.max_attempts,
        fence,
        task.idempotency_key,
        task.payload,
    ]
    if task.cost != 1:
        fields.append(task.cost)
    message: bytes = msgpack.packb(fields, use_bin_type=True)
    return message


def decode_message(data: bytes) -> Message:
    """The message in `data`, or `InvalidMessage` with a reason fit for a dead letter."""
    try:
        fields = msgpack.unpackb(data, raw=False, use_list=True)
    except Exception as exc:  # msgpack raises several unrelated types on garbage
        raise InvalidMessage(f"message is not msgpack: {exc}") from None
    if not isinstance(fields, list) or not fields:
        raise InvalidMessage("message is not a msgpack array")
    if fields[0] != MESSAGE_VERSION:
        raise InvalidMessage(f"unsupported message version {fields[0]!r} (this worker reads {MESSAGE_VERSION})")
    if len(fields) == 11:
        cost = 1
    elif len(fields) == 12:
        cost = fields.pop()
    else:
        raise InvalidMessage(f"message has {len(fields)} fields, expected 11 (or 12 with a cost)")
    _, id_bytes, tenant, type_, priority, run_at_delta, attempt, max_attempts, fence, key, payload = fields
    if not isinstance(id_bytes, bytes) or not isinstance(payload, bytes) or not isinstance(fence, int) \
            or not isinstance(run_at_delta, int):
        raise InvalidMessage("message fields have the wrong types (id, payload, run_at or fence)")
    # The checks of `Task.__post_init__`, inline: this runs for every task a worker takes,
    # and the dataclass's checks cost more than the rest of the decode together.
    try:
        task_id = TaskId.from_bytes(id_bytes)
    except InvalidTask as exc:
        raise InvalidMessage(f"message holds an invalid task: {exc}") from None
    code = _PRIORITIES_BY_CODE.get(priority) if isinstance(priority, int) else None
    run_at_ms = task_id.run_at_ms + run_at_delta
    if not valid_name(tenant) or not valid_name(type_) or code is None \
            or not valid_max_attempts(max_attempts) or not isinstance(attempt, int) \
            or not 1 <= attempt <= max_attempts or not 0 <= run_at_ms <= _MAX_RUN_AT_MS \
            or (key is not None and (not isinstance(key, str) or not key)) or not valid_cost(cost):
        try:  # say exactly what is wrong, through the checked constructor
            Task(task_id, tenant, type_, payload, run_at_ms, Priority.from_code(priority), attempt, max_attempts, key,
                 cost)
        except InvalidTask as exc:
            raise InvalidMessage(f"message holds an invalid task: {exc}") from None
        raise InvalidMessage("message holds an invalid task")  # pragma: no cover - the two checks agree
    return Message(
        Task.unchecked(task_id, tenant, type_, payload, run_at_ms, code, attempt, max_attempts, key, cost), fence
    )


def peek_release_fields(data: bytes) -> tuple[str, int, int]:
    """`(tenant, priority code, cost)` of an encoded message, for a dispatcher deciding
    whether to release it under its tenant's rate limit, without building the task.

    It unpacks the whole message in msgpack's C code: ~0.5 µs for a 100-byte message
    (timeit). Picking the tenant and priority out at their offsets in Python saves
    ~0.15 µs, and only for a message of cost 1: the cost comes after the payload, and
    finding it means reading every field before it. The price grows with the payload,
    which is copied: ~2 µs for a 64 KiB one. Only these three fields are checked: other
    bytes are `InvalidMessage`, but a message read here may still fail `decode_message`.
    """
    try:
        fields = msgpack.unpackb(data, raw=False, use_list=False)
    except Exception as exc:  # msgpack raises several unrelated types on garbage
        raise InvalidMessage(f"message is not msgpack: {exc}") from None
    # Exact types (msgpack makes no subclasses), which also refuse a bool for an int.
    if type(fields) is tuple and (len(fields) == 11 or len(fields) == 12) and fields[0] == MESSAGE_VERSION:
        tenant, priority = fields[2], fields[4]
        cost = 1 if len(fields) == 11 else fields[11]
        if type(tenant) is str and tenant and type(priority) is int and priority in _PRIORITIES_BY_CODE \
                and (len(fields) == 11 or valid_cost(cost)):
            return tenant, priority, cost
    raise InvalidMessage(f"not a version-{MESSAGE_VERSION} message with a valid tenant, priority and cost")
