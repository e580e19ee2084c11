"""The release gate: deficit round robin by weight, priorities within a tenant, caps with
completions and hold expiry, shares of rates and caps, and the cursor floor."""

from __future__ import annotations

from collections import Counter

from scheduler.fairness.gate import Release, ReleaseGate, cap_share
from scheduler.fairness.limits import Limits, TenantLimits
from scheduler.model import MESSAGE_ID_SLICE, Priority, Task, TaskId, decode_message, encode_message

SHARDS = 4
T0 = 1_800_000_000_000


def due(tenant: str, n: int, *, run_at: int = T0, cost: int = 1, priority: Priority = Priority.NORMAL) -> list[
        tuple[int, int, bytes]]:
    entries = []
    for _ in range(n):
        task = Task(TaskId.new(run_at), tenant, "sms", b"\x90", run_at, priority=priority, cost=cost)
        entries.append((run_at, priority.code, encode_message(task, 7)))
    return entries


def gate_holding_every_shard(limits: Limits, **options: int) -> ReleaseGate:
    gate = ReleaseGate(SHARDS, **options)
    gate.set_limits(limits)
    for shard in range(SHARDS):
        gate.take_shard(shard, T0 - 5000)
    return gate


def messages(release: Release) -> list[Task]:
    return [decode_message(item).task for by_tag in release.by_shard.values() for items in by_tag.values()
            for item in items]


def settle(gate: ReleaseGate, release: Release) -> None:
    for shard, waiting in release.waiting.items():
        gate.published(shard, waiting)


def run(gate: ReleaseGate, start: int, seconds: float, tick: int = 100) -> list[tuple[int, Task]]:
    out = []
    for now in range(start, start + int(seconds * 1000), tick):
        release = gate.release(now)
        out += [(now, task) for task in messages(release)]
        settle(gate, release)
    return out


def test_nothing_limited_means_no_gate() -> None:
    gate = ReleaseGate(SHARDS)
    assert gate.bypass
    gate.set_limits(Limits(tenants={"board": TenantLimits(weight=3)}))
    assert gate.bypass, "weights alone hold nothing back"
    gate.set_limits(Limits(global_rate=100))
    assert not gate.bypass


def test_tenants_without_limits_pass_through_when_there_is_no_global_rate() -> None:
    gate = gate_holding_every_shard(Limits(tenants={"board": TenantLimits(rate=10)}))
    passed = gate.admit(0, due("college", 3) + due("board", 5))
    assert sum(len(v) for v in passed.values()) == 3
    assert gate.waiting == 5


def test_the_small_tenant_is_served_in_its_first_turn_while_the_big_one_drains_at_the_global_rate() -> None:
    gate = gate_holding_every_shard(Limits(global_rate=200))
    for shard in range(SHARDS):
        gate.admit(shard, due("board", 1000))
    gate.admit(1, due("college", 50, priority=Priority.HIGH))
    released = run(gate, T0, 10)
    college = [at for at, task in released if task.tenant == "college"]
    board = [at for at, task in released if task.tenant == "board"]
    assert len(college) == 50
    assert max(college) - T0 <= 1000, "all 50 within the first second"
    assert 1900 <= len(board) + len(college) <= 2000 + 20, "the global rate: ~200 a second for 10 s"


def test_weights_share_the_global_rate_in_proportion() -> None:
    gate = gate_holding_every_shard(Limits(tenants={"big": TenantLimits(weight=3)}, global_rate=1000))
    for shard in range(SHARDS):
        gate.admit(shard, due("big", 5000) + due("small", 5000))
    released = run(gate, T0, 20)
    counts = Counter(task.tenant for _, task in released)
    ratio = counts["big"] / counts["small"]
    assert abs(ratio - 3) / 3 <= 0.10, counts


def test_weights_count_cost_units_not_tasks() -> None:
    gate = gate_holding_every_shard(Limits(global_rate=2000))
    gate.admit(0, due("board", 200, cost=500) + due("city", 20000))
    released = run(gate, T0, 15)  # both still have work after 15 s
    units: Counter[str] = Counter()
    for _, task in released:
        units[task.tenant] += task.cost
    assert abs(units["board"] / units["city"] - 1) <= 0.10, units


def test_priorities_are_served_seven_two_one_within_a_tenant() -> None:
    gate = gate_holding_every_shard(Limits(global_rate=100))
    gate.admit(0, due("t", 300, priority=Priority.LOW) + due("t", 300, priority=Priority.NORMAL)
               + due("t", 300, priority=Priority.HIGH))
    released = run(gate, T0, 5)
    served = Counter(task.priority for _, task in released[:400])
    assert served[Priority.HIGH] == 280 and served[Priority.NORMAL] == 80 and served[Priority.LOW] == 40


def test_a_cap_holds_until_completions_come_back() -> None:
    gate = gate_holding_every_shard(Limits(tenants={"t": TenantLimits(cap=5)}))
    gate.admit(0, due("t", 20))
    first = gate.release(T0)
    assert first.count == 5
    assert gate.release(T0 + 100).count == 0
    ids = [item[MESSAGE_ID_SLICE] for items in first.by_shard[0].values() for item in items]
    assert gate.completed(ids[:2]) == 2
    assert gate.completed(ids[:2]) == 0, "a completion counts once"
    assert gate.release(T0 + 200).count == 2


def test_a_place_whose_completion_never_comes_is_freed_at_the_hold_timeout() -> None:
    gate = gate_holding_every_shard(Limits(tenants={"t": TenantLimits(cap=3)}), hold_timeout_ms=30_000)
    gate.admit(0, due("t", 10))
    assert gate.release(T0).count == 3
    assert gate.release(T0 + 29_000).count == 0
    assert gate.release(T0 + 30_000).count == 3
    assert gate.snapshot()["t"]["expired_holds"] == 3


def test_a_dispatcher_enforces_its_share_of_caps_and_rates() -> None:
    assert cap_share(10, 0.5) == 5
    assert cap_share(3, 0.25) == 1, "never shut out"
    assert cap_share(3, 0.0) == 0
    gate = ReleaseGate(SHARDS)
    gate.set_limits(Limits(tenants={"t": TenantLimits(cap=8)}, global_rate=400))
    gate.take_shard(0, T0)
    gate.take_shard(1, T0)
    gate.admit(0, due("t", 100))
    assert gate.release(T0 + 999).count == 0, "a shard counts a window after it was taken"
    assert gate.share(T0 + 1000) == 0.5
    assert gate.release(T0 + 1000).count == 4


def test_the_global_rate_holds_in_every_window_of_release_stamps() -> None:
    gate = gate_holding_every_shard(Limits(global_rate=300))
    gate.admit(0, due("a", 3000) + due("b", 3000, cost=7))
    stamps: list[tuple[int, int]] = []
    for now in range(T0, T0 + 8000, 100):
        release = gate.release(now + now % 7)  # ticks a little irregular
        assert release.at_ms == now + now % 7
        stamps += [(release.at_ms, task.cost) for task in messages(release)]
        settle(gate, release)
    stamps.sort()
    worst = 0
    for i, (start, _) in enumerate(stamps):
        worst = max(worst, sum(c for at, c in stamps[i:] if at < start + 1000))
    assert 0 < worst <= 300


def test_waiting_tasks_hold_the_cursor_until_acknowledged() -> None:
    gate = gate_holding_every_shard(Limits(tenants={"t": TenantLimits(cap=3)}))
    assert gate.floor(2) is None
    gate.admit(2, due("t", 3, run_at=T0 + 500) + due("t", 3, run_at=T0 + 900))
    assert gate.floor(2) == T0 + 499
    release = gate.release(T0 + 1000)
    assert release.count == 3
    assert gate.floor(2) == T0 + 499, "released but not acknowledged"
    settle(gate, release)
    assert gate.floor(2) == T0 + 899, "the three due at +900 still wait for places"
    assert gate.drop_shard(2) == 3
    assert gate.floor(2) is None and gate.waiting == 0


def test_a_task_far_costlier_than_a_turn_is_reached_in_a_few_steps_and_weights_still_hold() -> None:
    gate = gate_holding_every_shard(Limits(tenants={"big": TenantLimits(weight=3)}, global_rate=10_000_000))
    gate.admit(0, due("big", 40, cost=1_000_000) + due("small", 40, cost=1_000_000))
    release = gate.release(T0)  # the pace lets a tick's worth out: 1,000,000 units
    assert release.count >= 1
    units = Counter(task.tenant for task in messages(release))
    released = run(gate, T0 + 100, 5)
    units.update(task.tenant for _, task in released)
    assert abs(units["big"] / units["small"] / 3 - 1) <= 0.15, units


def test_a_tenant_held_back_by_its_own_rate_hoards_no_credit() -> None:
    gate = gate_holding_every_shard(Limits(tenants={"a": TenantLimits(rate=5)}, global_rate=100))
    gate.admit(0, due("a", 8000) + due("b", 8000))
    run(gate, T0, 60)
    gate.set_limits(Limits(global_rate=100))  # a's own rate is lifted
    released = run(gate, T0 + 60_000, 10)
    counts = Counter(task.tenant for _, task in released)
    assert abs(counts["a"] / counts["b"] - 1) <= 0.10, counts


def test_a_shard_given_back_frees_the_places_of_its_running_tasks() -> None:
    gate = gate_holding_every_shard(Limits(tenants={"t": TenantLimits(cap=4)}))
    gate.admit(0, due("t", 2))
    gate.admit(1, due("t", 6))
    first = gate.release(T0)
    assert first.count == 4
    running_on_0 = len(first.waiting.get(0, []))
    assert running_on_0 > 0
    gate.drop_shard(0)
    # the places of shard 0's tasks are freed (their completions go to its next owner)
    assert gate.snapshot()["t"]["running"] == 4 - running_on_0


def test_a_message_the_gate_cannot_read_passes_through_to_be_dead_lettered() -> None:
    gate = gate_holding_every_shard(Limits(global_rate=10))
    passed = gate.admit(0, [(T0, 1, b"\x93garbage")] + due("t", 1))
    assert passed == {1: [b"\x93garbage"]} and gate.waiting == 1


def test_tenants_with_nothing_left_are_forgotten_and_one_still_paced_is_not() -> None:
    gate = gate_holding_every_shard(Limits(tenants={"slow": TenantLimits(rate=1)}, global_rate=1000))
    gate.admit(0, due("quick", 5) + due("slow", 1, cost=100))
    run(gate, T0, 1)
    assert set(gate.snapshot()) == {"quick", "slow"}
    gate.release(T0 + 61_000)
    assert set(gate.snapshot()) == {"slow"}, "slow's pace runs 100 s past its release: it must not start afresh"


def test_a_cancelled_task_waiting_in_the_gate_leaves_without_spending_the_rate() -> None:
    gate = gate_holding_every_shard(Limits(global_rate=100))
    board = due("board", 20, cost=50)
    gate.admit(0, board + due("gold", 1000))
    for _, _, item in board:
        gate.cancel(0, item[MESSAGE_ID_SLICE])
    released = run(gate, T0, 10)
    assert {task.tenant for _, task in released} == {"gold"}
    assert len(released) >= 950, "gold had the whole rate: ~100 a second for 10 s"
    assert gate.snapshot()["board"]["cancelled"] == 20


def test_a_cancel_for_a_shard_with_nothing_waiting_is_not_remembered() -> None:
    gate = gate_holding_every_shard(Limits(global_rate=100))
    gate.cancel(3, b"\x01" * 16)
    assert not gate._cancelled
