"""The application the workflows bench runs: `scheduler worker --app bench.workflow_app:app`,
and the counting of store calls it does in every process that imports it.

One handler, `step`, for every step of the bench's workflows: it does nothing and
returns None (no result is stored), so what a run measures is the workflow machinery
around it: the check before a step starts, the member's end recorded, the successors
worked out and created, the status written.

Store calls: with `BENCH_WORKFLOW_CALLS=DIR` in its environment, importing this module
wraps the methods of both backends' task stores and workflow stores (`install`) so that
each call is counted, by method: calls, and the items it carried (the tasks of an
`insert`, the reports of a `record_status`, the ids of a `get_many`) or, for a read of
many rows, the rows it returned (`members`, `results`, `claims`). The counts are
written to `DIR/calls-<pid>.json` every half second when they changed, and when the
process exits (SIGTERM makes `scheduler worker` drain and return normally). The bench
calls `install` in its own process too, to count what a submit writes. Counting is a
dict update under a lock, well under a microsecond a call.
"""

from __future__ import annotations

import atexit
import json
import os
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from scheduler.worker import App, Context

CALLS_ENV = "BENCH_WORKFLOW_CALLS"
DUMP_INTERVAL_S = 0.5

app = App("workflow-bench")


@app.handler("step")
def step(ctx: Context, payload: Any) -> None:
    """A step that does nothing: its workflow's machinery is what is measured."""
    return None


# What is counted: (kind, what its items are). "arg": the length of the first argument
# (a batch); "result": the length of what it returned (rows read); None: calls only.
TASK_STORE_METHODS: dict[str, tuple[str, str | None]] = {
    "insert": ("write", "arg"),
    "record_status": ("write", "arg"),
    "write_fenced": ("write", None),
    "advance_shard": ("write", None),
    "take_shard": ("write", None),
    "cancel": ("write", None),
    "get_many": ("read", "arg"),
    "statuses": ("read", "arg"),
    "get": ("read", None),
    "read_partition": ("read", None),
    "count_partition": ("read", None),
    "count_buckets": ("read", None),
    "read_shard": ("read", None),
    "partition_fence": ("read", None),
    "read_cancel_marks": ("read", None),
}
WORKFLOW_STORE_METHODS: dict[str, tuple[str, str | None]] = {
    "create": ("write", None),
    "record_member": ("write", None),
    "claim": ("write", None),
    "mark_created": ("write", None),
    "transition": ("write", None),
    "read": ("read", None),
    "start_check": ("read", None),
    "members": ("read", "result"),
    "members_at": ("read", "result"),
    "results": ("read", "result"),
    "claims": ("read", "result"),
}


class Calls:
    """Counts of store calls in this process: `{"task_store.insert": {"kind": "write",
    "calls": n, "items": m}, ...}`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, list[int]] = {}
        self._kinds: dict[str, str] = {}
        self.version = 0

    def add(self, name: str, kind: str, items: int) -> None:
        with self._lock:
            held = self._counts.get(name)
            if held is None:
                held = self._counts[name] = [0, 0]
                self._kinds[name] = kind
            held[0] += 1
            held[1] += items
            self.version += 1

    def snapshot(self) -> dict[str, dict[str, Any]]:
        with self._lock:
            return {name: {"kind": self._kinds[name], "calls": calls, "items": items}
                    for name, (calls, items) in sorted(self._counts.items())}


CALLS = Calls()
_installed: set[type] = set()


def _length(value: object) -> int:
    if isinstance(value, (str, bytes)):
        return 1
    try:
        return len(value)  # type: ignore[arg-type]
    except TypeError:
        return 1


def _wrap(cls: type, prefix: str, methods: dict[str, tuple[str, str | None]]) -> None:
    if cls in _installed:
        return
    _installed.add(cls)
    for method, (kind, items) in methods.items():
        original = getattr(cls, method, None)
        if original is None or not callable(original):
            continue
        setattr(cls, method, _counted(original, f"{prefix}.{method}", kind, items))


def _counted(original: Callable[..., Any], name: str, kind: str, items: str | None) -> Callable[..., Any]:
    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        if items == "arg":
            first: Sequence[Any] | None = args[0] if args else next(iter(kwargs.values()), None)
            CALLS.add(name, kind, 0 if first is None else _length(first))
        elif items == "result":
            CALLS.add(name, kind, 0 if result is None else _length(result))
        else:
            CALLS.add(name, kind, 1)
        return result

    counted.__name__ = getattr(original, "__name__", name)
    counted.__doc__ = getattr(original, "__doc__", None)
    return counted


def install() -> None:
    """Count every call of both backends' task and workflow stores in this process
    (idempotent). A call that raises is not counted."""
    from scheduler.adapters.cassandra.store import CassandraTaskStore
    from scheduler.adapters.cassandra.workflows import CassandraWorkflowStore
    from scheduler.adapters.embedded.store import SqliteTaskStore
    from scheduler.adapters.embedded.workflows import SqliteWorkflowStore

    _wrap(CassandraTaskStore, "task_store", TASK_STORE_METHODS)
    _wrap(SqliteTaskStore, "task_store", TASK_STORE_METHODS)
    _wrap(CassandraWorkflowStore, "workflow_store", WORKFLOW_STORE_METHODS)
    _wrap(SqliteWorkflowStore, "workflow_store", WORKFLOW_STORE_METHODS)


def calls_path(directory: Path, pid: int) -> Path:
    return directory / f"calls-{pid}.json"


def write_calls(directory: Path) -> None:
    """This process's counts into `directory/calls-<pid>.json`, atomically."""
    path = calls_path(directory, os.getpid())
    temporary = path.with_name(f"{path.name}.{threading.get_ident()}.tmp")
    temporary.write_text(json.dumps(CALLS.snapshot()))
    os.replace(temporary, path)


def _dump_forever(directory: Path) -> None:
    written = -1
    while True:
        time.sleep(DUMP_INTERVAL_S)
        version = CALLS.version
        if version != written:
            try:
                write_calls(directory)
            except OSError:
                continue
            written = version


def read_calls(directory: Path) -> dict[int, dict[str, dict[str, Any]]]:
    """Every process's counts found in `directory`, by pid."""
    found: dict[int, dict[str, dict[str, Any]]] = {}
    for path in sorted(directory.glob("calls-*.json")):
        try:
            found[int(path.stem.removeprefix("calls-"))] = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
    return found


if os.environ.get(CALLS_ENV):
    _directory = Path(os.environ[CALLS_ENV])
    install()
    threading.Thread(target=_dump_forever, args=(_directory,), name="bench-calls", daemon=True).start()
    atexit.register(write_calls, _directory)
