"""`Schedule`: what a recurring schedule is, checked once when it is made.

A schedule is named by its tenant and a name of the tenant's choosing; its id is a
hash of the two (`schedule_id`), so adding the same schedule twice finds the first.
Its shard (`schedule_shard`) is the murmur3 hash of the id mod the shard count, like a
task's: the dispatcher that holds that shard's lease creates the schedule's runs.

Every run is an ordinary task with the template's type, payload, priority and
attempts, of the schedule's tenant, with the idempotency key `run_key(id, slot)`: its
task id follows from `(tenant, key, run_at)` and `run_at` from the slot and the
jitter, so creating a run again writes the same row.
"""

from __future__ import annotations

import enum
import hashlib
import logging
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import mmh3
import msgpack

from scheduler.errors import InvalidSchedule, InvalidTask
from scheduler.model import MAX_ATTEMPTS_LIMIT, Priority, check_name, encode_payload, valid_max_attempts
from scheduler.recurring.cron import NEVER_MS, CronRule

MAX_NAME_CHARS = 200
MAX_JITTER_S = 24 * 3600
MAX_GRACE_S = 366 * 24 * 3600
"""Jitter spreads runs within their period; more than a day is a mistake."""
DEFAULT_GRACE_S = 60


class MisfirePolicy(enum.Enum):
    """What to create for slots that passed more than the grace window ago without a
    run (the scheduler was down, or the shard had no owner):

    - `once`: one catch-up run (for the first missed slot, due at once), then on;
    - `all`: a run for every missed slot, all due at once;
    - `skip`: none; the schedule continues with its next slot not yet past the grace.
    """

    ONCE = "once"
    ALL = "all"
    SKIP = "skip"

    @classmethod
    def parse(cls, value: str | MisfirePolicy) -> MisfirePolicy:
        if isinstance(value, MisfirePolicy):
            return value
        try:
            return cls(value)
        except ValueError:
            raise InvalidSchedule(
                f"unknown misfire policy {value!r}: use once (one catch-up run), all (every missed slot) "
                "or skip (no catch-up)"
            ) from None


@dataclass(frozen=True, slots=True)
class TaskTemplate:
    """The task each run is: `payload` holds msgpack bytes."""

    type: str
    payload: bytes
    priority: Priority = Priority.NORMAL
    max_attempts: int = 3

    def decoded_payload(self) -> Any:
        return msgpack.unpackb(self.payload, raw=False)


@dataclass(frozen=True, slots=True)
class Schedule:
    """A stored schedule. `next_slot_ms` is the first slot whose run has not been
    created; it only moves forward, by a conditional write (`ScheduleStore.advance`)."""

    tenant: str
    name: str
    cron: str
    zone: str
    template: TaskTemplate
    misfire: MisfirePolicy
    grace_s: int
    jitter_s: int
    next_slot_ms: int
    created_ms: int
    paused: bool = False
    skipped: int = 0
    """Slots left without a run because they were past the store's retention when the
    schedule reached them, or their run was refused (`scheduler.recurring.runner`)."""
    last_skipped_ms: int | None = None
    """The latest of those slots."""

    @property
    def id(self) -> uuid.UUID:
        return schedule_id(self.tenant, self.name)

    @property
    def rule(self) -> CronRule:
        return CronRule(self.cron, self.zone)

    def shard(self, shard_count: int) -> int:
        return schedule_shard(self.id, shard_count)


def schedule_id(tenant: str, name: str) -> uuid.UUID:
    """The id of the tenant's schedule `name` (a name-based UUID: the same pair, the same id)."""
    digest = hashlib.blake2b(msgpack.packb([tenant, name]), digest_size=16, person=b"sched.id").digest()
    return uuid.UUID(bytes=digest, version=5)


def schedule_shard(schedule: uuid.UUID, shard_count: int) -> int:
    return int(mmh3.hash(schedule.bytes, 0, signed=False)) % shard_count


def run_key(schedule: uuid.UUID, slot_ms: int) -> str:
    """The idempotency key of the run of `slot_ms`."""
    return f"schedule:{schedule}:{slot_ms}"


def new_schedule(
    *,
    tenant: str,
    name: str,
    cron: str,
    zone: str,
    type: str,
    payload: Any = None,
    priority: str | Priority = Priority.NORMAL,
    max_attempts: int = 3,
    misfire: str | MisfirePolicy = MisfirePolicy.ONCE,
    grace_s: int = DEFAULT_GRACE_S,
    jitter_s: int = 0,
    now_ms: int,
) -> Schedule:
    """A checked schedule whose first slot is the first one after `now_ms`, or
    `InvalidSchedule` saying what is wrong (nothing is stored here)."""
    for what, text in (("tenant", tenant), ("name", name), ("task type", type)):
        if not isinstance(text, str) or not text.strip():
            raise InvalidSchedule(f"a schedule needs a {what}: a non-empty string")
    if len(name) > MAX_NAME_CHARS:
        raise InvalidSchedule(f"a schedule name is at most {MAX_NAME_CHARS} characters, got {len(name)}")
    for what, text in (("tenant", tenant), ("type", type)):  # every run is a task with these: the task's rule
        try:
            check_name(what, text)
        except InvalidTask as exc:
            raise InvalidSchedule(str(exc)) from None
    rule = CronRule(cron, zone)
    policy = MisfirePolicy.parse(misfire)
    if isinstance(grace_s, bool) or not isinstance(grace_s, int) or not 0 <= grace_s <= MAX_GRACE_S:
        raise InvalidSchedule(
            f"the grace window is a whole number of seconds from 0 to {MAX_GRACE_S} (366 days), got {grace_s!r}")
    if isinstance(jitter_s, bool) or not isinstance(jitter_s, int) or not 0 <= jitter_s <= MAX_JITTER_S:
        raise InvalidSchedule(
            f"jitter is a whole number of seconds from 0 to {MAX_JITTER_S}, got {jitter_s!r}"
        )
    if not valid_max_attempts(max_attempts):
        raise InvalidSchedule(f"max attempts must be an integer from 1 to {MAX_ATTEMPTS_LIMIT}, got {max_attempts!r}")
    try:
        parsed_priority = Priority.parse(priority)
        encoded = encode_payload(payload)
    except InvalidTask as exc:
        raise InvalidSchedule(str(exc)) from None
    first = rule.next_slot(now_ms)
    if first >= NEVER_MS:
        raise InvalidSchedule(f"cron expression {cron!r} never matches a time in the next 50 years")
    return Schedule(
        tenant=tenant, name=name, cron=rule.expression, zone=zone,
        template=TaskTemplate(type, encoded, parsed_priority, max_attempts),
        misfire=policy, grace_s=grace_s, jitter_s=jitter_s, next_slot_ms=first, created_ms=now_ms,
    )


R = TypeVar("R", bound=Sequence[Any])


def readable(rows: Iterable[R], parse: Callable[[R], Schedule], log: logging.Logger) -> list[Schedule]:
    """The stored rows parsed as schedules, leaving out (and logging) any this version
    cannot read, so one bad row (e.g. written by a newer version) does not stop the
    others. A row starts with (tenant, name)."""
    found = []
    for row in rows:
        try:
            found.append(parse(row))
        except (ValueError, TypeError, KeyError, InvalidSchedule) as exc:
            tenant, name = row[0], row[1]
            log.error("skipping schedule %r of tenant %r: its row cannot be read (%s: %s)", name, tenant,
                      type(exc).__name__, exc, extra={"action": "schedule_unreadable"})
    return found
