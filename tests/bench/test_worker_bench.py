"""The worker benches run end to end at a tiny scale and lose nothing:
`bench/worker_throughput.py` (embedded, and on the real servers) has every task handled
once and every home row `done`, and `bench/nine_oclock.py --workers 1` has every task
of its burst handled; both stop their workers and remove what they deployed. (Figures
are not asserted: timings belong in the benches, not in tests.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient

from scheduler.adapters.cassandra.connection import CassandraConnection
from scheduler.adapters.kafka.security import client_config
from tests.cluster import Cluster, cluster_env
from tests.support import alive, run_script

ROOT = Path(__file__).resolve().parents[2]
THROUGHPUT = ROOT / "bench" / "worker_throughput.py"
NINE = ROOT / "bench" / "nine_oclock.py"
TASKS = 2000


def run_bench(script: Path, *args: str, env: dict[str, str] | None = None,
              timeout_s: float = 55) -> tuple[int, str, str]:
    return run_script(script, *args, env=env, timeout_s=timeout_s, stop_timeout_s=30)


def check_throughput_document(document: dict[str, Any]) -> None:
    delivery = document["delivery"]
    assert delivery["expected"] == delivery["handled"] == TASKS
    assert delivery["lost"] == 0 and delivery["unexpected"] == 0
    assert delivery["starts"] == TASKS + delivery["extra_starts"]
    assert document["home_rows"] == {"done": TASKS}  # every status written
    assert document["failures"] == []
    throughput = document["throughput"]
    assert throughput["tasks"] == TASKS and throughput["tasks_per_s"] > 0
    assert throughput["tasks_per_s_upper"] >= throughput["tasks_per_s"]
    assert throughput["cpu"]["workers_cpu_s"] > 0
    assert document["ceilings"]["status_write"]["reports_per_s"] > 0
    assert document["ceilings"]["home_check"]["ids_per_s"] > 0
    assert {check["figure"] for check in document["targets"]} == {"tasks/s per worker process", "lost",
                                                                   "home rows not done"}
    assert document["command"][1].endswith("worker_throughput.py")
    assert all(not alive(worker["pid"]) for worker in document["workers"])
    assert document["work_dir"] is None


@pytest.mark.timeout(60)
def test_help_describes_every_option_and_a_bad_one_is_a_usage_error() -> None:
    shown = subprocess.run([sys.executable, str(THROUGHPUT), "--help"], capture_output=True, text=True, timeout=50)
    assert shown.returncode == 0, shown.stderr
    for option in ("--backend", "--tasks", "--concurrency", "--processes", "--out", "--json", "--keep", "--py-spy",
                   "--metrics"):
        assert option in shown.stdout
    refused = subprocess.run([sys.executable, str(THROUGHPUT), "--processes", "9"], capture_output=True, text=True,
                             timeout=50)
    assert refused.returncode == 2 and "--processes 1 to 8" in refused.stderr
    nine = subprocess.run([sys.executable, str(NINE), "--help"], capture_output=True, text=True, timeout=50)
    assert "--workers" in nine.stdout and "--worker-concurrency" in nine.stdout and "--no-align" in nine.stdout


@pytest.mark.timeout(60)
def test_an_unreachable_cassandra_fails_the_bench_with_its_own_code() -> None:
    env = {**os.environ, "SCHEDULER_CASSANDRA_HOSTS": "127.0.0.1", "SCHEDULER_CASSANDRA_PORT": "1"}
    code, _, stderr = run_bench(THROUGHPUT, "--tasks", "10", env=env)
    assert code == 2, stderr


@pytest.mark.timeout(60)
def test_the_embedded_bench_handles_every_task_once_and_marks_it_done(tmp_path: Path) -> None:
    out = tmp_path / "worker.json"
    code, stdout, stderr = run_bench(THROUGHPUT, "--backend", "embedded", "--tasks", str(TASKS), "--concurrency",
                                     "32", "--ceiling-tasks", "1000", "--metrics", "--out", str(out))
    assert code == 0, stderr
    assert "worker throughput: 2,000 no-op tasks, 1 worker process(es) x concurrency 32, backend embedded" in stdout
    document = json.loads(out.read_text())
    check_throughput_document(document)
    assert not Path(document["deployment"]["db"]).exists()
    metrics = document["metrics"]  # --metrics: the worker was scraped every second, and counted every task
    assert metrics["endpoints"] == 1 and metrics["scrapes"] >= 1 and metrics["failures"] == 0
    assert metrics["said"]["worker_tasks_handled_total"] == TASKS
    assert metrics["lateness_ms"]["worker_start_lateness_seconds"]["count"] == TASKS


@pytest.mark.integration
@pytest.mark.timeout(60)
def test_the_cassandra_bench_handles_every_task_once_and_leaves_nothing_behind(
    cluster: Cluster, cassandra: CassandraConnection, tmp_path: Path
) -> None:
    out = tmp_path / "worker.json"
    code, _, stderr = run_bench(THROUGHPUT, "--tasks", str(TASKS), "--concurrency", "32", "--ceiling-tasks", "1000",
                                "--out", str(out), env=cluster_env(cluster))
    assert code == 0, stderr
    document = json.loads(out.read_text())
    check_throughput_document(document)
    assert document["ceilings"]["consume"]["messages"] == TASKS

    deployment = document["deployment"]
    keyspaces = {row.keyspace_name for row in cassandra.session.execute(
        "SELECT keyspace_name FROM system_schema.keyspaces")}
    assert deployment["keyspace"] not in keyspaces
    admin = AdminClient(client_config(cluster.kafka))
    topics = admin.list_topics(timeout=30).topics
    assert not [name for name in topics if name.startswith(deployment["topic_prefix"] + ".")]
    groups = admin.list_consumer_groups(request_timeout=30).result().valid
    assert not [group.group_id for group in groups if group.group_id.startswith(deployment["topic_prefix"] + ".")]


@pytest.mark.integration
@pytest.mark.timeout(90)
def test_a_tiny_burst_with_a_worker_is_handled_whole(cluster: Cluster, tmp_path: Path) -> None:
    out = tmp_path / "nine.json"
    code, stdout, stderr = run_bench(
        NINE, "--tasks", str(TASKS), "--spread-s", "2", "--lead-s", "5", "--no-align", "--ceiling-messages", "10000",
        "--workers", "1", "--worker-concurrency", "64", "--out", str(out), env=cluster_env(cluster), timeout_s=80)
    assert code == 0, stderr
    assert "handler lateness" in stdout
    document = json.loads(out.read_text())
    handled = document["handling"]["delivery"]
    assert handled["expected"] == handled["handled"] == TASKS and handled["lost"] == 0
    assert handled["unexpected"] == 0
    lateness = document["handling"]["lateness_ms"]
    assert lateness["min"] >= 0  # no handler started before its task was due
    assert sum(second["tasks"] for second in lateness["by_due_second"].values()) == TASKS
    assert document["delivery"]["published"] == TASKS and document["failures"] == []
    assert {"handler lateness p99", "handled lost"} <= {check["figure"] for check in document["targets"]}
    assert [worker["exit_code"] for worker in document["workers"]] == [0] or document["workers"][0]["exit_race"]
    assert not any(alive(worker["pid"]) for worker in document["workers"] + document["dispatchers"])
