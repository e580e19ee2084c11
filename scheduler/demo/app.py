"""The worker application of `scheduler demo`: `scheduler worker --app scheduler.demo.app:app`.

Two task types, both sending through the fake provider (`gateway.py`, the file named
by `SCHEDULER_DEMO_GATEWAY`):

- `result_sms`: one task carries a batch of result messages (500 by default); they go
  out in requests of `REQUEST_SIZE`, each message keyed by `ctx.effect_key`, so a batch
  re-run after a worker dies resends only into the provider's deduplication.
- `reminder`: one exam reminder.

Retries back off from half a second, so the demo's doomed task reaches the dead-letter
list within seconds rather than minutes.
"""

from __future__ import annotations

import os
from typing import Any

from scheduler.worker import App, Context, PermanentError

from .gateway import Gateway, Sms, Start, now_ms

GATEWAY_ENV = "SCHEDULER_DEMO_GATEWAY"
REQUEST_SIZE = 50

app = App("results-day", backoff_base_s=0.5, backoff_cap_s=2)

_gateway: Gateway | None = None


def gateway() -> Gateway:
    global _gateway
    if _gateway is None:
        path = os.environ.get(GATEWAY_ENV)
        if not path:
            raise PermanentError(f"{GATEWAY_ENV} is not set: the demo's workers need the gateway file")
        _gateway = Gateway(path)
    return _gateway


def _note(ctx: Context) -> None:
    gateway().note_start(Start(str(ctx.task_id), ctx.attempt, ctx.tenant, ctx.type, ctx.run_at_ms, now_ms(),
                               os.getpid()))


def _messages(ctx: Context, payload: Any) -> list[Sms]:
    try:
        return [Sms(ctx.effect_key(f"sms:{m['to']}"), ctx.tenant, str(m["to"]), str(m["text"]))
                for m in payload["messages"]]
    except (KeyError, TypeError) as error:
        raise PermanentError(f"malformed payload: {error!r}") from None


@app.handler("result_sms", max_attempts=3, timeout_s=30)
def send_results(ctx: Context, payload: Any) -> None:
    _note(ctx)
    messages = _messages(ctx, payload)
    for start in range(0, len(messages), REQUEST_SIZE):
        gateway().send(messages[start:start + REQUEST_SIZE])


@app.handler("reminder", max_attempts=3, timeout_s=10)
def send_reminder(ctx: Context, payload: Any) -> None:
    _note(ctx)
    try:
        message = Sms(ctx.effect_key("sms"), ctx.tenant, str(payload["to"]), str(payload["text"]))
    except (KeyError, TypeError) as error:
        raise PermanentError(f"malformed payload: {error!r}") from None
    gateway().send([message])  # GatewayError: retried with backoff, then dead-lettered
