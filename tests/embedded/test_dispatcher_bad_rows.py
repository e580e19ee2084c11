"""A row that is not a task, after 2,000 good ones in the same partition, read by a real
`scheduler dispatcher` process on the embedded backend: every good task is published
once, the bad row goes to the dead-letter topic (listed by `scheduler dlq list` with its
reason, its letter holding its columns), the shard's cursor moves past it, and the
dispatcher keeps running."""

from __future__ import annotations

import os
import time
from collections import Counter
from pathlib import Path

import pytest

from scheduler.adapters.embedded.queue import SqliteQueue
from scheduler.adapters.embedded.store import SqliteTaskStore
from scheduler.cli import Exit
from scheduler.handoff import LogHandoff
from scheduler.model import TaskId, from_ms
from scheduler.producer import Client
from tests.bad_rows import assert_dead_lettered, bad_partition
from tests.contract.test_task_store import write_unreadable_row
from tests.dispatcher_rig import KAFKA, published_ids
from tests.dispatchers import Fleet
from tests.support import run_cli, wait_until

pytestmark = pytest.mark.timeout(180)

SHARD = 5


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def test_an_unreadable_row_after_2000_good_ones_is_dead_lettered_and_the_shard_goes_on(tmp_path: Path) -> None:
    db = tmp_path / "tasks.db"
    store = SqliteTaskStore(db)
    queue = SqliteQueue(db.with_name("queue.db"))
    env = {"SCHEDULER_BACKEND": "embedded", "SCHEDULER_DB": str(db), "SCHEDULER_LEASE_TIMEOUT_S": "2"}
    fleet = Fleet(env, tmp_path)
    try:
        case = bad_partition(store.shard_count, SHARD, now_ms())
        assert store.insert(case.before) == []
        write_unreadable_row(store, case.bad)
        assert store.insert(case.after) == []
        dispatcher = fleet.start("d")

        def published() -> Counter[TaskId]:
            return Counter(published_ids(queue))

        wait_until(lambda: case.good_ids <= set(published()), timeout_s=90,
                   what=f"the {len(case.good)} good tasks to be published")
        wait_until(lambda: (store.read_shard(SHARD).fired_through_ms or 0) >= case.after[-1].run_at_ms,
                   timeout_s=30, what="the shard's cursor to pass the bad row and the rows after it")
        wait_until(lambda: dispatcher.stats().get("stats", {}).get("bad_rows", 0) >= 1, timeout_s=10,
                   what="the stats file to count the bad row")

        # It keeps running: a task submitted now fires too.
        client = Client(store, tenant="college", handoff=LogHandoff(queue.handoff_log(store.shard_count)))
        later = client.submit("sms", {"n": 1}, run_at=from_ms(now_ms() + 1_000))
        wait_until(lambda: later in published(), timeout_s=30, what="a task submitted afterwards to fire")
        assert dispatcher.alive(), dispatcher.log()[-3000:]

        listed = run_cli("dlq", "list", "--json", env={**os.environ, **env})
        assert listed.returncode == Exit.OK, listed.stderr
        assert_dead_lettered(listed.stdout, queue.scanner().scan(KAFKA.dead_letter_topic), case)
        counts = published()
        assert {counts[task.id] for task in case.good} == {1}, "one owner published a task twice"
    finally:
        fleet.stop_all()
        queue.close()
        store.close()
