"""`scheduler demo --backend local`: the same story on the real Cassandra, Kafka and
ZooKeeper, with a keyspace, topics and ZooKeeper root of its own that it removes."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient
from kazoo.client import KazooClient

from scheduler.adapters.cassandra.connection import CassandraConnection
from scheduler.adapters.kafka.security import client_config
from scheduler.cli import Exit
from tests.cluster import Cluster, cluster_env
from tests.embedded.test_demo import SMALL, check_small_story
from tests.support import run_cli

pytestmark = pytest.mark.integration


@pytest.mark.timeout(180)
def test_the_demo_on_the_real_servers_delivers_everything_and_removes_what_it_made(
    cluster: Cluster, cassandra: CassandraConnection, zk_root: KazooClient, tmp_path: Path
) -> None:
    env = cluster_env(cluster)
    out = tmp_path / "summary.json"
    result = run_cli("demo", "--backend", "local", *SMALL, "--json", str(out), env=env, timeout_s=170)
    assert result.returncode == Exit.OK, result.stdout + result.stderr
    check_small_story(json.loads(out.read_text()))

    made = re.search(r"creating keyspace (\S+), topics (\S+)\.\* and ZooKeeper root (\S+)", result.stdout)
    assert made is not None, result.stdout
    keyspace, prefix, root = made.groups()
    assert cassandra.session.execute(
        "SELECT keyspace_name FROM system_schema.keyspaces WHERE keyspace_name = %s", (keyspace,)).one() is None
    topics = AdminClient(client_config(cluster.kafka)).list_topics(timeout=30).topics
    assert not [name for name in topics if name.startswith(f"{prefix}.")]
    assert zk_root.exists(root) is None
