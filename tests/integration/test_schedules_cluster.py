"""Recurring schedules on the real Cassandra, Kafka and ZooKeeper: `scheduler schema
apply` adds the schedules table to a keyspace made before it; two creators racing on
Cassandra's lightweight transactions make one task per slot; and, with real dispatcher
processes, a `* * * * *` schedule added through the CLI has exactly one task for each
of its next two minute boundaries, fired and never early, across a kill -9 of the
dispatcher that held the schedule's shard. (A message may be repeated while a shard
changes hands, as for any task; the task is one.)"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial

import pytest

from scheduler.adapters.cassandra import schema
from scheduler.adapters.cassandra.connection import CassandraConnection
from scheduler.adapters.cassandra.schedules import CassandraScheduleStore
from scheduler.adapters.cassandra.store import CassandraTaskStore
from scheduler.cli import Exit
from scheduler.model import Partition, TaskId, minute_bucket
from scheduler.producer import Client
from scheduler.recurring.jitter import jitter_ms
from scheduler.recurring.runner import ScheduleRunner
from scheduler.recurring.schedule import Schedule, new_schedule, run_key, schedule_id, schedule_shard
from scheduler.settings import CassandraSettings
from tests.cluster import Cluster, unique_name
from tests.dispatchers import Deployment, by_id
from tests.support import all_at_once, run_cli, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(330)]

MINUTE_MS = 60_000


def run_id(schedule: Schedule, slot_ms: int) -> TaskId:
    run_at = slot_ms + jitter_ms(schedule.id, slot_ms, schedule.jitter_s)
    return TaskId.for_key(run_at, schedule.tenant, run_key(schedule.id, slot_ms))


@pytest.fixture
def spare_keyspace(cassandra: CassandraConnection) -> Iterator[str]:
    name = unique_name("t")
    yield name
    cassandra.session.execute(f"DROP KEYSPACE IF EXISTS {name}")


def test_schema_apply_adds_the_schedules_table_to_a_keyspace_made_before_it(
    cluster: Cluster, cassandra: CassandraConnection, spare_keyspace: str
) -> None:
    settings = CassandraSettings(hosts=cluster.cassandra.hosts, port=cluster.cassandra.port, keyspace=spare_keyspace)
    text = schema.schema_text()
    old_text = text[:text.index("-- Recurring schedules")]
    for statement in schema.render(spare_keyspace, settings.replication, old_text):
        cassandra.session.execute(statement)
    tables = {row.table_name for row in cassandra.session.execute(
        "SELECT table_name FROM system_schema.tables WHERE keyspace_name = %s", (spare_keyspace,))}
    assert "schedules" not in tables

    schema.apply(cassandra, settings)
    store = CassandraTaskStore.open(settings)
    try:
        schedules = CassandraScheduleStore.for_store(store)
        made = new_schedule(tenant="college", name="nightly", cron="0 2 * * *", zone="Asia/Kolkata", type="report",
                            now_ms=1_790_000_000_000)
        assert schedules.create(made) and schedules.get(made.id) == made
    finally:
        store.close()


@dataclass
class ManualClock:
    now_ms: int

    def __call__(self) -> int:
        return self.now_ms


def test_creators_racing_on_cassandra_make_one_task_per_slot(keyspace: CassandraSettings) -> None:
    store = CassandraTaskStore.open(keyspace)
    try:
        schedules = CassandraScheduleStore.for_store(store)
        clock = ManualClock(1_790_000_000_000 - 1_790_000_000_000 % 3_600_000)  # on the hour
        made = [new_schedule(tenant="college", name=f"job{i}", cron="*/5 * * * *", zone="Europe/London",
                             type="report", jitter_s=20, now_ms=clock.now_ms - 1) for i in range(8)]
        for schedule in made:
            assert schedules.create(schedule)
        both_read = threading.Barrier(2)

        class ReadThenWait(CassandraScheduleStore):
            def list_shard(self, shard: int) -> list[Schedule]:
                found = super().list_shard(shard)
                both_read.wait(timeout=60)
                return found

        racers = [ScheduleRunner(ReadThenWait.for_store(store), Client(store, now_ms=clock), clock=clock) for _ in range(2)]
        shards = sorted({s.shard(store.shard_count) for s in made})
        for step in range(3):  # :00, :05, :10
            clock.now_ms = made[0].next_slot_ms + step * 5 * MINUTE_MS
            for shard in shards:
                results = all_at_once([partial(racer.run_shard, shard, 1) for racer in racers])
                assert sum(r.advanced for r in results) == sum(1 for s in made if s.shard(store.shard_count) == shard)
        slots = [made[0].next_slot_ms + k * 5 * MINUTE_MS for k in range(3)]
        for schedule in made:
            found = store.get_many([run_id(schedule, slot) for slot in slots])
            assert len(found) == 3
            stored = schedules.get(schedule.id)
            assert stored is not None and stored.next_slot_ms == slots[-1] + 5 * MINUTE_MS
    finally:
        store.close()


def rows_of_slot(store: CassandraTaskStore, schedule: Schedule, slot_ms: int) -> list[TaskId]:
    """Every task row, in any shard, that the schedule's run of `slot_ms` could be."""
    key = run_key(schedule.id, slot_ms)
    found = []
    for bucket in {minute_bucket(slot_ms), minute_bucket(slot_ms + schedule.jitter_s * 1000)}:
        for shard in range(store.shard_count):
            found += [row.task.id for row in store.read_partition(Partition(bucket, shard))
                      if row.task.idempotency_key == key]
    return found


def test_a_minutely_schedule_fires_each_slot_once_across_a_dispatcher_kill(deployment: Deployment) -> None:
    fleet = deployment.fleet
    a, b = fleet.start("a"), fleet.start("b")
    fleet.wait_for_split({"a": 32, "b": 32}, timeout_s=60)
    shard = schedule_shard(schedule_id("college", "every-minute"), deployment.store.shard_count)
    owner, survivor = (a, b) if shard in a.shards() else (b, a)
    env = {**os.environ, **fleet.env}
    added = run_cli("schedule", "add", "every-minute", "--tenant", "college", "--cron", "* * * * *",
                    "--zone", "Asia/Kolkata", "--type", "ping", "--payload", '{"n": 1}', "--misfire", "all", env=env)
    assert added.returncode == Exit.OK, added.stderr
    # The holder of the schedule's shard dies within its first creation pass, or just before it.
    owner.signal(signal.SIGKILL)
    schedules = CassandraScheduleStore.for_store(deployment.store)
    schedule = schedules.get(schedule_id("college", "every-minute"))
    assert schedule is not None
    first, second = schedule.next_slot_ms, schedule.next_slot_ms + MINUTE_MS
    assert first % MINUTE_MS == 0 and first == schedule.rule.next_slot(schedule.created_ms)

    fleet.wait_for_split({survivor.name: 64}, timeout_s=30)
    published = deployment.ready.wait_for({run_id(schedule, first), run_id(schedule, second)}, timeout_s=150)
    wait_until(lambda: (schedules.get(schedule.id) or schedule).next_slot_ms > second, timeout_s=30,
               what="the schedule to move past its second slot")
    for slot in (first, second):
        assert rows_of_slot(deployment.store, schedule, slot) == [run_id(schedule, slot)]  # one task per slot
        stored = deployment.store.get(run_id(schedule, slot))
        assert stored is not None and stored.task.type == "ping" and stored.task.tenant == "college"
    assert survivor.stats()["stats"]["schedule_passes"] > 0
    assert {task_id for task_id, _ in by_id(published)} == {run_id(schedule, first), run_id(schedule, second)}
    for task_id, messages in by_id(published):
        assert task_id.run_at_ms % MINUTE_MS == 0  # only the schedule's runs were published, on slots
        assert min(m.at_ms for m in messages) >= task_id.run_at_ms  # never early
    listed = run_cli("schedule", "list", "--tenant", "college", env=env)
    assert listed.returncode == Exit.OK and "college/every-minute" in listed.stdout
