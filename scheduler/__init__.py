"""scheduler: a distributed task scheduler that never loses a task, fires on time and is fair between tenants.

`connect()` gives a producer `Client` over the configured backend (see `scheduler.connecting`).
"""

from scheduler.connecting import connect
from scheduler.model import Priority, Task, TaskId
from scheduler.producer import Client, Submission

__all__ = ["Client", "Priority", "Submission", "Task", "TaskId", "connect"]
__version__ = "0.1.0"
