"""A handler begins only if `may_start` still says so at that moment, however long
after the main loop's decision its turn comes (`scheduler.cancels`): behind a slow job
of its chunk, or on an event loop another handler blocks. These drive `Execution` on
its own; `test_worker_embedded` has the whole worker."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from scheduler.model import Message
from scheduler.ports import Delivery
from scheduler.worker import App, Context
from scheduler.worker.execution import Execution, Finished
from scheduler.worker.job import Job
from scheduler.worker.stats import WorkerStats
from tests.worker.rig import task, wait_for


class Gate:
    """A stand-in for the worker's copy of the cancel marks: one shard count."""

    def __init__(self) -> None:
        self.count = 0
        self.asked: list[str] = []

    def may_start(self, job: Job) -> bool:
        self.asked.append(job.message.task.type)
        return job.mark_seen == self.count


@pytest.fixture
def gate() -> Gate:
    return Gate()


@pytest.fixture
def execution(gate: Gate) -> Iterator[Execution]:
    running = Execution(WorkerStats(), concurrency=2, member="w1", ledger=None, settle=lambda plan: None,
                        stop=threading.Event(), may_start=gate.may_start, running_report_after_s=60.0)
    yield running
    running.close()


def job(app: App, type_: str) -> Job:
    handler = app.lookup(type_)
    assert handler is not None
    return Job(Delivery("ready", 0, 0, b"", 0), Message(task(type_), 1), handler, "normal", shard=3, mark_seen=0)


def finished(execution: Execution, n: int) -> list[Finished]:
    done: list[Finished] = []

    def collected() -> bool:
        done.extend(execution.collect())
        return len(done) >= n

    wait_for(collected, what=f"{n} jobs to finish")
    return done


def test_a_job_whose_turn_in_its_chunk_comes_after_a_cancel_is_handed_back_not_run(
    execution: Execution, gate: Gate
) -> None:
    app, release, slow_started, ran = App("chunk"), threading.Event(), threading.Event(), []

    @app.handler("slow")
    def slow(ctx: Context, payload: Any) -> None:
        slow_started.set()
        assert release.wait(10)

    @app.handler("fast")
    def fast(ctx: Context, payload: Any) -> None:
        ran.append(ctx.task.id)

    first, second = job(app, "slow"), job(app, "fast")
    execution.launch([first, second])  # one thread, one after the other
    assert slow_started.wait(10)
    gate.count += 1  # a cancel in their shard while the first runs
    release.set()
    by_type = {f.job.message.task.type: f for f in finished(execution, 2)}
    assert by_type["slow"].error is None and not by_type["slow"].recheck
    assert by_type["fast"].recheck and ran == []
    assert execution.busy == 0 and execution.running == {}
    assert execution._stats.started == 1


def test_an_async_job_started_on_a_loop_another_handler_blocked_is_asked_when_it_begins(
    execution: Execution, gate: Gate
) -> None:
    app, release, blocking, ran = App("loop"), threading.Event(), threading.Event(), []

    @app.handler("blocking")
    async def blocks_the_loop(ctx: Context, payload: Any) -> None:
        blocking.set()
        assert release.wait(10)  # a sync call on the loop: nothing else runs meanwhile

    @app.handler("sms")
    async def sms(ctx: Context, payload: Any) -> None:
        ran.append(ctx.task.id)
        await asyncio.sleep(0)

    execution.start([app.lookup("blocking"), app.lookup("sms")])  # type: ignore[list-item]
    execution.launch([job(app, "blocking")])
    assert blocking.wait(10)
    execution.launch([job(app, "sms")])  # decided now, under count 0
    gate.count += 1
    release.set()
    by_type = {f.job.message.task.type: f for f in finished(execution, 2)}
    assert by_type["sms"].recheck and ran == []
    assert gate.asked == ["blocking", "sms"]


def test_a_job_whose_count_did_not_move_starts(execution: Execution, gate: Gate) -> None:
    app, ran = App("plain"), []

    @app.handler("sms")
    def sms(ctx: Context, payload: Any) -> None:
        ran.append(time.monotonic())

    execution.launch([job(app, "sms"), job(app, "sms")])
    assert all(f.error is None and not f.recheck for f in finished(execution, 2))
    assert len(ran) == 2
