"""`scheduler status` on the real Cassandra, Kafka and ZooKeeper, against a real
dispatcher and worker in the test's own keyspace, topics and ZooKeeper root: the counts
by tenant, type and state, the minutes, lateness, processes and shards equal what the
test made happen (tests/visibility.py); and the status page, in a browser, shows the same,
follows live, looks tasks up and replays a dead letter through Kafka."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.dispatchers import Deployment
from tests.status_page import chromium, skip_without_chromium
from tests.visibility import run_status_scenario
from tests.workers import Workers


@pytest.mark.timeout(300)
def test_status_and_the_status_page_show_what_happened(deployment: Deployment, workers: Workers,
                                                       tmp_path: Path) -> None:
    final = run_status_scenario(deployment.fleet.env, deployment.fleet, workers, tmp_path, timeout_s=120,
                                page=chromium() is not None)
    shards = final["shards"]
    assert len(shards) == deployment.store.shard_count
    assert {s["owner"] for s in shards} == {"d1"}
    assert all(s["token"] is not None and s["lag_ms"] is not None and s["lag_ms"] < 60_000 for s in shards)
    skip_without_chromium()  # the status part passed; say that the page's was not checked
