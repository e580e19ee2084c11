"""The application the worker tests run, in-process or as `scheduler worker --app
tests.worker.apps:app` processes, and the sink its handlers report to.

The sink is a SQLite file named by `SCHEDULER_TEST_SINK` (or `Sink(path)`), shared by
every worker process of a test: it records each handler start (task, attempt, when,
which process) and each effect, so a test can count what ran and how often, across
kills. Behaviour is chosen by the payload:

    {"mode": "ok"}                      return at once
    {"mode": "sleep", "s": 0.2}         sleep, then return
    {"mode": "fail"}                    raise a retryable error (every attempt)
    {"mode": "permanent"}               raise a permanent error
    {"mode": "permanent_once", "marker": P}  the first run creates file P and raises a
                                        permanent error; later runs return
    {"mode": "wait_for", "path": P}     wait (up to 60 s) until file P exists
    {"mode": "block_once", "marker": P} the first run creates file P and blocks for
                                        minutes (to be killed); later runs return
    {"effect": "k"}                     with any mode that returns: ctx.once("k", ...)
                                        records one effect in the sink
    {"effect": "k", "scope": "tenant"}  the same with ctx.once("k", ..., scope="tenant")

The `fair` handler records a span per run (tenant, cost, start, end), so a test can
measure how many of a tenant's tasks ran at once, and when they started.

The `step` handler is for workflow steps: it behaves as above and returns a result,
`{"step", "index", "input"}` plus, for a join, `"joined"`: how many results of the steps
it waited for it read. With `SCHEDULER_TEST_CRASH_AFTER_STEP_END=P` in its environment,
the worker process kills itself (SIGKILL) the first time a step's end has been recorded
and nothing has followed from it yet, creating file P first: a crash at exactly the
point between a step's end and its successor's creation.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

from scheduler.worker import App, Context, PermanentError


class Sink:
    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.path, timeout=30, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("CREATE TABLE IF NOT EXISTS runs (task TEXT, attempt INT, type TEXT, started_ms INT, "
                         "run_at_ms INT, pid INT, fence INT)")
        self._db.execute("CREATE TABLE IF NOT EXISTS effects (key TEXT, task TEXT, attempt INT, pid INT)")
        self._db.execute("CREATE TABLE IF NOT EXISTS spans (task TEXT, tenant TEXT, cost INT, run_at_ms INT, "
                         "started_ms INT, ended_ms INT, pid INT)")

    def run(self, ctx: Context) -> None:
        self._db.execute("INSERT INTO runs VALUES (?, ?, ?, ?, ?, ?, ?)", (
            str(ctx.task_id), ctx.attempt, ctx.type, time.time_ns() // 1_000_000, ctx.run_at_ms, os.getpid(),
            ctx.fence))

    def effect(self, key: str, ctx: Context) -> None:
        self._db.execute("INSERT INTO effects VALUES (?, ?, ?, ?)", (key, str(ctx.task_id), ctx.attempt, os.getpid()))

    def span_started(self, ctx: Context) -> int:
        with self._lock:  # the connection's last rowid is shared by the handler threads
            cursor = self._db.execute("INSERT INTO spans VALUES (?, ?, ?, ?, ?, NULL, ?)", (
                str(ctx.task_id), ctx.tenant, ctx.task.cost, ctx.run_at_ms, time.time_ns() // 1_000_000,
                os.getpid()))
            assert cursor.lastrowid is not None
            return cursor.lastrowid

    def span_ended(self, row: int) -> None:
        self._db.execute("UPDATE spans SET ended_ms = ? WHERE rowid = ?", (time.time_ns() // 1_000_000, row))

    def spans(self) -> list[tuple[str, str, int, int, int, int | None, int]]:
        """(task, tenant, cost, run_at_ms, started_ms, ended_ms, pid) of every `fair` run;
        ended_ms is None while it runs, and for good if its process was killed."""
        return list(self._db.execute("SELECT * FROM spans ORDER BY started_ms, rowid"))

    def runs(self) -> list[tuple[str, int, str, int, int, int, int]]:
        return list(self._db.execute("SELECT * FROM runs ORDER BY started_ms, rowid"))

    def effects(self) -> list[tuple[str, str, int, int]]:
        return list(self._db.execute("SELECT * FROM effects ORDER BY rowid"))

    def close(self) -> None:
        self._db.close()


_sink: Sink | None = None


def sink() -> Sink:
    global _sink
    if _sink is None:
        _sink = Sink(os.environ["SCHEDULER_TEST_SINK"])
    return _sink


app = App("worker-tests", backoff_base_s=0.5, backoff_cap_s=4)


def behave(ctx: Context, payload: dict[str, Any]) -> None:
    sink().run(ctx)
    mode = payload.get("mode", "ok")
    if mode == "sleep":
        time.sleep(float(payload.get("s", 0.1)))
    elif mode == "fail":
        raise RuntimeError(f"provider timed out (attempt {ctx.attempt})")
    elif mode == "permanent":
        raise PermanentError(f"invalid phone number {payload.get('to', '+00')}")
    elif mode == "permanent_once":
        marker = Path(payload["marker"])
        if not marker.exists():
            marker.write_text(str(os.getpid()))
            raise PermanentError("the batch's template is missing (this once)")
    elif mode == "wait_for":
        deadline = time.monotonic() + 60
        while not Path(payload["path"]).exists() and time.monotonic() < deadline:
            time.sleep(0.01)
    elif mode == "block_once":
        marker = Path(payload["marker"])
        if not marker.exists():
            marker.write_text(str(os.getpid()))
            time.sleep(600)
    if "effect" in payload:
        ctx.once(payload["effect"], lambda: sink().effect(payload["effect"], ctx), scope=payload.get("scope", "task"))


@app.handler("sms")
def sms(ctx: Context, payload: dict[str, Any]) -> None:
    behave(ctx, payload)


@app.handler("poison", max_attempts=4, jitter="none", backoff_base_s=1, backoff_cap_s=8)
def poison(ctx: Context, payload: dict[str, Any]) -> None:
    behave(ctx, {**payload, "mode": "fail"})


@app.handler("report", pool="long")
def report(ctx: Context, payload: dict[str, Any]) -> None:
    behave(ctx, payload)


@app.handler("reminder")
async def reminder(ctx: Context, payload: dict[str, Any]) -> None:
    sink().run(ctx)
    await asyncio.sleep(float(payload.get("s", 0)))
    if "effect" in payload:
        await ctx.once_async(payload["effect"], lambda: asyncio.to_thread(sink().effect, payload["effect"], ctx),
                             scope=payload.get("scope", "task"))


@app.handler("slow", timeout_s=0.3, max_attempts=2, jitter="none", backoff_base_s=0.2)
def slow(ctx: Context, payload: dict[str, Any]) -> None:
    sink().run(ctx)
    if ctx.attempt == 1:
        time.sleep(float(payload.get("s", 2)))


@app.handler("fair")
def fair(ctx: Context, payload: dict[str, Any]) -> None:
    row = sink().span_started(ctx)
    time.sleep(float(payload.get("s", 0)))
    sink().span_ended(row)


@app.handler("step")
def step(ctx: Context, payload: dict[str, Any]) -> dict[str, Any]:
    behave(ctx, payload or {})
    flow = ctx.workflow
    assert flow is not None, "a 'step' task that is not a workflow step"
    result: dict[str, Any] = {"step": flow.step, "index": flow.index, "input": flow.input}
    definition = flow.workflows.definition(flow.tenant, flow.workflow_id)
    spec = None if definition is None else definition.by_name.get(flow.step)
    if spec is not None and spec.after:
        result["joined"] = sum(r is not None for name in spec.after for r in flow.results(name))
    return result


def _crash_after_step_end(marker: Path) -> None:
    """Patch the engine of this worker process (see the module docstring)."""
    from scheduler.workflows import engine

    advance = engine.Workflows._advance

    def crashing(self: engine.Workflows, *args: Any, **kwargs: Any) -> None:
        if not marker.exists():
            marker.write_text(str(os.getpid()))
            os.kill(os.getpid(), signal.SIGKILL)
        advance(self, *args, **kwargs)

    engine.Workflows._advance = crashing  # type: ignore[method-assign]


if os.environ.get("SCHEDULER_TEST_CRASH_AFTER_STEP_END"):
    _crash_after_step_end(Path(os.environ["SCHEDULER_TEST_CRASH_AFTER_STEP_END"]))
