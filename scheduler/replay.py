"""Replaying dead letters: each chosen letter submitted again as a new task, due now,
with a fresh series of attempts, and a marker appended to the dead-letter topic so the
letter is no longer listed (`scheduler.worker.dead_letters`). `scheduler dlq replay`
and the status page's replay button both come here.

The new task is submitted first and the marker appended after (tried `MARKER_TRIES`
times): a failure in between leaves a task and a letter still listed, which is said
("replayed as X, but still listed: do not replay it again"), rather than a letter
marked and no task. Within one process replays are serialised, so a letter clicked
twice is replayed once. Two processes replaying the same letter at the same moment can
both submit it (each reads the topic before the other's marker lands): the letter
then runs twice.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime

from scheduler.errors import SchedulerError
from scheduler.model import Task, TaskId, decode_message, decode_payload, to_ms
from scheduler.ports import Publisher, TopicScanner
from scheduler.producer import Client
from scheduler.worker.dead_letters import DeadLetter, Replayed, encode_replayed, waiting
from scheduler.workflows.definition import KEY_PREFIX as STEP_KEY_PREFIX

_lock = threading.Lock()
MARKER_TRIES = 3
NO_SUCH_LETTER = "no such waiting letter (already replayed, or never there)"


@dataclass(frozen=True)
class ReplayOutcome:
    letter: str
    new_task_id: TaskId | None
    """The new task's id; None when nothing was submitted (see `problem`), or in a dry run."""
    problem: str | None = None
    letter_info: DeadLetter | None = None

    @property
    def ok(self) -> bool:
        return self.problem is None


def replay(client: Client | None, scanner: TopicScanner, publisher: Publisher, topic: str, names: Iterable[str] = (), *,
           every: bool = False, tenant: str | None = None, type_: str | None = None,
           dry_run: bool = False) -> list[ReplayOutcome]:
    """Replay the letters named (`partition:offset`), or with `every` all waiting letters
    of `tenant`/`type_` (None: any). One outcome per letter, in order. `client` submits
    the new tasks: one from `scheduler.connect`, so they are counted as submitted (None
    only for a `dry_run`)."""
    with _lock:
        letters, _, _ = waiting(scanner.scan(topic))
        by_name = {letter.letter: letter for letter in letters}
        if every:
            chosen: list[DeadLetter | str] = [letter for letter in letters
                                              if (tenant is None or letter.tenant == tenant)
                                              and (type_ is None or letter.type == type_)]
        else:
            chosen = [by_name.get(name, name) for name in dict.fromkeys(names)]  # a name given twice: once
        outcomes = []
        for letter in chosen:
            if isinstance(letter, str):
                outcomes.append(ReplayOutcome(letter, None, NO_SUCH_LETTER))
                continue
            outcomes.append(_replay_one(client, publisher, topic, letter, dry_run))
        return outcomes


def _replay_one(client: Client | None, publisher: Publisher, topic: str, letter: DeadLetter,
                dry_run: bool) -> ReplayOutcome:
    try:
        task = decode_message(letter.message).task
        payload = decode_payload(task.payload)
    except Exception as exc:  # InvalidMessage, or whatever msgpack raises on a bad payload
        return ReplayOutcome(letter.letter, None, f"cannot be replayed, its message is unreadable: {exc}", letter)
    if dry_run or client is None:
        return ReplayOutcome(letter.letter, None, None, letter)
    now = datetime.now(UTC)  # explicit: a keyed task needs one, and it names the new task
    try:
        if task.idempotency_key is not None and task.idempotency_key.startswith(STEP_KEY_PREFIX):
            # A workflow's step: the same key, due now, stored as the workflow stores its
            # steps (the producer refuses such keys from anyone else); its end opens the
            # workflow again (scheduler.workflows.engine).
            now_ms = to_ms(now)
            new_id = TaskId.for_key(now_ms, task.tenant, task.idempotency_key)
            client.store_tasks([Task.unchecked(new_id, task.tenant, task.type, task.payload, now_ms, task.priority, 1,
                                               task.max_attempts, task.idempotency_key, task.cost)])
        else:
            new_id = client.submit(task.type, payload, tenant=task.tenant, priority=task.priority, run_at=now,
                                   idempotency_key=task.idempotency_key, max_attempts=task.max_attempts,
                                   cost=task.cost)
    except SchedulerError as exc:
        return ReplayOutcome(letter.letter, None, f"not replayed: {exc}", letter)
    marker = encode_replayed(Replayed(letter.letter, new_id, time.time_ns() // 1_000_000))
    failure: Exception | None = None
    for _ in range(MARKER_TRIES):
        try:
            publisher.publish(topic, [marker])
            publisher.flush(30.0)
            return ReplayOutcome(letter.letter, new_id, None, letter)
        except SchedulerError as exc:
            failure = exc
    return ReplayOutcome(letter.letter, new_id, f"replayed as {new_id}, but the marker could not be written "
                         f"({failure}), so the letter is still listed: do not replay it again", letter)
