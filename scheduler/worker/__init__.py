"""Workers: run the handlers of fired tasks. See `app` for the handler API, `runtime` for
how a worker consumes, settles and commits, and `context` for `ctx.once`."""

from scheduler.worker.app import App, Handler, load_app
from scheduler.worker.context import Context, EffectBusy
from scheduler.worker.policy import PermanentError, Policy, RetryableError

__all__ = ["App", "Context", "EffectBusy", "Handler", "PermanentError", "Policy", "RetryableError", "load_app"]
