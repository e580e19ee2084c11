"""The session fixture `secure_cluster`: the local cluster with authentication and TLS on
every server (`deploy/local/cluster.py start --secure`), beside the plain one.

It is used if `status --secure` finds it up (and left running), else started here and
stopped at the end of the session unless `SCHEDULER_KEEP_CLUSTER=1`. A start that
fails fails the tests that need it: unlike the plain cluster, nothing else can stand in.
The address is the secure default (127.0.2.1) unless `SCHEDULER_LOCAL_HOST` moves it.

`SecureCluster.env` holds the variables `cluster.py env --secure` prints: the scheduler's
identity on each server and the paths of its certificate and password files, for the
`scheduler` processes a test starts (with `SCHEDULER_BACKEND=cassandra`); `settings`
are the same, read into settings objects. `credentials` is the directory of the
cluster's secrets, for tests that connect as another identity, or as none.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from scheduler.settings import CassandraSettings, KafkaSettings, ZooKeeperSettings
from tests.cluster import CLUSTER_COMMAND, SERVERS, START_TIMEOUT_S


@dataclass(frozen=True)
class SecureCluster:
    env: dict[str, str]
    cassandra: CassandraSettings
    kafka: KafkaSettings
    zookeeper: ZooKeeperSettings
    credentials: Path

    def password_file(self, name: str) -> Path:
        """`<name>.password` (cassandra-admin, kafka-reader, ...) in the secrets directory."""
        return self.credentials / f"{name}.password"

    def process_env(self, **extra: str) -> dict[str, str]:
        """This process's environment, pointed at the secure cluster, with `extra` on top."""
        return {**os.environ, **self.env, **extra}


def command(*args: str) -> list[str]:
    return [*CLUSTER_COMMAND, *args, "--secure"]


def secure_status() -> dict[str, dict[str, object]]:
    result = subprocess.run(command("status", "--json"), capture_output=True, text=True, timeout=60)
    if not result.stdout.strip():
        raise RuntimeError(f"cluster.py status --secure printed nothing: {result.stderr}")
    status: dict[str, dict[str, object]] = json.loads(result.stdout)
    return status


def secure_env() -> dict[str, str]:
    """`cluster.py env --secure`, its `export NAME=value` lines read back."""
    printed = subprocess.run(command("env"), capture_output=True, text=True, timeout=60, check=True).stdout
    env: dict[str, str] = {}
    for line in printed.splitlines():
        name, _, value = line.removeprefix("export ").partition("=")
        env[name] = shlex.split(value)[0] if value else ""
    return env


def read_cluster() -> SecureCluster:
    env = secure_env()
    return SecureCluster(env=env, cassandra=CassandraSettings.from_env(env), kafka=KafkaSettings.from_env(env),
                         zookeeper=ZooKeeperSettings.from_env(env),
                         credentials=Path(env["SCHEDULER_CASSANDRA_TLS_CA"]).parent)


@pytest.fixture(scope="session")
def secure_cluster() -> Iterator[SecureCluster]:
    if all(secure_status().get(server, {}).get("state") == "up" for server in SERVERS):
        yield read_cluster()
        return
    started = subprocess.run(command("start"), capture_output=True, text=True, timeout=START_TIMEOUT_S)
    if started.returncode != 0:
        pytest.fail(f"the secure local cluster could not be started (cluster.py start --secure):\n"
                    f"{started.stdout}\n{started.stderr}")
    try:
        yield read_cluster()
    finally:
        if os.environ.get("SCHEDULER_KEEP_CLUSTER") != "1":
            subprocess.run(command("stop"), capture_output=True, text=True, timeout=120)
