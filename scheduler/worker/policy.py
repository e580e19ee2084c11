"""What a worker does when a handler fails: the retry policy, and its backoff.

Policies are layered. A task carries its own `max_attempts` (the submitter's word, or
its client's default); a task type's policy, given when its handler is registered,
overrides the application's global policy field by field; a field left `None` falls
through to the next layer. A type policy's `max_attempts` can lower a task's attempts
(a type that must never repeat sets 1), never raise them: a retry copy is a `Task`,
whose attempt may not exceed the `max_attempts` it was submitted with.

Backoff uses "full jitter": the wait before attempt n+1 is uniform in
`[0, min(cap, base * 2**(n-1))]`. Thousands of tasks failing together (a provider
outage at 10:00) therefore retry spread over the whole window rather than in waves at
1 s, 2 s, 4 s; the expected wait still doubles per attempt. With `jitter="none"` the
wait is the window's upper end, for tests and for handlers that must wait at least
that long.

Worked example, base 1 s, cap 60 s: windows are 1, 2, 4, 8, 16, 32, 60, 60, ... s, so
attempt 4 starts between 0 and 4 s after attempt 3 failed (expected 2 s).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from typing import Literal

from scheduler.errors import ConfigError
from scheduler.model import MAX_RETRY_DELAY_S

Jitter = Literal["full", "none"]
POOLS = ("default", "long")


class PermanentError(Exception):
    """Raise from a handler for a failure no retry can fix (an invalid phone number): the
    task goes to the dead-letter topic at once, with this error as its reason."""


class RetryableError(Exception):
    """Raise from a handler to ask for a retry explicitly (every exception not declared
    permanent is retried anyway); `delay_s`, when given, replaces the backoff wait."""

    def __init__(self, message: str = "", *, delay_s: float | None = None) -> None:
        super().__init__(message)
        self.delay_s = delay_s


@dataclass(frozen=True)
class Policy:
    """One layer of policy; `None` means "as the layer below says"."""

    max_attempts: int | None = None
    backoff_base_s: float | None = None
    backoff_cap_s: float | None = None
    jitter: Jitter | None = None
    timeout_s: float | None = None
    """Longest a handler may run before the attempt counts as failed (retryable)."""
    retry_on: tuple[type[BaseException], ...] | None = None
    """Exception types worth retrying; any other exception is permanent. `None`: every
    exception except the permanent ones is retried."""
    permanent_on: tuple[type[BaseException], ...] | None = None
    """Exception types that are never retried (besides `PermanentError`)."""
    pool: str | None = None
    """`default` or `long`: which worker pool runs the type (route it to the `long` topic
    with the dispatcher's `--long-types`)."""

    def __post_init__(self) -> None:
        if self.max_attempts is not None and (not isinstance(self.max_attempts, int) or self.max_attempts < 1):
            raise ConfigError(f"max_attempts must be a positive integer, got {self.max_attempts!r}")
        for name in ("backoff_base_s", "backoff_cap_s", "timeout_s"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int | float) or value <= 0):
                raise ConfigError(f"{name} must be a positive number of seconds, got {value!r}")
        for name in ("backoff_base_s", "backoff_cap_s"):
            value = getattr(self, name)
            if value is not None and value > MAX_RETRY_DELAY_S:
                raise ConfigError(f"{name} may be at most {MAX_RETRY_DELAY_S:.0f} s (7 days), got {value!r}")
        if self.jitter is not None and self.jitter not in ("full", "none"):
            raise ConfigError(f"jitter must be 'full' or 'none', got {self.jitter!r}")
        if self.pool is not None and self.pool not in POOLS:
            raise ConfigError(f"pool must be one of {', '.join(POOLS)}, got {self.pool!r}")
        for name in ("retry_on", "permanent_on"):
            value = getattr(self, name)
            if value is not None and not all(isinstance(t, type) and issubclass(t, BaseException) for t in value):
                raise ConfigError(f"{name} must be a tuple of exception types, got {value!r}")

    def over(self, lower: Policy) -> Policy:
        """This layer laid over `lower`: each field this one leaves `None` comes from it."""
        return replace(lower, **{f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None})


DEFAULT_POLICY = Policy(
    max_attempts=None, backoff_base_s=1.0, backoff_cap_s=300.0, jitter="full", timeout_s=None,
    retry_on=None, permanent_on=(), pool="default",
)
"""The bottom layer: retry everything but `PermanentError`, 1 s doubling to 5 min."""


def attempts_allowed(task_max_attempts: int, policy: Policy) -> int:
    """The attempts a task gets: its own, lowered by the policy's `max_attempts` if set."""
    if policy.max_attempts is None:
        return task_max_attempts
    return min(task_max_attempts, policy.max_attempts)


def is_permanent(error: BaseException, policy: Policy) -> bool:
    """Whether `error` ends the task at once instead of being retried."""
    if isinstance(error, PermanentError):
        return True
    if isinstance(error, RetryableError):
        return False
    if policy.permanent_on and isinstance(error, policy.permanent_on):
        return True
    return policy.retry_on is not None and not isinstance(error, policy.retry_on)


def backoff_window_s(failed_attempt: int, policy: Policy) -> float:
    """The upper end of the wait after attempt `failed_attempt` (1-based) failed."""
    base = policy.backoff_base_s or DEFAULT_POLICY.backoff_base_s or 1.0
    cap = policy.backoff_cap_s or DEFAULT_POLICY.backoff_cap_s or base
    exponent = min(failed_attempt - 1, 62)  # 2**62 s is past any cap; avoids huge floats
    return float(min(cap, base * 2.0**exponent))


def backoff_s(failed_attempt: int, policy: Policy, uniform: Callable[[float, float], float] = random.uniform) -> float:
    """The wait before the next attempt: full jitter over the window (see the module)."""
    window = backoff_window_s(failed_attempt, policy)
    if policy.jitter == "none":
        return window
    return uniform(0.0, window)
