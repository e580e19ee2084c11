"""The application the worker benches run: `scheduler worker --app bench.worker_app:app`.

One handler, `sms`, that does nothing but note when it started: the task id, the
attempt and the wall-clock millisecond, appended to a list in memory (well under a
microsecond; no I/O, no lock beyond the GIL). When the process exits (SIGTERM makes
`scheduler worker` drain and return normally), the list is written to
`$BENCH_WORKER_RECORDS/handled-<pid>.bin`, one fixed-size record a handler start
(`RECORD`: 16-byte id, attempt, start ms), which `bench.nine.workers.read_records`
reads back. Without `BENCH_WORKER_RECORDS` the starts are counted and dropped. With
`BENCH_HANDLER_MS` the handler is `async` and then waits that long, as a send would.

A worker killed with SIGKILL writes nothing: the benches stop their workers with
SIGTERM, and report a worker that had to be killed.
"""

from __future__ import annotations

import asyncio
import atexit
import os
import struct
import time
from pathlib import Path
from typing import Any

from scheduler.worker import App, Context

RECORDS_ENV = "BENCH_WORKER_RECORDS"
RECORD = struct.Struct(">16sHq")
"""One handler start: task id (16 bytes, big-endian as `TaskId.bytes`), attempt, start ms."""

app = App("bench")

_starts: list[tuple[int, int, int]] = []
"""(task id value, attempt, start ms) of every handler start in this process."""


HANDLER_MS_ENV = "BENCH_HANDLER_MS"
"""Milliseconds each SMS takes, as a send to a provider would (0 or unset: none)."""

_handler_s = float(os.environ.get(HANDLER_MS_ENV) or 0) / 1000


if _handler_s > 0:
    @app.handler("sms")
    async def sms(ctx: Context, payload: Any) -> None:
        """An SMS that waits `BENCH_HANDLER_MS` without holding a thread, as an async
        client of a provider would: records its start, then sleeps."""
        task = ctx.task
        _starts.append((task.id.value, task.attempt, time.time_ns() // 1_000_000))
        await asyncio.sleep(_handler_s)
else:
    @app.handler("sms")
    def sms(ctx: Context, payload: Any) -> None:
        """A no-op SMS: records its start and returns."""
        task = ctx.task
        _starts.append((task.id.value, task.attempt, time.time_ns() // 1_000_000))


def record_path(directory: Path, pid: int) -> Path:
    return directory / f"handled-{pid}.bin"


def write_records() -> Path | None:
    """Write this process's handler starts to its file (atomically); the path, or None
    when no directory is configured."""
    directory = os.environ.get(RECORDS_ENV)
    if not directory:
        return None
    path = record_path(Path(directory), os.getpid())
    pack = RECORD.pack
    data = b"".join(pack(value.to_bytes(16), attempt, start_ms) for value, attempt, start_ms in _starts)
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_bytes(data)
    os.replace(temporary, path)
    return path


if os.environ.get(RECORDS_ENV):
    atexit.register(write_records)
