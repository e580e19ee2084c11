"""The metrics endpoints of real `scheduler dispatcher` and `scheduler worker` processes on
the embedded backend (SQLite files, no servers), scraped over HTTP: see
`tests.metrics.check_end_to_end`. The same on the real servers:
tests/integration/test_metrics_cluster.py."""

from __future__ import annotations

import re

import pytest

from tests.dispatchers import Fleet
from tests.metrics import check_end_to_end
from tests.unit.test_observability import DOCS, referenced_metrics
from tests.workers import Workers


@pytest.mark.timeout(180)
def test_what_the_endpoints_say_adds_up_to_every_task_fired_once_and_handled_once(
    embedded: tuple[Fleet, Workers],
) -> None:
    result = check_end_to_end(*embedded, tasks=600)
    assert sum(s.value("scheduler_dispatcher_shards_held") for s in result.dispatchers) == 64
    exported = result.dispatchers[0].exportable() | result.worker.exportable()
    # What deploy/observability's rules and dashboard query is what the processes export,
    queried = referenced_metrics()
    assert queried - exported == set()
    # and docs/metrics.md lists every family of ours they export, and no other.
    ours = {name for name in result.dispatchers[0].names() | result.worker.names() if name.startswith("scheduler_")}
    documented = set(re.findall(r"`(scheduler_(?:dispatcher|worker)_[a-z0-9_]+)`", DOCS.read_text()))
    assert {re.sub(r"_total$", "", name) for name in documented} == ours
