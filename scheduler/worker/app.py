"""`App`: where an application registers its task handlers, by task type.

    from scheduler.worker import App, Context, PermanentError

    app = App("results", backoff_cap_s=60)

    @app.handler("sms", max_attempts=3, timeout_s=10, permanent_on=(InvalidNumber,))
    def send_sms(ctx: Context, payload: dict) -> None:
        ctx.once(f"sms:{payload['to']}:{ctx.task_id}", lambda: provider.send(payload))

    @app.handler("report", pool="long")
    async def build_report(ctx: Context, payload: dict) -> None:
        ...

and run it with `scheduler worker --app results_app:app`. A handler gets a `Context`
and the decoded payload; it may be a plain function (run on the worker's threads) or
an `async def` (run on the worker's event loop). Returning ends the attempt as done;
raising ends it as failed (retried with backoff) or, for a permanent error, dead.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from scheduler.errors import ConfigError
from scheduler.worker.policy import DEFAULT_POLICY, Jitter, Policy

HandlerFunction = Callable[..., Any]


@dataclass(frozen=True)
class Handler:
    """A registered handler with its resolved policy (type layer over global layer)."""

    type: str
    function: HandlerFunction
    policy: Policy
    is_async: bool


class App:
    """A named set of handlers and the global policy layer they share."""

    def __init__(
        self,
        name: str = "app",
        *,
        max_attempts: int | None = None,
        backoff_base_s: float | None = None,
        backoff_cap_s: float | None = None,
        jitter: Jitter | None = None,
        timeout_s: float | None = None,
        retry_on: tuple[type[BaseException], ...] | None = None,
        permanent_on: tuple[type[BaseException], ...] | None = None,
    ) -> None:
        self.name = name
        self.policy = Policy(
            max_attempts=max_attempts, backoff_base_s=backoff_base_s, backoff_cap_s=backoff_cap_s,
            jitter=jitter, timeout_s=timeout_s, retry_on=retry_on, permanent_on=permanent_on,
        ).over(DEFAULT_POLICY)
        self._handlers: dict[str, Handler] = {}

    def handler(
        self,
        type: str,
        *,
        max_attempts: int | None = None,
        backoff_base_s: float | None = None,
        backoff_cap_s: float | None = None,
        jitter: Jitter | None = None,
        timeout_s: float | None = None,
        retry_on: tuple[type[BaseException], ...] | None = None,
        permanent_on: tuple[type[BaseException], ...] | None = None,
        pool: str | None = None,
    ) -> Callable[[HandlerFunction], HandlerFunction]:
        """Register the decorated function as the handler of task `type`, with the
        given fields of its policy (the rest from the app's)."""
        policy = Policy(
            max_attempts=max_attempts, backoff_base_s=backoff_base_s, backoff_cap_s=backoff_cap_s,
            jitter=jitter, timeout_s=timeout_s, retry_on=retry_on, permanent_on=permanent_on, pool=pool,
        )

        def register(function: HandlerFunction) -> HandlerFunction:
            self.register(type, function, policy)
            return function

        return register

    def register(self, type: str, function: HandlerFunction, policy: Policy | None = None) -> None:
        if not isinstance(type, str) or not type:
            raise ConfigError("a handler's task type must be a non-empty string")
        if type in self._handlers:
            raise ConfigError(f"task type {type!r} already has a handler ({self._handlers[type].function!r})")
        if not callable(function):
            raise ConfigError(f"the handler of {type!r} is not callable: {function!r}")
        resolved = (policy or Policy()).over(self.policy)
        self._handlers[type] = Handler(type, function, resolved, is_async(function))

    def handlers(self) -> list[Handler]:
        return list(self._handlers.values())

    def lookup(self, type: str) -> Handler | None:
        return self._handlers.get(type)

    def types(self, pool: str | None = None) -> list[str]:
        """Registered task types, sorted; only those of `pool` if given."""
        return sorted(t for t, h in self._handlers.items() if pool is None or h.policy.pool == pool)


def is_async(function: HandlerFunction) -> bool:
    """Whether calling `function` gives a coroutine: an `async def`, one behind a
    `functools.wraps` decorator, or an object whose `__call__` is `async def`. (The
    runtime also runs an awaitable that a plain-looking handler returns.)"""
    call = vars(type(function)).get("__call__")  # an instance's own async __call__, if any
    return any(inspect.iscoroutinefunction(candidate) for candidate in (function, inspect.unwrap(function), call))


def load_app(spec: str) -> App:
    """The `App` named by `module:attribute` (the module is imported), or `ConfigError`."""
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise ConfigError(f"--app {spec!r} should look like module:attribute, e.g. myproject.tasks:app")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # ImportError, or whatever the module raised while loading
        raise ConfigError(f"cannot import {module_name!r} for --app {spec!r}: "
                          f"{type(exc).__name__}: {exc}") from exc
    app = getattr(module, attribute, None)
    if not isinstance(app, App):
        raise ConfigError(f"{spec!r} is {type(app).__name__}, not a scheduler.worker.App")
    return app
