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
of the lost one, and that no message went out under a stale lease token.

The fairness runs (a small results day under a global rate of 1,000 units/s, `--no-align`,
about 50 s on the servers, 30 s embedded) do assert the fairness figures, which are the
gate's promises rather than timings: never more units in a second than the global rate,
the college's 10 tasks out within 2 s of their time behind the board's backlog, and gold
(weight 3) getting three times free's units while both wait. Gold and free have 3,000
tasks each so that both stay backlogged past M + 2 s (gold drains at 600 units/s), which
the ratio's window (M + 1 s to the first one's last release, less 1 s) needs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient
from kazoo.client import KazooClient

from scheduler.adapters.cassandra.connection import CassandraConnection
from scheduler.adapters.kafka.security import client_config
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
                   "--no-align", "--backend", "--global-rate", "--board-tasks", "--board-cost", "--metrics",
                   "--weight-tasks", "--college-tasks", "--college-at-s", "--fill", "--fill-processes"):
        assert option in shown.stdout
    text = " ".join(shown.stdout.split())  # argparse wraps the help to the terminal's width
    assert "failover:" in text and "pause:" in text and "150,000 (failover, pause)" in text
    assert "fairness:" in text and "24,450 (fairness)" in text
    refused = subprocess.run([sys.executable, str(BENCH), "--spread-s", "61"], capture_output=True, text=True,
                             timeout=50)
    assert refused.returncode == 2 and "--spread-s 1 to 60" in refused.stderr
    alone = subprocess.run([sys.executable, str(BENCH), "--scenario", "failover", "--dispatchers", "1"],
                           capture_output=True, text=True, timeout=50)
    assert alone.returncode == 2 and "needs --dispatchers 2 or more" in alone.stderr
    embedded = subprocess.run([sys.executable, str(BENCH), "--fill", "10", "--backend", "embedded"],
                              capture_output=True, text=True, timeout=50)
    assert embedded.returncode == 2 and "--fill needs --backend cassandra" in embedded.stderr


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_a_tiny_burst_after_a_fill_reports_the_fill_and_is_published_whole_never_early(
    cluster: Cluster, cassandra: CassandraConnection, tmp_path: Path
) -> None:
    """20,000 other tasks first (half done in the past, half due in days), then the
    burst at the next whole second: the fill is reported with its rate, its settling and
    the table's bytes, and the burst loses nothing and fires nothing early among them."""
    out = tmp_path / "fill.json"
    code, stdout, stderr = run_bench(cluster_env(cluster), "--fill", "20000", "--tasks", str(TASKS),
                                     "--spread-s", "2", "--lead-s", "10", "--no-align", "--ceiling-messages",
                                     "10000", "--out", str(out))
    assert code == 0, stderr
    assert "  fill                    20,000 tasks (10,000 done, 10,000 due;" in stdout
    document = json.loads(out.read_text())
    fill = document["fill"]
    assert fill["rows"] == 20_000 and fill["past_done"] == fill["done_reports"] == 10_000 and fill["future"] == 10_000
    assert fill["settled"] and fill["seconds"] > 0 and fill["rows_per_s"] > 0
    assert 0 < fill["partitions"] <= 20_000
    # The local node's files are on this machine: every fill task is on disk after the flush.
    assert fill["disk"]["sstables"] >= 1 and fill["disk"]["bytes_per_task"] > 100  # a 100 B payload each

    delivery = document["delivery"]
    assert delivery["expected"] == delivery["published"] == TASKS and delivery["lost"] == 0
    assert delivery["unexpected"] == 0  # none of the fill's tasks was fired
    assert document["lateness_ms"]["early"] == 0 and document["failures"] == []
    keyspaces = {row.keyspace_name for row in cassandra.session.execute(
        "SELECT keyspace_name FROM system_schema.keyspaces")}
    assert document["deployment"]["keyspace"] not in keyspaces


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
    topics = AdminClient(client_config(cluster.kafka)).list_topics(timeout=30).topics
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
    # A batch the victim sent just before SIGKILL may be stored just after it (broker time), so
    # old_owner_messages_after_event is not 0 by construction; nothing under its token after its lease
    # expired, and nothing under it after the new owner began, is.
    assert takeover["stale_token_messages"] == 0 and takeover["after_new_owner_first"] == 0
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
                                     "--ceiling-messages", "10000", "--metrics", "--out", str(out))
    assert code == 0, stderr
    assert "nine o'clock (pause, embedded backend): 2,000 tasks due over 20 s" in stdout
    document = json.loads(out.read_text())
    metrics = document["metrics"]  # --metrics: both dispatchers scraped every second, the paused one too
    assert metrics["endpoints"] == 2 and metrics["scrapes"] >= 20
    fired = metrics["said"]["dispatcher_tasks_fired_total"]
    assert TASKS <= fired <= document["delivery"]["messages"]  # a batch published again after a failed flush counts once
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


FAIRNESS_RATE = 1000
FAIRNESS_ARGS = ("--scenario", "fairness", "--board-tasks", "40", "--board-cost", "75", "--weight-tasks", "3000",
                 "--college-tasks", "10", "--global-rate", str(FAIRNESS_RATE), "--lead-s", "10", "--no-align",
                 "--ceiling-messages", "10000")
FAIRNESS_TASKS = 40 + 2 * 3000 + 10


def check_fairness_document(document: dict[str, Any]) -> None:
    """What both backends' fairness runs promise (see the module's docstring)."""
    assert document["scenario"] == "fairness" and document["failures"] == []
    delivery = document["delivery"]
    assert delivery["expected"] == delivery["published"] == FAIRNESS_TASKS and delivery["lost"] == 0
    assert document["lateness_ms"]["early"] == 0
    assert document["limits"]["global_rate"] == FAIRNESS_RATE
    assert document["limits"]["tenants"]["gold"]["weight"] == 3
    fairness = document["fairness"]
    tenants = fairness["tenants"]
    assert set(tenants) == {"board", "college", "gold", "free"}
    assert (tenants["board"]["tasks"], tenants["board"]["units"]) == (40, 3000)
    assert (tenants["gold"]["units"], tenants["free"]["units"], tenants["college"]["tasks"]) == (3000, 3000, 10)
    for tenant in tenants.values():
        late = tenant["lateness_ms"]
        assert late["early"] == 0 and late["p50"] <= late["p90"] <= late["p99"] <= late["max"]
        assert tenant["first_release_after_minute_ms"] <= tenant["last_release_after_minute_ms"]
    # every message is stamped with its release (Kafka's CreateTime, the embedded log's own)
    assert fairness["global_rate"]["max_units_in_1s"] <= FAIRNESS_RATE, fairness["global_rate"]
    assert tenants["college"]["lateness_ms"]["p99"] <= 2000, tenants["college"]
    weights = fairness["weights"]
    assert weights["window_ms"] >= 1000 and abs(weights["ratio"] / 3 - 1) <= 0.15, weights
    assert {"max units in 1 s", "college lateness p99", "drain rate", "gold/free ratio"} <= {
        check["figure"] for check in document["targets"]}
    assert not any(alive(d["pid"]) for d in document["dispatchers"])


@pytest.mark.integration
@pytest.mark.timeout(150)
def test_a_tiny_results_day_keeps_the_global_rate_serves_the_college_and_meets_the_weights(
    cluster: Cluster, tmp_path: Path
) -> None:
    out = tmp_path / "fair.json"
    code, stdout, stderr = run_bench(cluster_env(cluster), *FAIRNESS_ARGS, "--out", str(out))
    assert code == 0, stderr
    assert "nine o'clock (fairness): 6,050 tasks due over 6 s" in stdout
    assert "global rate             at most" in stdout and "raw Kafka ceiling" in stdout
    document = json.loads(out.read_text())
    assert document["deployment"]["ready_timestamps"] == "CreateTime (release moment)"
    check_fairness_document(document)
    assert [d["exit_code"] for d in document["dispatchers"]] == [0, 0]


@pytest.mark.timeout(150)
def test_a_tiny_results_day_on_the_embedded_backend_serves_the_college_and_meets_the_weights(
    tmp_path: Path,
) -> None:
    out = tmp_path / "fair-e.json"
    code, stdout, stderr = run_bench(dict(os.environ), "--backend", "embedded", *FAIRNESS_ARGS, "--out", str(out))
    assert code == 0, stderr
    assert "nine o'clock (fairness, embedded backend): 6,050 tasks due over 6 s" in stdout
    document = json.loads(out.read_text())
    check_fairness_document(document)
    assert not Path(document["deployment"]["db"]).exists() and document["work_dir"] is None
