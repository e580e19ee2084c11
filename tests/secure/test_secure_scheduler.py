"""The whole scheduler on the secure cluster: every connection authenticated and
encrypted, nothing configured but the `SCHEDULER_*` variables `cluster.py env --secure`
prints.

The schema is applied with `scheduler schema apply`, two `scheduler dispatcher`
processes share the shards, a `scheduler worker` runs the tasks, and a producer submits
through `scheduler.connect`. One dispatcher is killed with SIGKILL before the tasks fall
due: the other takes its shards over (its leases on the TLS ZooKeeper, its fenced writes
in Cassandra) and every task still runs, none before its time.

The schema is applied by a role that may create keyspaces; the dispatchers, the worker
and the producer log in as a role granted only SELECT and MODIFY on the keyspace, the
grant deploy/README.md ("Security") gives for production.
"""

from __future__ import annotations

import contextlib
import dataclasses
import secrets
import signal
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

import scheduler
from scheduler.adapters.cassandra.connection import connect
from scheduler.adapters.teardown import remove_deployment
from scheduler.model import DEFAULT_SHARD_COUNT
from scheduler.settings import CassandraSettings, KafkaSettings, ZooKeeperSettings
from tests.cluster import unique_name
from tests.dispatchers import LEASE_TIMEOUT_S, Fleet
from tests.secure_cluster import SecureCluster
from tests.support import wait_until
from tests.workers import Workers

pytestmark = [pytest.mark.integration, pytest.mark.local_cluster, pytest.mark.secure, pytest.mark.timeout(300)]

TASKS = 120


@pytest.fixture
def secure_env(secure_cluster: SecureCluster) -> Iterator[dict[str, str]]:
    """The secure cluster's variables, with a keyspace, topic prefix and ZooKeeper root of
    this test's own (removed afterwards, as the scheduler's identity)."""
    env = secure_cluster.process_env(
        SCHEDULER_BACKEND="cassandra", SCHEDULER_KEYSPACE=unique_name("s"), SCHEDULER_TOPIC_PREFIX=unique_name("s"),
        SCHEDULER_ZOOKEEPER_ROOT=f"/{unique_name('s')}", SCHEDULER_LEASE_TIMEOUT_S=str(LEASE_TIMEOUT_S),
    )
    yield env
    warnings = remove_deployment(CassandraSettings.from_env(env), KafkaSettings.from_env(env),
                                 ZooKeeperSettings.from_env(env))
    assert not warnings


@contextlib.contextmanager
def runtime_role(secure_cluster: SecureCluster, secure_env: dict[str, str], tmp_path: Path) -> Iterator[dict[str, str]]:
    """`secure_env`, logged in to Cassandra as a role of this test's own that may only
    SELECT and MODIFY in its keyspace (made by the superuser, dropped afterwards)."""
    admin = dataclasses.replace(secure_cluster.cassandra, username="cassandra",
                                password_file=secure_cluster.password_file("cassandra-admin"))
    role, password = unique_name("runner"), secrets.token_urlsafe(18)
    password_file = tmp_path / "runner.password"
    password_file.write_text(password + "\n")
    password_file.chmod(0o600)
    keyspace = secure_env["SCHEDULER_KEYSPACE"]
    with connect(admin) as connection:
        connection.session.execute(f"CREATE ROLE {role} WITH PASSWORD = %s AND LOGIN = true", (password,))
        connection.session.execute(f"GRANT SELECT ON KEYSPACE {keyspace} TO {role}")
        connection.session.execute(f"GRANT MODIFY ON KEYSPACE {keyspace} TO {role}")
    try:
        yield {**secure_env, "SCHEDULER_CASSANDRA_USERNAME": role,
               "SCHEDULER_CASSANDRA_PASSWORD_FILE": str(password_file)}
    finally:
        with connect(admin) as connection:
            connection.session.execute(f"DROP ROLE IF EXISTS {role}")


def run_cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "scheduler", *args], env=env, capture_output=True, text=True,
                          timeout=180)


def test_tasks_fire_and_run_on_the_secure_cluster_through_a_dispatcher_kill(
        secure_env: dict[str, str], secure_cluster: SecureCluster, tmp_path: Path) -> None:
    applied = run_cli(secure_env, "schema", "apply")
    assert applied.returncode == 0, applied.stderr
    with runtime_role(secure_cluster, secure_env, tmp_path) as runtime_env:
        fire_through_a_kill(runtime_env, tmp_path)


def fire_through_a_kill(env: dict[str, str], tmp_path: Path) -> None:
    fleet = Fleet(env, tmp_path)
    workers = Workers(env, tmp_path, tmp_path / "sink.db")
    try:
        fleet.start("a", "--shards", "auto")
        fleet.start("b", "--shards", "auto")
        fleet.wait_for_split({"a": DEFAULT_SHARD_COUNT // 2, "b": DEFAULT_SHARD_COUNT // 2}, timeout_s=120)
        worker = workers.start("w")
        workers.wait_started(worker, timeout_s=120)

        due_from = datetime.now(UTC) + timedelta(seconds=15)
        ids: dict[str, int] = {}
        with scheduler.connect(tenant="state-board", env=env) as client:
            for n in range(TASKS):
                run_at = due_from + timedelta(milliseconds=50 * n)
                task = client.submit("sms", {"to": f"+9198000{n:05d}"}, run_at=run_at)
                ids[str(task)] = int(run_at.timestamp() * 1000)

        fleet.dispatchers[0].signal(signal.SIGKILL)
        fleet.wait_for_split({"b": DEFAULT_SHARD_COUNT}, timeout_s=120)

        sink = workers.sink()
        try:
            def all_ran() -> bool:
                worker.check_alive()
                return ids.keys() <= {task for task, *_ in sink.runs()}

            wait_until(all_ran, timeout_s=180,
                       what=f"{len(ids.keys() - {task for task, *_ in sink.runs()})} of {TASKS} tasks to run")
            runs = sink.runs()
        finally:
            sink.close()
        early = [(task, started, run_at) for task, _attempt, _type, started, run_at, *_ in runs if started < run_at]
        assert all(abs(run_at - ids[task]) <= 1 for task, _attempt, _type, _started, run_at, *_ in runs)
        assert not early, f"ran before their time: {early[:5]}"
        assert {task for task, *_ in runs} == ids.keys()
    finally:
        workers.stop_all()
        fleet.stop_all()
