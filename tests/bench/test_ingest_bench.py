"""`bench/ingest.py` runs end to end at a small size, counts every row back and says
so in its JSON; it fails clearly when Cassandra cannot be reached. (Its figures are not
asserted: timings belong in the bench, not in tests.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from scheduler.adapters.cassandra.connection import CassandraConnection
from tests.cluster import Cluster

BENCH = Path(__file__).resolve().parents[2] / "bench" / "ingest.py"


def run_bench(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(BENCH), *args], capture_output=True, text=True, timeout=240,
                          env=env)


def check_document(document: dict[str, Any], backend: str, tasks: int, processes: list[int]) -> None:
    result = document["backends"][backend]
    assert [run["processes"] for run in result["sdk"]] == processes
    assert all(run["tasks_per_s"] > 0 and run["ratio_to_raw"] > 0 for run in result["sdk"])
    assert result["raw"]["rows_per_s"] > 0
    verification = result["verification"]
    assert verification["counted"] == verification["expected"] == tasks * (1 + len(processes))


def test_the_embedded_bench_counts_every_row_back() -> None:
    result = run_bench("--backend", "embedded", "--tasks", "3000", "--rounds", "1", "--processes", "1,2", "--json")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    check_document(document, "embedded", 3000, [1, 2])
    assert "embedded   1 process:" in result.stderr
    assert not Path(document["backends"]["embedded"]["directory"]).exists()


def test_an_unreachable_cassandra_fails_the_bench_with_its_own_code() -> None:
    env = {**os.environ, "SCHEDULER_CASSANDRA_HOSTS": "127.0.0.1", "SCHEDULER_CASSANDRA_PORT": "1"}
    result = run_bench("--backend", "cassandra", "--tasks", "10", env=env)
    assert result.returncode == 2
    assert "cannot reach Cassandra at 127.0.0.1:1" in result.stderr


@pytest.mark.integration
def test_the_cassandra_bench_counts_every_row_back_and_drops_its_keyspaces(
    cluster: Cluster, cassandra: CassandraConnection
) -> None:
    env = {**os.environ, "SCHEDULER_CASSANDRA_HOSTS": ",".join(cluster.cassandra.hosts),
           "SCHEDULER_CASSANDRA_PORT": str(cluster.cassandra.port)}
    result = run_bench("--backend", "cassandra", "--tasks", "2000", "--rounds", "1", "--processes", "1", "--json",
                       env=env)
    assert result.returncode == 0, result.stderr
    result_of_cassandra = json.loads(result.stdout)["backends"]["cassandra"]
    check_document({"backends": {"cassandra": result_of_cassandra}}, "cassandra", 2000, [1])
    used = {result_of_cassandra["raw"]["runs"][0]["keyspace"], result_of_cassandra["sdk"][0]["runs"][0]["store"]}
    assert all(name.startswith("bench_") for name in used)
    rows = cassandra.session.execute("SELECT keyspace_name FROM system_schema.keyspaces")
    assert used.isdisjoint(row.keyspace_name for row in rows)
