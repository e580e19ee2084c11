"""`Context`: what a handler knows about the attempt it runs, and `once`, its guard
for side effects.

The scope of a key
------------------
`ctx.once(key, effect)` names an effect by `key` within a *scope*:

- `scope="task"` (the default): the effect of this task. A repeat or a retry of the
  same task (same task id, any attempt) skips it once it is done; another task with the
  same key runs it. So `ctx.once(f"sms:{payload['to']}", send)` sends each task's SMS
  once, and the next task for the same number sends its own.
- `scope="tenant"`, asked for explicitly: one effect per tenant and key, across all the
  tenant's tasks, for as long as the ledger keeps done records (the store's retention, 7
  days by default, and longer while the task that recorded it may still retry):
  e.g. `ctx.once(f"welcome:{user_id}", send_welcome, scope="tenant")` welcomes a user
  once, whichever task gets there first.

Any other scope is a `ValueError`. The ledger stores `(tenant, key string)` rows either
way (`EffectLedger` knows nothing of scopes): a task-scoped key is stored as
`@task/<task id>/<key>` (`TASK_KEY_PREFIX`), and a tenant-scoped key as given. The
task id has a fixed length, so two tasks' keys never meet, and a tenant-scoped key may
not start with `@task/` (a `ValueError`), so it never meets a task-scoped one.
(`ctx.effect_key(key)`, for a provider's own idempotency key, names the task's effect:
a tenant-scoped effect should hand the provider a key of the tenant's instead.)

What `once` guarantees, and what it cannot
------------------------------------------
Delivery is at least once: an attempt may run twice (a worker killed after the handler
returned but before its offset was committed; a message republished by a dispatcher
that lost its lease). `ctx.once(key, effect)` makes such a repeat skip the effects the
earlier run completed, through the effect ledger (`EffectLedger`):

1. claim `(tenant, ledger key)` in the ledger (the key in its scope, above), an atomic
   insert-if-absent that expires after the claim time (the handler's timeout, or
   `CLAIM_S`);
2. run `effect()`;
3. record the key as done; if the effect raised, drop the claim instead, so a retry can
   run it again.

- A repeat that finds the key done skips the effect: `once` returns `False`.
- Two copies running at the same moment do not both run it while the first one's claim
  holds: the second finds the claim taken (`EffectBusy`) and is tried again later as the
  same attempt (it costs no attempt). A claim holds for the handler's timeout plus 5 s,
  or `CLAIM_S` plus 5 s without one; an effect that outlasts its claim (a plain handler
  that ignores its timeout) can be run again by a copy that claims after it expired.
- **The gap that remains**: a worker that dies after step 2 and before step 3 leaves an
  effect that happened but a claim that is not done. When the claim expires, the next
  attempt runs the effect again. The ledger narrows the window to the time between the
  effect's return and one ledger write (about a millisecond), it cannot close it: no
  store can commit atomically with an SMS gateway. For an effect that must never
  repeat, pass the effect key on to the provider as its own idempotency key as well
  (most SMS and payment APIs take one), which is what `ctx.effect_key(key)` is for.
- A worker that dies between steps 1 and 2 delays the effect by the claim time, it
  does not lose it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from scheduler.model import Task, TaskId
from scheduler.ports import EffectClaim, EffectLedger
from scheduler.retention import DEFAULT_RETENTION_S, effect_kept_s
from scheduler.worker.policy import RetryableError

if TYPE_CHECKING:
    from scheduler.workflows.steps import StepContext

T = TypeVar("T")

CLAIM_S = 60.0
"""How long a claim holds when the handler has no timeout."""

Scope = Literal["task", "tenant"]
"""Where an effect key of `Context.once` is unique: within one task, or within its tenant."""

TASK_KEY_PREFIX = "@task/"
"""Starts every task-scoped key in the ledger (`@task/<task id>/<key>`); reserved, so a
tenant-scoped key may not start with it."""


class EffectBusy(RetryableError):
    """Another attempt holds the claim on this effect right now; retried after a backoff."""


@dataclass
class Context:
    """The attempt a handler runs. `fence` is the lease token the task was published under."""

    task: Task
    fence: int
    ledger: EffectLedger | None = None
    claim_s: float = CLAIM_S
    worker: str = "worker"
    retention_s: int = DEFAULT_RETENTION_S
    """The store's retention: a done effect is kept at least that, and as long as this
    task's later attempts may still come (`scheduler.retention.effect_kept_s`)."""
    effects_run: int = field(default=0)
    effects_skipped: int = field(default=0)
    workflow: StepContext | None = None
    """For a workflow step: its workflow, step and index, and its predecessors' results
    (`scheduler.workflows.steps.StepContext`); None for any other task."""

    @property
    def task_id(self) -> TaskId:
        return self.task.id

    @property
    def attempt(self) -> int:
        return self.task.attempt

    @property
    def max_attempts(self) -> int:
        return self.task.max_attempts

    @property
    def tenant(self) -> str:
        return self.task.tenant

    @property
    def type(self) -> str:
        return self.task.type

    @property
    def idempotency_key(self) -> str | None:
        return self.task.idempotency_key

    @property
    def run_at_ms(self) -> int:
        """When this attempt was due."""
        return self.task.run_at_ms

    def effect_key(self, key: str) -> str:
        """A key naming effect `key` of this task, the same in every attempt: hand it to a
        provider that deduplicates requests (e.g. an SMS API's idempotency header)."""
        return f"{self.task.id}:{key}"

    def ledger_key(self, key: str, scope: Scope = "task") -> str:
        """The key under which `once(key, ..., scope=scope)` records its effect in the
        ledger, in this task's tenant (see "The scope of a key" in the module docstring).
        `ValueError` for an empty key, an unknown scope, or a tenant-scoped key that
        starts with the reserved `TASK_KEY_PREFIX`."""
        if not isinstance(key, str) or not key:
            raise ValueError(f"an effect key must be a non-empty string, got {key!r}")
        if scope == "task":
            return f"{TASK_KEY_PREFIX}{self.task.id}/{key}"
        if scope == "tenant":
            if key.startswith(TASK_KEY_PREFIX):
                raise ValueError(
                    f"a tenant-scoped effect key may not start with {TASK_KEY_PREFIX!r} (reserved for task-scoped "
                    f"keys), got {key!r}"
                )
            return key
        raise ValueError(
            f"ctx.once scope must be 'task' (once per task, the default) or 'tenant' (once per tenant and key, "
            f"across tasks), got {scope!r}"
        )

    def once(self, key: str, effect: Callable[[], T], *, scope: Scope = "task") -> bool:
        """Run `effect()` unless it is recorded as done under `key`; True if it ran.

        With `scope="task"` (the default) the record is this task's: a repeat or retry of
        this task skips the effect, another task with the same key runs its own. With
        `scope="tenant"` it is the tenant's: any later task of this tenant with the same
        key skips it, for the ledger's retention (the store's, 7 days by default, and
        longer while this task may still retry). See the module
        docstring for the scopes and for the guarantee."""
        ledger_key = self.ledger_key(key, scope)
        owner = self._claim(ledger_key, key)
        if owner is None:
            return False
        try:
            effect()
        except BaseException:
            self._release(ledger_key, owner)
            raise
        self._done(ledger_key, owner)
        return True

    async def once_async(self, key: str, effect: Callable[[], Awaitable[Any]], *, scope: Scope = "task") -> bool:
        """`once` for an `async def` handler, with the same scopes (`"task"` by default):
        `effect` returns an awaitable. The ledger's calls run on a thread, so the event
        loop keeps serving other tasks."""
        ledger_key = self.ledger_key(key, scope)
        owner = await asyncio.to_thread(self._claim, ledger_key, key)
        if owner is None:
            return False
        try:
            await effect()
        except BaseException:
            await asyncio.to_thread(self._release, ledger_key, owner)
            raise
        await asyncio.to_thread(self._done, ledger_key, owner)
        return True

    def _claim(self, ledger_key: str, key: str) -> str | None:
        """The owner name under which the claim is held, or None if the effect is done."""
        if self.ledger is None:
            raise RuntimeError("ctx.once needs the worker's effect ledger; this context has none")
        owner = f"{self.task.id}/{self.task.attempt}/{self.worker}"
        outcome = self.ledger.claim(self.task.tenant, ledger_key, owner, self.claim_s)
        if outcome is EffectClaim.DONE:
            self.effects_skipped += 1
            return None
        if outcome is EffectClaim.BUSY:
            raise EffectBusy(f"effect {key!r} is being run by another attempt right now")
        return owner

    def _done(self, ledger_key: str, owner: str) -> None:
        assert self.ledger is not None
        keep_s = effect_kept_s(self.retention_s, self.task.max_attempts - self.task.attempt)
        self.ledger.done(self.task.tenant, ledger_key, owner, keep_s)
        self.effects_run += 1

    def _release(self, ledger_key: str, owner: str) -> None:
        assert self.ledger is not None
        self.ledger.release(self.task.tenant, ledger_key, owner)
