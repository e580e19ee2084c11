"""`bench/nine_oclock.py` documents its options, and runs end to end at a tiny scale on
the real servers: every task it stored is published, none before its time, its
dispatchers are stopped and its keyspace, topics and ZooKeeper root are removed. (Its
figures are not asserted: timings belong in the bench, not in tests.)

Most of the run is the wait for the burst minute: the tasks are due at the first
minute boundary at least `--lead-s` after the ingest, so the test takes 30 to 90 s.
The failover run (real servers) and the pause run (embedded backend, no servers) start
the burst at the next whole second instead (`--no-align`) and take about a minute each,
most of it the lost dispatcher's lease running out. Their lateness is not asserted
either: only that nothing was lost or early, that the other dispatcher took every shard
of the lost one, and that no message went out under a stale lease token."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient
from kazoo.client import KazooClient

from scheduler.adapters.cassandra.connection import CassandraConnection
from tests.cluster import Cluster, cluster_env
from tests.support import alive, run_script

BENCH = Path(__file__).resolve().parents[2] / "bench" / "nine_oclock.py"
TASKS = 2000
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def run_bench(env: dict[str, str], *args: str) -> tuple[int, str, str]:
    return run_script(BENCH, *args, env=env, timeout_s=260)


@pytest.mark.timeout(60)
def test_help_describes_every_option_and_a_bad_one_is_a_usage_error() -> None:
    shown = subprocess.run([sys.executable, str(BENCH), "--help"], capture_output=True, text=True, timeout=50)
    assert shown.returncode == 0, shown.stderr
    for option in ("--tasks", "--spread-s", "--dispatchers", "--payload-bytes", "--tenants", "--lead-s", "--out",
                   "--keep", "--reader", "--scenario", "--event-at-s", "--pause-s", "--plot", "--workers",
                   "--no-align", "--backend"):
        assert option in shown.stdout
    text = " ".join(shown.stdout.split())  # argparse wraps the help to the terminal's width
    assert "failover:" in text and "pause:" in text and "150,000 (failover, pause)" in text
    refused = subprocess.run([sys.executable, str(BENCH), "--spread-s", "61"], capture_output=True, text=True,
                             timeout=50)
    assert refused.returncode == 2 and "--spread-s 1 to 60" in refused.stderr
    alone = subprocess.run([sys.executable, str(BENCH), "--scenario", "failover", "--dispatchers", "1"],
                           capture_output=True, text=True, timeout=50)
    assert alone.returncode == 2 and "needs --dispatchers 2 or more" in alone.stderr


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_a_tiny_burst_is_published_whole_never_early_and_leaves_nothing_behind(
    cluster: Cluster, cassandra: CassandraConnection, zk_root: KazooClient, tmp_path: Path
) -> None:
    env = cluster_env(cluster)
    out = tmp_path / "nine.json"
    code, stdout, stderr = run_bench(env, "--tasks", str(TASKS), "--spread-s", "2", "--lead-s", "10",
                                     "--ceiling-messages", "10000", "--out", str(out))
    assert code == 0, stderr
    assert "nine o'clock (burst): 2,000 tasks due over 2 s" in stdout
    document = json.loads(out.read_text())

    delivery = document["delivery"]
    assert delivery["expected"] == delivery["published"] == TASKS
    assert delivery["lost"] == 0
    assert delivery["unexpected"] == delivery["invalid"] == delivery["run_at_mismatches"] == 0
    assert delivery["messages"] == TASKS + delivery["extra_messages"]
    assert delivery["broker_timestamps"]  # lateness is measured from Kafka's own clock
    lateness = document["lateness_ms"]
    assert lateness["early"] == 0 and lateness["min"] >= 0
    assert sum(second["tasks"] for second in lateness["by_due_second"].values()) == TASKS
    assert document["fire"]["published_tasks"] == TASKS and document["failures"] == []
    assert document["ingest"]["tasks"] == TASKS and document["kafka_ceiling"]["msgs_per_s"] > 0
    assert {check["figure"] for check in document["targets"]} >= {"fire rate", "lateness p99", "lost", "early"}

    assert [d["exit_code"] for d in document["dispatchers"]] == [0]
    assert not any(alive(d["pid"]) for d in document["dispatchers"])
    deployment = document["deployment"]
    rows = cassandra.session.execute("SELECT keyspace_name FROM system_schema.keyspaces")
    keyspaces = {row.keyspace_name for row in rows}
    assert deployment["keyspace"] not in keyspaces
    topics = AdminClient({"bootstrap.servers": cluster.kafka.bootstrap}).list_topics(timeout=30).topics
    assert not [name for name in topics if name.startswith(deployment["topic_prefix"] + ".")]
    assert not zk_root.exists(deployment["zookeeper_root"])
    assert document["work_dir"] is None
    assert document["scenario"] == "burst" and document["event"] is None and document["takeover"] is None
    assert (tmp_path / "nine.png").read_bytes().startswith(PNG_SIGNATURE)


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_a_tiny_failover_loses_nothing_and_the_survivor_takes_every_shard(
    cluster: Cluster, tmp_path: Path
) -> None:
    out = tmp_path / "failover.json"
    code, stdout, stderr = run_bench(cluster_env(cluster), "--scenario", "failover", "--tasks", str(TASKS),
                                     "--spread-s", "20", "--lead-s", "10", "--no-align", "--ceiling-messages",
                                     "10000", "--out", str(out))
    assert code == 0, stderr
    assert "nine o'clock (failover): 2,000 tasks due over 20 s" in stdout
    document = json.loads(out.read_text())
    assert document["scenario"] == "failover" and document["settings"]["dispatchers"] == 2
    assert document["failures"] == []

    delivery = document["delivery"]
    assert delivery["expected"] == delivery["published"] == TASKS and delivery["lost"] == 0
    assert delivery["unexpected"] == delivery["invalid"] == delivery["run_at_mismatches"] == 0
    assert delivery["messages"] == TASKS + delivery["extra_messages"]  # repeats are allowed, and counted
    assert document["lateness_ms"]["early"] == 0 and document["lateness_ms"]["min"] >= 0

    event = document["event"]
    assert event["kind"] == "kill" and event["dispatcher"] == "dispatcher-1" and event["at_ms"] is not None
    assert 0 < len(event["shards"]) < 64 and event["reown_s"] is not None
    takeover = document["takeover"]
    assert takeover["shards_published_by_new_owner"] == len(event["shards"])
    assert takeover["stale_token_messages"] == 0 and takeover["old_owner_messages_after_event"] == 0
    assert delivery["fences"] > 64  # the taken-over shards were fired under new tokens

    codes = {d["name"]: d["exit_code"] for d in document["dispatchers"]}
    assert codes == {"dispatcher-1": -signal.SIGKILL, "dispatcher-2": 0}
    assert not any(alive(d["pid"]) for d in document["dispatchers"])
    assert document["plot"] == str(tmp_path / "failover.png")
    assert (tmp_path / "failover.png").read_bytes().startswith(PNG_SIGNATURE)


@pytest.mark.timeout(300)
def test_a_tiny_pause_on_the_embedded_backend_loses_nothing_and_the_paused_dispatcher_fires_no_stale_shard(
    tmp_path: Path,
) -> None:
    out = tmp_path / "pause.json"
    code, stdout, stderr = run_bench(dict(os.environ), "--backend", "embedded", "--scenario", "pause", "--tasks",
                                     str(TASKS), "--spread-s", "20", "--lead-s", "10", "--no-align",
                                     "--ceiling-messages", "10000", "--out", str(out))
    assert code == 0, stderr
    assert "nine o'clock (pause, embedded backend): 2,000 tasks due over 20 s" in stdout
    document = json.loads(out.read_text())
    assert document["scenario"] == "pause" and document["failures"] == []
    assert document["deployment"]["backend"] == "embedded" and document["kafka_ceiling"] is None
    assert document["ceiling"]["kind"] == "sqlite_queue_insert" and document["ceiling"]["msgs_per_s"] > 0

    delivery = document["delivery"]
    assert delivery["expected"] == delivery["published"] == TASKS and delivery["lost"] == 0
    assert delivery["unexpected"] == delivery["invalid"] == delivery["run_at_mismatches"] == 0
    assert document["lateness_ms"]["early"] == 0

    event = document["event"]
    assert event["kind"] == "pause" and event["duration_ms"] is not None and event["reown_s"] is not None
    takeover = document["takeover"]
    assert takeover["shards_published_by_new_owner"] == len(event["shards"]) > 0
    assert takeover["stale_token_messages"] == 0  # continued, it found its leases gone and fired none of them

    assert [d["exit_code"] for d in document["dispatchers"]] == [0, 0]  # the paused one, too, stopped by SIGTERM
    assert not any(alive(d["pid"]) for d in document["dispatchers"])
    assert not Path(document["deployment"]["db"]).exists() and document["work_dir"] is None
    assert (tmp_path / "pause.png").read_bytes().startswith(PNG_SIGNATURE)
