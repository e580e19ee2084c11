"""The dispatcher with its release gate, on fakes of the ports (no threads, no servers):
a task that waits in the gate is never left behind, and a cancel reaches it."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from scheduler import handoff
from scheduler.dispatcher.passes import LimitsPass
from scheduler.dispatcher.rows import topic_tags
from scheduler.dispatcher.runtime import Dispatcher, DispatcherConfig
from scheduler.errors import StoreError, StoreUnavailable
from scheduler.fairness.limits import Limits, TenantLimits
from scheduler.model import Task, TaskId, decode_message
from scheduler.ports import HandoffRecord, Lease

NOW = 1_800_000_000_000
SHARDS = 4


class Coordinator:
    def is_valid(self, lease: Lease) -> bool:
        return True

    def release(self, lease: Lease) -> None:
        pass

    def confirm(self, lease: Lease) -> bool:
        return True


class Store:
    shard_count = SHARDS

    def __init__(self) -> None:
        self.advanced: list[tuple[int, int]] = []

    def read_partition(self, *args: Any, **kwargs: Any) -> Iterator[Any]:
        return iter(())

    def count_partition(self, *args: Any, **kwargs: Any) -> int:
        return 0

    def count_buckets(self, *args: Any, **kwargs: Any) -> dict[int, int]:
        return {}

    def advance_shard(self, shard: int, token: int, through: int, baselines: dict[int, int] | None = None) -> bool:
        self.advanced.append((shard, through))
        return True


class Publisher:
    def __init__(self) -> None:
        self.sent: list[bytes] = []

    def publish(self, topic: str, values: Sequence[bytes], timestamp_ms: int | None = None) -> None:
        self.sent += values

    def flush(self, timeout_s: float) -> None:
        pass


class Reader:
    def __init__(self) -> None:
        self.pending: list[HandoffRecord] = []
        self.committed: dict[int, int] = {}

    def assign(self, shard: int) -> None:
        pass

    def unassign(self, shard: int) -> None:
        pass

    def poll(self, max_records: int, timeout_s: float) -> list[HandoffRecord]:
        out, self.pending = self.pending, []
        return out

    def commit(self, positions: dict[int, int]) -> None:
        self.committed.update(positions)


class Rig:
    def __init__(self) -> None:
        self.now = NOW
        self.store, self.publisher, self.reader = Store(), Publisher(), Reader()
        self.dispatcher = Dispatcher(
            DispatcherConfig(member="a", advance_interval_ms=0, commit_interval_ms=0), store=self.store,  # type: ignore[arg-type]
            coordinator=Coordinator(), publisher=self.publisher, handoff_reader=self.reader,  # type: ignore[arg-type]
            topics=topic_tags({name: name for name in ("high", "normal", "low", "long")}), clock=lambda: self.now)
        inline = lambda job, *args: job(*args)  # noqa: E731  (jobs run at once, in order)
        self.dispatcher.ctx.readers.submit = self.dispatcher.ctx.writers.submit = inline  # type: ignore[method-assign,assignment]
        self.dispatcher.ctx.lookers.submit = inline  # type: ignore[method-assign,assignment]

    def hold(self, shard: int, cursor_ms: int) -> None:
        self.dispatcher.ownership.shard_started(Lease(shard, 7, 1), cursor_ms)
        owned = self.dispatcher.shards[shard]
        owned.loaded_through_ms = owned.verified_through_ms = cursor_ms + 60_000

    def published_ids(self) -> set[TaskId]:
        return {decode_message(value).task.id for value in self.publisher.sent}


def task_of(shard: int, run_at_ms: int, tenant: str = "slow") -> Task:
    while True:
        task_id = TaskId.new(run_at_ms)
        if task_id.shard(SHARDS) == shard:
            return Task(task_id, tenant, "sms", b"\x90", run_at_ms)


def test_a_handed_off_task_behind_the_cursor_keeps_its_hand_off_record_while_it_waits_in_the_gate() -> None:
    rig = Rig()
    rig.dispatcher.gate.set_limits(Limits(tenants={"slow": TenantLimits(rate=4)}))  # 1 a second at 1/4 of the shards
    rig.hold(0, NOW - 1)
    rig.now = NOW + 2000  # the shard counts toward the share
    first, late = task_of(0, NOW - 300), task_of(0, NOW - 200)  # both submitted into the past
    rig.reader.pending = [HandoffRecord(0, 40, handoff.encode_task(first)),
                          HandoffRecord(0, 41, handoff.encode_task(late))]
    rig.dispatcher._tick()
    assert rig.published_ids() == {first.id} and rig.dispatcher.gate.waiting == 1
    assert rig.reader.committed.get(0, 0) <= 41, "the record of the waiting task must be read again by a new owner"
    rig.dispatcher.ownership.give_back(0)
    assert rig.reader.committed.get(0, 0) <= 41
    assert rig.store.advanced == []  # no cursor written: it cannot move back below the task waiting behind it
    # once it is out, the position moves on
    rig2 = Rig()
    rig2.dispatcher.gate.set_limits(Limits(tenants={"slow": TenantLimits(rate=4)}))
    rig2.hold(0, NOW - 1)
    rig2.now = NOW + 2000
    rig2.reader.pending = [HandoffRecord(0, 40, handoff.encode_task(first)),
                           HandoffRecord(0, 41, handoff.encode_task(late))]
    rig2.dispatcher._tick()
    rig2.now += 1100
    rig2.dispatcher._tick()
    assert rig2.published_ids() == {first.id, late.id}
    rig2.now += 1100
    rig2.dispatcher._tick()
    assert rig2.reader.committed[0] == 42


def test_a_cancel_reaches_a_task_waiting_in_the_gate() -> None:
    rig = Rig()
    rig.dispatcher.gate.set_limits(Limits(tenants={"slow": TenantLimits(rate=4)}))
    rig.hold(1, NOW - 1)
    rig.now = NOW + 2000
    a, b = task_of(1, NOW + 2050), task_of(1, NOW + 2060)
    rig.reader.pending = [HandoffRecord(1, 0, handoff.encode_task(a)), HandoffRecord(1, 1, handoff.encode_task(b))]
    rig.now += 500
    rig.dispatcher._tick()
    assert rig.published_ids() == {a.id} and rig.dispatcher.gate.waiting == 1
    rig.reader.pending = [HandoffRecord(1, 2, handoff.encode_cancel(b.id))]
    for _ in range(3):
        rig.now += 1000
        rig.dispatcher._tick()
    assert rig.published_ids() == {a.id}, "the cancelled task was published"
    assert rig.dispatcher.gate.waiting == 0 and rig.dispatcher.gate.floor(1) is None


class UnreadableLimits:
    def __init__(self) -> None:
        self.reads = 0

    def read(self) -> Limits:
        self.reads += 1
        raise StoreError("the limits table cannot be read")


def test_limits_that_cannot_be_read_at_start_stop_the_dispatcher_before_it_joins() -> None:
    rig = Rig()
    store = UnreadableLimits()
    rig.dispatcher.limits = LimitsPass(rig.dispatcher.ctx, rig.dispatcher.gate, store)  # type: ignore[arg-type]
    with pytest.raises(StoreUnavailable, match="limits could not be read"):
        rig.dispatcher.load_limits(attempts=2)
    assert store.reads == 2


def test_the_hand_off_writers_clocks_are_measured_from_the_records_stamps(caplog: pytest.LogCaptureFixture) -> None:
    rig = Rig()
    rig.hold(2, NOW - 1)
    ahead, behind = task_of(2, NOW + 10_000), task_of(2, NOW + 20_000)
    rig.reader.pending = [HandoffRecord(2, 0, handoff.encode_task(ahead), NOW + 5_000),  # a clock 5 s ahead
                          HandoffRecord(2, 1, handoff.encode_task(behind), NOW - 2_000)]
    rig.dispatcher._tick()
    stats = rig.dispatcher.stats
    assert stats.handoff_clock_ahead == 1
    assert "5000 ms ahead of this dispatcher's clock" in caplog.text
    rig.now += 61_000  # the window closes: its least lag is the clock ahead's
    rig.reader.pending = [HandoffRecord(2, 2, handoff.encode_task(task_of(2, NOW + 90_000)), NOW + 61_000)]
    rig.dispatcher._tick()
    assert stats.handoff_min_lag_ms == -5_000
