"""A row that is not a task (written by a CQL INSERT around the store), after 2,000 good
ones in the same partition, read by a real `scheduler dispatcher` on Cassandra, Kafka and
ZooKeeper: every good task is published, the bad row goes to the deployment's
dead-letter topic (listed by `scheduler dlq list` with its reason, its letter holding its
columns), the shard's cursor moves past it, and the dispatcher keeps running."""

from __future__ import annotations

import os
from collections import Counter

import pytest

from scheduler.adapters.kafka.consumer import KafkaTopicScanner
from scheduler.cli import Exit
from scheduler.model import from_ms
from tests.bad_rows import assert_dead_lettered, bad_partition
from tests.contract.test_task_store import write_unreadable_row
from tests.dispatchers import Deployment
from tests.support import run_cli, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

SHARD = 5


def test_an_unreadable_row_after_2000_good_ones_is_dead_lettered_and_the_shard_goes_on(
    deployment: Deployment,
) -> None:
    store = deployment.store
    case = bad_partition(store.shard_count, SHARD, deployment.now_ms(), lead_ms=15_000)
    assert store.insert(case.before) == []
    write_unreadable_row(store, case.bad)
    assert store.insert(case.after) == []
    dispatcher = deployment.fleet.start("d")

    published = deployment.ready.wait_for(case.good_ids, timeout_s=120)
    wait_until(lambda: (store.read_shard(SHARD).fired_through_ms or 0) >= case.after[-1].run_at_ms,
               timeout_s=60, what="the shard's cursor to pass the bad row and the rows after it")
    wait_until(lambda: dispatcher.stats().get("stats", {}).get("bad_rows", 0) >= 1, timeout_s=10,
               what="the stats file to count the bad row")
    early = [(m.at_ms, m.run_at_ms) for m in published if m.task_id in case.good_ids and m.at_ms < m.run_at_ms]
    assert not early, f"published before their time: {early[:5]}"

    # It keeps running: a task submitted now fires too.
    later = deployment.client.submit("sms", {"n": 1}, run_at=from_ms(deployment.now_ms() + 1_000))
    deployment.ready.wait_for({later}, timeout_s=60)
    assert dispatcher.alive(), dispatcher.log()[-3000:]

    listed = run_cli("dlq", "list", "--json", env={**os.environ, **deployment.fleet.env})
    assert listed.returncode == Exit.OK, listed.stderr
    kafka = deployment.kafka
    assert_dead_lettered(listed.stdout, KafkaTopicScanner(kafka).scan(kafka.dead_letter_topic), case)
    counts = Counter(m.task_id for m in deployment.ready.snapshot())
    assert {counts[task.id] for task in case.good} == {1}, "one owner published a task twice"
