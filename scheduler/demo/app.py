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
from .story import Story

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


def _messages(ctx: Context, messages: Any) -> list[Sms]:
    try:
        return [Sms(ctx.effect_key(f"sms:{m['to']}"), ctx.tenant, str(m["to"]), str(m["text"])) for m in messages]
    except (KeyError, TypeError) as error:
        raise PermanentError(f"malformed payload: {error!r}") from None


@app.handler("render_results", max_attempts=3, timeout_s=30)
def render_results(ctx: Context, payload: Any) -> dict[str, int]:
    _note(ctx)
    try:
        return {"batch": int(payload["batch"]), "size": int(payload["size"])}
    except (KeyError, TypeError, ValueError) as error:
        raise PermanentError(f"malformed payload: {error!r}") from None


@app.handler("result_sms", max_attempts=3, timeout_s=30)
def send_results(ctx: Context, payload: Any) -> dict[str, int]:
    """A workflow's send step: the batch its render returned. A plain task (an older
    demo's) carries its messages."""
    _note(ctx)
    if ctx.workflow is None:
        messages = _messages(ctx, payload.get("messages") if isinstance(payload, dict) else None)
        batch = -1
    else:
        rendered = ctx.workflow.input
        try:
            story = Story(**payload["story"])
            batch = int(rendered["batch"])
        except (KeyError, TypeError, ValueError) as error:
            raise PermanentError(f"malformed payload or render result: {error!r}") from None
        messages = _messages(ctx, story.batch_messages(batch))
    for start in range(0, len(messages), REQUEST_SIZE):
        gateway().send(messages[start:start + REQUEST_SIZE])
    return {"batch": batch, "sent": len(messages)}


@app.handler("delivery_report", max_attempts=3, timeout_s=10)
def delivery_report(ctx: Context, payload: Any) -> None:
    _note(ctx)
    if ctx.workflow is None:
        raise PermanentError("a delivery report is a step of the results-day workflow")
    sends = ctx.workflow.results("send")
    total = sum(int(sent["sent"]) for sent in sends if sent)
    gateway().send([Sms(ctx.effect_key("sms"), ctx.tenant, str(payload["to"]),
                        f"Results day: {total:,} result SMS sent in {len(sends)} batches")])


@app.handler("reminder", max_attempts=3, timeout_s=10)
def send_reminder(ctx: Context, payload: Any) -> None:
    _note(ctx)
    try:
        message = Sms(ctx.effect_key("sms"), ctx.tenant, str(payload["to"]), str(payload["text"]))
    except (KeyError, TypeError) as error:
        raise PermanentError(f"malformed payload: {error!r}") from None
    gateway().send([message])  # GatewayError: retried with backoff, then dead-lettered
