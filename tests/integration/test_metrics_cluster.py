"""The metrics endpoints of real `scheduler dispatcher` and `scheduler worker` processes on
Cassandra, Kafka and ZooKeeper (a keyspace, topics and ZooKeeper root of the test's own),
scraped over HTTP: see `tests.metrics.check_end_to_end`. The same on the embedded
backend: tests/embedded/test_metrics_embedded.py."""

from __future__ import annotations

import pytest

from tests.dispatchers import Deployment
from tests.metrics import check_end_to_end, metrics_url, scrape
from tests.support import wait_until
from tests.workers import Workers


@pytest.mark.timeout(240)
def test_what_the_endpoints_say_adds_up_to_every_task_fired_once_and_handled_once(
    deployment: Deployment, workers: Workers
) -> None:
    result = check_end_to_end(deployment.fleet, workers, tasks=600)
    shards = sum(s.value("scheduler_dispatcher_shards_held") for s in result.dispatchers)
    assert shards == deployment.cassandra.shard_count
    # The worker reads its lag every 2 s from what librdkafka already knows: it has fetched
    # everything, so the next reading is all zeros.
    assert set(result.worker.labels_of("scheduler_worker_consumer_lag_messages", "topic")) == {"high", "normal", "low"}
    url = metrics_url(workers.workers[0].log())
    assert url is not None
    wait_until(lambda: scrape(url).by_labels("scheduler_worker_consumer_lag_messages", "topic") == {},
               timeout_s=30, what="a lag reading of zero on every topic")
