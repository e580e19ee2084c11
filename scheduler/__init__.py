"""scheduler: a distributed task scheduler that never loses a task, fires on time and is fair between tenants.

The public API, all of it importable from here:

- producing: `connect()` gives a `Client` over the configured backend (see
  `scheduler.connecting`); `Client.submit` and `Client.submit_many` (with `Submission`s)
  store tasks, `get` and `cancel` find and cancel them by `TaskId`; a `Task` has a
  `Priority`;
- workflows: `Client.workflows.submit` stores a `Workflow` of `Step`s that follow each
  other, fan out and join (`scheduler.workflows`); `InvalidWorkflow` for a bad one;
- handling: an `App` registers the handlers that `scheduler worker --app` runs, and each
  handler gets a `Context`; a handler raises `PermanentError` for a failure no retry
  can mend;
- errors: every one derives from `SchedulerError`. `InvalidTask` (bad input, nothing
  written), `ConfigError` (a setting that cannot be used), `StoreError` (a write the
  store did not acknowledge), `StoreUnavailable` and `QueueUnavailable` (a server that
  does not answer), `HandoffFailed` (a task due soon that was stored but fires late).

Importing this package loads no driver: the adapters' drivers are imported only when a
backend is opened.
"""

from scheduler.connecting import connect
from scheduler.errors import (
    ConfigError,
    HandoffFailed,
    InvalidTask,
    QueueUnavailable,
    SchedulerError,
    StoreError,
    StoreUnavailable,
)
from scheduler.model import Priority, Task, TaskId
from scheduler.producer import Client, Submission
from scheduler.worker import App, Context, PermanentError
from scheduler.workflows import InvalidWorkflow, Step, Workflow

__all__ = [
    "App",
    "Client",
    "ConfigError",
    "Context",
    "HandoffFailed",
    "InvalidTask",
    "InvalidWorkflow",
    "PermanentError",
    "Priority",
    "QueueUnavailable",
    "SchedulerError",
    "Step",
    "StoreError",
    "StoreUnavailable",
    "Submission",
    "Task",
    "TaskId",
    "Workflow",
    "connect",
]
__version__ = "0.1.0"
