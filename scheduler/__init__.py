"""scheduler: a distributed task scheduler that never loses a task, fires on time and is fair between tenants."""

from scheduler.model import Priority, Task, TaskId

__all__ = ["Priority", "Task", "TaskId"]
__version__ = "0.1.0"
