"""Failure paths of the submit path on real stores: a producer killed with SIGKILL loses
no acknowledged task, nor does a Cassandra server killed mid-stream, and a store that
refuses writes is reported item by item."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from scheduler.adapters.cassandra.connection import CassandraConnection
from scheduler.adapters.cassandra.store import CassandraTaskStore
from scheduler.adapters.embedded.store import SqliteTaskStore
from scheduler.model import TaskId
from scheduler.ports import TaskStore
from scheduler.producer import Client, Submission, SubmitReport
from scheduler.settings import CassandraSettings
from tests.cluster import CLUSTER_COMMAND, Cluster, answers, local_status
from tests.support import wait_until

PRODUCER = """
import sys
from scheduler.producer import Client
backend, where = sys.argv[1], sys.argv[2]
if backend == "embedded":
    from scheduler.adapters.embedded.store import SqliteTaskStore
    store = SqliteTaskStore(where)
else:
    from scheduler.adapters.cassandra.store import CassandraTaskStore
    from scheduler.settings import CassandraSettings
    host, port, keyspace = where.split(":")
    store = CassandraTaskStore.open(CassandraSettings(hosts=(host,), port=int(port), keyspace=keyspace))
client = Client(store, tenant="board")
while True:
    print(client.submit("sms", {"text": "x" * 100}, delay=3600), flush=True)
"""


def kill_producer_after(backend: str, where: str, acknowledged: int) -> list[TaskId]:
    """Run a producer that prints each id `submit` returned, SIGKILL it once it printed
    `acknowledged` ids, and return every id it printed."""
    process = subprocess.Popen([sys.executable, "-c", PRODUCER, backend, where], stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    lines: list[str] = []
    try:
        while len(lines) < acknowledged:  # a hung producer is ended by the test's timeout
            line = process.stdout.readline()
            assert line, f"the producer exited after {len(lines)} submits"
            lines.append(line)
        os.kill(process.pid, signal.SIGKILL)
        rest, _ = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == -signal.SIGKILL
    lines.extend(rest.splitlines())
    return [TaskId.parse(line) for line in lines if line.strip()]


@pytest.mark.parametrize("backend", ["embedded", "cassandra"])
def test_a_producer_killed_mid_stream_loses_no_acknowledged_task(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    store: TaskStore
    if backend == "embedded":
        where = str(tmp_path / "tasks.db")
        SqliteTaskStore(where).close()
        ids = kill_producer_after(backend, where, 300)
        store = SqliteTaskStore(where)
    else:
        keyspace: CassandraSettings = request.getfixturevalue("keyspace")
        ids = kill_producer_after(backend, f"{keyspace.hosts[0]}:{keyspace.port}:{keyspace.keyspace}", 300)
        store = CassandraTaskStore.open(keyspace)
    try:
        assert len(ids) >= 300
        missing = [task_id for task_id in ids if store.get(task_id) is None]
        assert missing == []
    finally:
        store.close()


def test_writes_the_server_refuses_are_reported_and_the_stream_stops(
    keyspace: CassandraSettings, cassandra: CassandraConnection
) -> None:
    store = CassandraTaskStore.open(keyspace, batch_rows=100)
    try:
        client = Client(store, tenant="board", chunk_size=1000)
        first = client.submit_many(Submission(type="sms", delay=3600) for _ in range(1000))
        assert first.complete and first.stored == 1000
        cassandra.session.execute(f"DROP TABLE {keyspace.keyspace}.tasks_by_bucket")

        report = client.submit_many(Submission(type="sms", delay=3600) for _ in range(5000))
        assert report.stopped_early and not report.complete
        assert report.consumed == 1000  # the first chunk failed, so nothing more was read
        assert report.stored == 0
        assert sorted(error.index for error in report.failed) == list(range(1000))
        assert "tasks_by_bucket" in report.failed[0].reason, report.failed[0].reason
    finally:
        store.close()


@pytest.mark.local_cluster
def test_cassandra_killed_mid_stream_loses_no_acknowledged_task(
    keyspace: CassandraSettings, cassandra: CassandraConnection, cluster: Cluster
) -> None:
    """SIGKILL of the Cassandra server while `submit_many` streams: the call ends with
    every item accounted for, and after a restart every task it called stored is there."""
    assert cluster.local, "tests marked local_cluster are deselected when SCHEDULER_* names a cluster"
    store = CassandraTaskStore.open(keyspace, batch_rows=100)
    killed: list[int] = []

    def kill_once_some_are_stored(report: SubmitReport) -> None:
        if report.stored >= 2000 and not killed:
            killed.append(local_status()["cassandra"]["pid"])
            os.kill(killed[0], signal.SIGKILL)
            wait_until(lambda: local_status()["cassandra"]["state"] == "down", timeout_s=30, what="cassandra down")

    try:
        client = Client(store, tenant="board", chunk_size=500)
        report = client.submit_many((Submission(type="sms", delay=3600) for _ in range(20_000)),
                                    progress=kill_once_some_are_stored)
    finally:
        restarted = subprocess.run([*CLUSTER_COMMAND, "start"], capture_output=True, text=True, timeout=300)
        store.close()
    assert restarted.returncode == 0, restarted.stdout + restarted.stderr
    assert killed
    assert report.stopped_early and report.failed
    assert report.stored + len(report.failed) + len(report.rejected) == report.consumed
    wait_until(lambda: answers(cassandra), timeout_s=90, what="the test session's connection to reconnect")

    reopened = CassandraTaskStore.open(keyspace)
    try:
        assert report.ids is not None
        stored = [task_id for task_id in report.ids if task_id is not None]
        assert len(stored) == report.stored >= 2000
        assert [task_id for task_id in stored if reopened.get(task_id) is None] == []
    finally:
        reopened.close()
