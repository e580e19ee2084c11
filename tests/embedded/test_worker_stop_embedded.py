"""A `scheduler worker` told to stop leaves within its drain timeout plus `LEAVE_S`,
whatever the servers do: here its queue's file stays locked by another process while it
stops, so its commit and its leaving the group wait on the lock, as on a broker that does
not answer. What it could not commit is delivered again: the next worker runs it."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest

from scheduler.ports import TaskStatus
from scheduler.worker.runtime import LEAVE_S
from tests.support import wait_until
from tests.worker.rig import EmbeddedRig, task
from tests.workers import Workers

DRAIN_S = 1.0
EXIT_SLACK_S = 5.0
"""Beyond the bound: the interpreter's own exit and a busy machine's scheduling."""


@pytest.mark.timeout(90)
def test_a_stopping_worker_leaves_within_its_bound_though_its_queue_does_not_answer(tmp_path: Path) -> None:
    env = {"SCHEDULER_BACKEND": "embedded", "SCHEDULER_DB": str(tmp_path / "tasks.db")}
    rig = EmbeddedRig(tmp_path)
    workers = Workers(env, tmp_path, tmp_path / "worker-sink.db")
    gate = tmp_path / "go"
    try:
        first = workers.start("first", "--drain-timeout", str(DRAIN_S), concurrency=1, session_timeout_s=3)
        workers.wait_started(first)
        (item,) = rig.fire([task("sms", {"mode": "wait_for", "path": str(gate)})])
        sink = workers.sink()
        wait_until(lambda: [run for run in sink.runs() if run[0] == str(item.id)], timeout_s=30,
                   what="the task to start")
        sink.close()

        lock = sqlite3.connect(tmp_path / "queue.db", isolation_level=None)
        lock.execute("BEGIN EXCLUSIVE")  # every write to the queue now waits (readers go on: WAL)
        try:
            asked = time.monotonic()
            first.signal(signal.SIGTERM)
            try:
                code = first.process.wait(timeout=DRAIN_S + LEAVE_S + EXIT_SLACK_S)
            except subprocess.TimeoutExpired:
                code = None
            took = time.monotonic() - asked
        finally:
            lock.execute("ROLLBACK")
            lock.close()
        assert code == 0, f"still running {took:.1f} s after SIGTERM:\n{first.log()[-2000:]}"
        assert took >= DRAIN_S and "leaving now" in first.log()

        gate.write_text("go")  # the handler the first worker left behind died with it
        second = workers.start("second", concurrency=1)
        workers.wait_started(second)
        wait_until(lambda: rig.home(item).status is TaskStatus.DONE, timeout_s=45,
                   what="the uncommitted task delivered again and done")
    finally:
        workers.stop_all()
        rig.close()
