"""The application `bench/cancels.py` runs: `scheduler worker --app bench.cancel_app:app`.

One handler, `flaky`, that notes when it starts (one line, `<task id> <attempt>
<wall-clock ns>`, appended with a single `write` to `$BENCH_CANCEL_STARTS/starts-<pid>.txt`,
so a start is on disk before the handler goes on, whatever kills the process later),
then fails with a retry due `BENCH_RETRY_MS` (default 300) later: every attempt fails,
so each task retries until it is cancelled.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from scheduler.worker import App, Context, RetryableError

STARTS_ENV = "BENCH_CANCEL_STARTS"
RETRY_MS_ENV = "BENCH_RETRY_MS"

app = App("cancels", backoff_base_s=0.1, backoff_cap_s=1.0)

_retry_s = float(os.environ.get(RETRY_MS_ENV) or 300) / 1000
_fd: int | None = None


def _starts_fd() -> int | None:
    global _fd
    directory = os.environ.get(STARTS_ENV)
    if _fd is None and directory:
        _fd = os.open(Path(directory) / f"starts-{os.getpid()}.txt", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    return _fd


@app.handler("flaky", max_attempts=100)
def flaky(ctx: Context, payload: Any) -> None:
    fd = _starts_fd()
    if fd is not None:
        os.write(fd, f"{ctx.task.id} {ctx.task.attempt} {time.time_ns()}\n".encode())
    raise RetryableError("the provider is busy", delay_s=_retry_s)


def read_starts(directory: Path) -> list[tuple[str, int, int]]:
    """Every start the workers wrote under `directory`: (task id, attempt, wall-clock ns)."""
    starts = []
    for path in sorted(directory.glob("starts-*.txt")):
        for line in path.read_text().splitlines():
            task_id, attempt, at_ns = line.split()
            starts.append((task_id, int(attempt), int(at_ns)))
    return starts
