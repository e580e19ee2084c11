"""The README's "Connecting securely" commands, run as written in a shell from the
repository's root, against the secure local cluster: the `eval` of `env --secure` is
all the set-up the scheduler gets, and the task it submits is then read back with
the same variables, and not without them."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from scheduler.adapters.teardown import remove_deployment
from scheduler.settings import CassandraSettings, KafkaSettings, ZooKeeperSettings
from tests.cluster import unique_name
from tests.readme import section
from tests.secure_cluster import SecureCluster
from tests.support import run_cli

pytestmark = [pytest.mark.integration, pytest.mark.local_cluster, pytest.mark.secure, pytest.mark.timeout(300)]

REPO = Path(__file__).resolve().parents[2]
SECTION = "## Connecting securely"


@pytest.fixture
def shell_env(secure_cluster: SecureCluster) -> Iterator[dict[str, str]]:
    """A user's shell: no SCHEDULER_* variable but this test's own keyspace and topic
    prefix, and the virtualenv's `scheduler` on PATH."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("SCHEDULER_")}
    env |= {"PATH": f"{Path(sys.executable).parent}:{env.get('PATH', '')}",
            "SCHEDULER_KEYSPACE": unique_name("r"), "SCHEDULER_TOPIC_PREFIX": unique_name("r")}
    yield env
    secure = {**secure_cluster.env, **env}
    assert not remove_deployment(CassandraSettings.from_env(secure), KafkaSettings.from_env(secure),
                                 ZooKeeperSettings.from_env(secure))


def test_the_readme_secure_commands_run_as_written(secure_cluster: SecureCluster,
                                                   shell_env: dict[str, str]) -> None:
    blocks = re.findall(r"```sh\n(.*?)```", section(SECTION), re.S)
    assert len(blocks) == 1, f"the README's {SECTION!r} has {len(blocks)} sh blocks, not one"
    ran = subprocess.run(["bash", "-euo", "pipefail", "-c", blocks[0]], cwd=REPO, env=shell_env,
                         capture_output=True, text=True, timeout=240)
    assert ran.returncode == 0, ran.stderr
    task_id = ran.stdout.strip().splitlines()[-1]

    secure = {**secure_cluster.env, **shell_env}
    got = run_cli("get", task_id, "--tenant", "college", "--json", env=secure)
    assert got.returncode == 0, got.stderr
    task = json.loads(got.stdout)
    assert (task["id"], task["status"], task["payload"]) == (task_id, "scheduled", {"to": "+919800000001"})

    # The same command without the identity and certificates: refused, exit 2, and
    # the message names a setting to check rather than a secret.
    bare = {**shell_env, "SCHEDULER_BACKEND": "cassandra",
            **{name: secure[name] for name in ("SCHEDULER_CASSANDRA_HOSTS", "SCHEDULER_KAFKA_BOOTSTRAP",
                                               "SCHEDULER_ZOOKEEPER_HOSTS")}}
    refused = run_cli("get", task_id, "--tenant", "college", env=bare)
    assert refused.returncode == 2, (refused.returncode, refused.stderr)
    assert "SCHEDULER_CASSANDRA_" in refused.stderr
    assert "Traceback" not in refused.stderr
    for name in ("cassandra-scheduler", "cassandra-admin"):
        assert secure_cluster.password_file(name).read_text().strip() not in refused.stderr
