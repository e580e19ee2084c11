"""The scope of `ctx.once` keys, on the embedded effect ledger with a manual clock: by
default a key is the task's own (a repeat or retry of the task skips the effect, another
task runs its own); `scope="tenant"` makes it the tenant's, across tasks, for the
ledger's retention."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest

from scheduler.adapters.embedded.effects import SqliteEffectLedger
from scheduler.model import DEFAULT_MAX_ATTEMPTS, MAX_RETRY_DELAY_S, Task, TaskId, encode_payload
from scheduler.ports import EffectClaim
from scheduler.retention import effect_kept_s
from scheduler.settings import QUEUE_RETENTION_MS
from scheduler.worker.context import TASK_KEY_PREFIX, Context, EffectBusy

NINE_OCLOCK_MS = 1_796_202_000_000
RETENTION_S = 3600.0


class ManualClock:
    def __init__(self, now_ms: int) -> None:
        self.now_ms = now_ms

    def __call__(self) -> int:
        return self.now_ms


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(NINE_OCLOCK_MS)


@pytest.fixture
def ledger(clock: ManualClock) -> Iterator[SqliteEffectLedger]:
    opened = SqliteEffectLedger(":memory:", retention_s=RETENTION_S, clock_ms=clock)
    yield opened
    opened.close()


def new_task(tenant: str = "board") -> Task:
    return Task(TaskId.new(NINE_OCLOCK_MS), tenant, "sms", encode_payload({"to": "+919800000001"}), NINE_OCLOCK_MS)


def context(task: Task, ledger: SqliteEffectLedger, worker: str = "w1") -> Context:
    return Context(task=task, fence=1, ledger=ledger, worker=worker, retention_s=int(RETENTION_S))


class Sent:
    """The effect under test: counts the SMS it sends."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self) -> None:
        self.count += 1

    async def later(self) -> None:
        self.count += 1


def test_a_repeat_or_retry_of_the_same_task_skips_the_effect_by_default(ledger: SqliteEffectLedger) -> None:
    sent, task = Sent(), new_task()
    assert context(task, ledger).once("sms:+919800000001", sent) is True
    repeat = context(task, ledger, worker="w2")  # the same attempt redelivered to another worker
    assert repeat.once("sms:+919800000001", sent) is False
    retry = context(replace(task, attempt=2, run_at_ms=NINE_OCLOCK_MS + 5000), ledger)
    assert retry.once("sms:+919800000001", sent) is False
    assert sent.count == 1
    assert (repeat.effects_skipped, retry.effects_skipped) == (1, 1)


def test_two_tasks_with_the_same_key_both_run_their_effect_by_default(ledger: SqliteEffectLedger) -> None:
    sent = Sent()
    first, second = context(new_task(), ledger), context(new_task(), ledger)
    assert first.once("sms:+919800000001", sent) is True
    assert second.once("sms:+919800000001", sent) is True
    assert sent.count == 2
    assert (first.effects_run, second.effects_run, second.effects_skipped) == (1, 1, 0)


def test_a_tenant_scoped_key_runs_once_across_the_tenants_tasks_for_the_retention(
    ledger: SqliteEffectLedger, clock: ManualClock
) -> None:
    sent = Sent()
    assert context(new_task(), ledger).once("welcome:17", sent, scope="tenant") is True
    assert context(new_task(), ledger).once("welcome:17", sent, scope="tenant") is False
    assert context(new_task("college"), ledger).once("welcome:17", sent, scope="tenant") is True  # another tenant
    assert sent.count == 2
    kept_ms = effect_kept_s(int(RETENTION_S), DEFAULT_MAX_ATTEMPTS - 1) * 1000  # the recording task may retry
    clock.now_ms += kept_ms - 1
    assert context(new_task(), ledger).once("welcome:17", sent, scope="tenant") is False
    clock.now_ms += 1  # the done record's keep is over
    assert context(new_task(), ledger).once("welcome:17", sent, scope="tenant") is True
    assert sent.count == 3


@pytest.mark.parametrize("scope", ["task", "tenant"])
def test_a_retry_later_than_the_retention_still_skips_a_done_effect(
    ledger: SqliteEffectLedger, clock: ManualClock, scope: Any
) -> None:
    """Each retry of a task may wait up to 7 days (`RetryableError(delay_s=...)`) and then
    lie unfired or unconsumed for the queues' 7 days: its `once` records must outlive
    every attempt it has left, whatever the retention (here an hour)."""
    sent, task = Sent(), new_task()
    assert context(task, ledger).once("sms", sent, scope=scope) is True
    for attempt in range(2, task.max_attempts + 1):
        clock.now_ms += int(MAX_RETRY_DELAY_S * 1000) + QUEUE_RETENTION_MS
        retry = context(replace(task, attempt=attempt, run_at_ms=clock.now_ms), ledger)
        assert retry.once("sms", sent, scope=scope) is False, f"attempt {attempt} ran the effect again"
    clock.now_ms += QUEUE_RETENTION_MS  # the last attempt redelivered as late as it can be
    last = context(replace(task, attempt=task.max_attempts), ledger)
    assert last.once("sms", sent, scope=scope) is False
    assert sent.count == 1


def test_a_task_scoped_and_a_tenant_scoped_key_of_the_same_name_are_two_effects(ledger: SqliteEffectLedger) -> None:
    sent, ctx = Sent(), context(new_task(), ledger)
    assert ctx.once("sms", sent, scope="tenant") is True
    assert ctx.once("sms", sent) is True
    assert ctx.once("sms", sent) is False and ctx.once("sms", sent, scope="tenant") is False
    assert sent.count == 2
    assert ctx.ledger_key("sms") == f"{TASK_KEY_PREFIX}{ctx.task_id}/sms"
    assert ctx.ledger_key("sms", "tenant") == "sms"


@pytest.mark.parametrize("scope", ["global", "Task", "", None])
def test_an_unknown_scope_is_a_value_error_and_nothing_runs(ledger: SqliteEffectLedger, scope: Any) -> None:
    sent, ctx = Sent(), context(new_task(), ledger)
    with pytest.raises(ValueError, match=f"scope must be 'task' .* or 'tenant' .*, got {scope!r}"):
        ctx.once("sms", sent, scope=scope)
    with pytest.raises(ValueError, match="scope must be"):
        asyncio.run(ctx.once_async("sms", sent.later, scope=scope))
    assert sent.count == 0
    assert ctx.once("sms", sent) is True  # nothing was claimed


@pytest.mark.parametrize("key", ["", f"{TASK_KEY_PREFIX}sms"])
def test_an_empty_key_or_a_tenant_key_in_the_task_namespace_is_refused(ledger: SqliteEffectLedger, key: str) -> None:
    sent, ctx = Sent(), context(new_task(), ledger)
    with pytest.raises(ValueError, match="an effect key must be a non-empty string|may not start with '@task/'"):
        ctx.once(key, sent, scope="tenant")
    assert sent.count == 0


def test_a_failed_effect_releases_its_task_scoped_claim_so_a_retry_runs_it(ledger: SqliteEffectLedger) -> None:
    task, sent = new_task(), Sent()

    def failing() -> None:
        raise ConnectionError("gateway down")

    with pytest.raises(ConnectionError):
        context(task, ledger).once("sms", failing)
    assert context(replace(task, attempt=2), ledger).once("sms", sent) is True
    assert sent.count == 1


def test_a_task_scoped_effect_another_copy_is_running_is_busy(ledger: SqliteEffectLedger) -> None:
    sent, ctx = Sent(), context(new_task(), ledger)
    assert ledger.claim("board", ctx.ledger_key("sms"), "another-copy", 60) is EffectClaim.CLAIMED
    with pytest.raises(EffectBusy, match="'sms' is being run by another attempt"):
        ctx.once("sms", sent)
    assert context(new_task(), ledger).once("sms", sent) is True  # another task's "sms" is not held
    assert sent.count == 1


def test_once_async_has_the_same_scopes(ledger: SqliteEffectLedger) -> None:
    sent, task = Sent(), new_task()

    async def handler(ctx: Context, scope: Any = "task") -> bool:
        return await ctx.once_async("sms:+919800000001", sent.later, scope=scope)

    assert asyncio.run(handler(context(task, ledger))) is True
    assert asyncio.run(handler(context(replace(task, attempt=2), ledger))) is False  # the same task's retry
    assert asyncio.run(handler(context(new_task(), ledger))) is True  # another task
    assert asyncio.run(handler(context(new_task(), ledger), "tenant")) is True
    assert asyncio.run(handler(context(new_task(), ledger), "tenant")) is False
    assert sent.count == 3
