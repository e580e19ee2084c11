"""Building tasks for tests with little ceremony."""

from __future__ import annotations

from typing import Any

from scheduler.model import Priority, Task, TaskId, encode_payload

NINE_OCLOCK_MS = 1_796_202_000_000
"""2026-12-02T09:00:00Z, on a minute boundary."""


def make_task(
    run_at_ms: int = NINE_OCLOCK_MS,
    *,
    tenant: str = "board",
    type: str = "sms",
    payload: Any = None,
    key: str | None = None,
    priority: Priority = Priority.NORMAL,
    attempt: int = 1,
    max_attempts: int = 5,
) -> Task:
    task_id = TaskId.for_key(run_at_ms, tenant, key) if key else TaskId.new(run_at_ms)
    return Task(
        id=task_id, tenant=tenant, type=type, payload=encode_payload(payload if payload is not None else {"n": 1}),
        run_at_ms=run_at_ms, priority=priority, attempt=attempt, max_attempts=max_attempts, idempotency_key=key,
    )


def in_partition(store_shards: int, bucket_ms: int, shard: int, count: int, *, tenant: str = "board") -> list[Task]:
    """`count` tasks that all fall in partition `(bucket_ms, shard)`, at distinct times."""
    found: list[Task] = []
    offset = 0
    while len(found) < count:
        task = make_task(bucket_ms + (offset * 7) % 60_000, tenant=tenant)
        offset += 1
        if task.id.shard(store_shards) == shard:
            found.append(task)
    return found
