"""The `WorkflowStore` contract (`scheduler.ports`), run against every adapter: the
embedded SQLite store (in the task store's file) and the Cassandra store on the real
server (fresh keyspace, on the task store's session)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from functools import partial
from pathlib import Path

import pytest

from scheduler.adapters.embedded.store import SqliteTaskStore
from scheduler.adapters.embedded.workflows import SqliteWorkflowStore
from scheduler.model import TaskId
from scheduler.ports import WHOLE, Claim, Member, MemberOutcome, WorkflowRecord, WorkflowState, WorkflowStore
from scheduler.retention import workflow_kept_s
from scheduler.settings import DEAD_LETTER_RETENTION_MS
from tests.support import all_at_once, wait_until

pytestmark = pytest.mark.timeout(120)

NOW_MS = 1_790_000_000_000
TENANT = "college"
RUNNING, SUCCEEDED, FAILED, CANCELLED = (WorkflowState.RUNNING, WorkflowState.SUCCEEDED, WorkflowState.FAILED,
                                         WorkflowState.CANCELLED)
DONE, DEAD = MemberOutcome.DONE, MemberOutcome.DEAD


@pytest.fixture(params=["sqlite", pytest.param("cassandra", marks=pytest.mark.integration)])
def workflows(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[WorkflowStore]:
    if request.param == "sqlite":
        tasks = SqliteTaskStore(tmp_path / "tasks.db")
        store: WorkflowStore = SqliteWorkflowStore(tmp_path / "tasks.db")
        close = tasks.close
    else:
        from scheduler.adapters.cassandra.store import CassandraTaskStore
        from scheduler.adapters.cassandra.workflows import CassandraWorkflowStore

        cassandra = CassandraTaskStore.open(request.getfixturevalue("keyspace"))
        store = CassandraWorkflowStore.for_store(cassandra)
        close = cassandra.close
    try:
        yield store
    finally:
        store.close()
        close()


def record(workflow_id: str = "wf-1", tenant: str = TENANT, definition: bytes = b"\x81\xa5steps\x90",
           state: WorkflowState = RUNNING) -> WorkflowRecord:
    return WorkflowRecord(tenant, workflow_id, definition, state, created_ms=NOW_MS)


def member(step: str, index: int = 0, outcome: MemberOutcome = DONE, attempt: int = 1,
           error: str | None = None) -> Member:
    task_id = TaskId.for_key(NOW_MS, TENANT, f"{step}/{index}")
    return Member(step, index, outcome, task_id, attempt, NOW_MS + 1000 * attempt, error)


def created(workflows: WorkflowStore, workflow_id: str = "wf-1", tenant: str = TENANT) -> WorkflowRecord:
    stored = workflows.create(record(workflow_id, tenant))
    assert stored == record(workflow_id, tenant)
    return stored


def by_key(members: list[Member]) -> list[Member]:
    return sorted(members, key=lambda m: (m.step, m.index))


def test_creating_a_workflow_twice_keeps_and_returns_the_first(workflows: WorkflowStore) -> None:
    first = created(workflows)
    again = workflows.create(replace(record(definition=b"other"), created_ms=NOW_MS + 5))
    assert again == first
    assert workflows.read(TENANT, "wf-1") == first


def test_an_unknown_workflow_reads_as_none(workflows: WorkflowStore) -> None:
    assert workflows.read(TENANT, "nope") is None
    assert workflows.transition(TENANT, "nope", (RUNNING,), CANCELLED, NOW_MS) is None
    assert workflows.claim(TENANT, "nope", "a", WHOLE, NOW_MS, RUNNING) is None
    assert workflows.members(TENANT, "nope") == [] and workflows.claims(TENANT, "nope") == []
    assert workflows.results(TENANT, "nope", "a") == {}


def test_recording_a_member_twice_keeps_one_and_a_later_outcome_replaces_it(workflows: WorkflowStore) -> None:
    created(workflows)
    dead = member("a", 0, DEAD, attempt=3, error="boom")
    workflows.record_member(TENANT, "wf-1", dead, None)
    workflows.record_member(TENANT, "wf-1", dead, None)
    assert workflows.members(TENANT, "wf-1") == [dead]
    assert workflows.results(TENANT, "wf-1", "a") == {}
    replayed = member("a", 0, DONE, attempt=4)
    workflows.record_member(TENANT, "wf-1", replayed, b"\xa2ok")
    assert workflows.members(TENANT, "wf-1") == [replayed]
    assert workflows.results(TENANT, "wf-1", "a") == {0: b"\xa2ok"}


def test_a_dead_or_cancelled_end_of_another_copy_never_undoes_a_done_one(workflows: WorkflowStore) -> None:
    """Two copies of a member ran at once (a rebalance): one succeeded, the other died or
    found the workflow cancelled after; the member stays done, with its result."""
    created(workflows)
    done = member("a", 0, DONE, attempt=1)
    workflows.record_member(TENANT, "wf-1", done, b"\xa2ok")
    workflows.record_member(TENANT, "wf-1", member("a", 0, DEAD, attempt=1, error="timeout"), None)
    workflows.record_member(TENANT, "wf-1", member("a", 0, MemberOutcome.CANCELLED, attempt=1), None)
    (stored,) = workflows.members(TENANT, "wf-1")
    assert (stored.outcome, stored.error) == (DONE, None)
    assert workflows.results(TENANT, "wf-1", "a") == {0: b"\xa2ok"}
    state, checked, result = workflows.start_check(TENANT, "wf-1", "a", 0)
    assert state is RUNNING and checked is not None and checked.outcome is DONE and result == b"\xa2ok"


def test_members_are_filtered_by_step(workflows: WorkflowStore) -> None:
    created(workflows)
    recorded = [member("a", 0), member("a", 1, DEAD, error="x"), member("b", 0), member("c", 0)]
    for each in recorded:
        workflows.record_member(TENANT, "wf-1", each, None)
    assert by_key(workflows.members(TENANT, "wf-1")) == recorded
    assert by_key(workflows.members(TENANT, "wf-1", ("c", "a"))) == [recorded[0], recorded[1], recorded[3]]
    assert workflows.members(TENANT, "wf-1", ("b", "b")) == [recorded[2]]
    assert workflows.members(TENANT, "wf-1", ("z",)) == []
    assert workflows.members(TENANT, "wf-1", ()) == []


def test_members_at_reads_the_ended_among_some_indexes_of_one_step(workflows: WorkflowStore) -> None:
    created(workflows)
    for index in (0, 2, 5):
        workflows.record_member(TENANT, "wf-1", member("a", index), None)
    workflows.record_member(TENANT, "wf-1", member("b", 1), None)
    assert [m.index for m in workflows.members_at(TENANT, "wf-1", "a", [9, 5, 1, 0, 2, 2])] == [0, 2, 5]
    assert workflows.members_at(TENANT, "wf-1", "b", [0]) == []
    assert workflows.members_at(TENANT, "wf-1", "a", []) == []


def test_results_are_by_index_and_members_without_one_are_left_out(workflows: WorkflowStore) -> None:
    created(workflows)
    workflows.record_member(TENANT, "wf-1", member("a", 0), b"r0")
    workflows.record_member(TENANT, "wf-1", member("a", 1, DEAD, error="x"), None)
    workflows.record_member(TENANT, "wf-1", member("a", 2), b"r2" * 1000)
    workflows.record_member(TENANT, "wf-1", member("b", 0), b"other step")
    assert workflows.results(TENANT, "wf-1", "a") == {0: b"r0", 2: b"r2" * 1000}
    assert workflows.results(TENANT, "wf-1", "b") == {0: b"other step"}
    assert by_key(workflows.members(TENANT, "wf-1", ("a",))) == [member("a", 0), member("a", 1, DEAD, error="x"),
                                                                  member("a", 2)]


def test_a_claim_is_won_once_and_later_claims_get_it(workflows: WorkflowStore) -> None:
    created(workflows)
    first = workflows.claim(TENANT, "wf-1", "a", WHOLE, NOW_MS + 100, RUNNING)
    assert first == Claim("a", WHOLE, NOW_MS + 100, created=False) and first.won
    again = workflows.claim(TENANT, "wf-1", "a", WHOLE, NOW_MS + 200, RUNNING)
    assert again == first and again is not None and not again.won
    member_claim = workflows.claim(TENANT, "wf-1", "a", 0, NOW_MS + 300, RUNNING)
    assert member_claim == Claim("a", 0, NOW_MS + 300, created=False)
    assert sorted(workflows.claims(TENANT, "wf-1"), key=lambda c: c.index) == [first, member_claim]


def test_one_of_many_concurrent_claims_wins_and_every_caller_gets_its_run_at(workflows: WorkflowStore) -> None:
    created(workflows)
    offered = [NOW_MS + 1000 + n for n in range(8)]
    answers = all_at_once([partial(workflows.claim, TENANT, "wf-1", "join", WHOLE, at, RUNNING) for at in offered])
    winner = answers[0]
    assert winner is not None and winner.run_at_ms in offered and not winner.created
    assert answers == [winner] * len(offered)
    assert sum(1 for answer in answers if answer is not None and answer.won) == 1
    assert workflows.claims(TENANT, "wf-1") == [winner]


def test_a_claim_needs_the_state_but_a_claim_made_stays_after_a_cancel(workflows: WorkflowStore) -> None:
    created(workflows)
    assert workflows.claim(TENANT, "wf-1", "on_failure", WHOLE, NOW_MS, FAILED) is None
    held = workflows.claim(TENANT, "wf-1", "a", WHOLE, NOW_MS, RUNNING)
    assert held is not None
    assert workflows.transition(TENANT, "wf-1", (RUNNING,), CANCELLED, NOW_MS + 1) is CANCELLED
    assert workflows.claim(TENANT, "wf-1", "b", WHOLE, NOW_MS, RUNNING) is None
    assert workflows.claim(TENANT, "wf-1", "a", WHOLE, NOW_MS + 50, RUNNING) == held
    assert workflows.claim(TENANT, "wf-1", "a", WHOLE, NOW_MS + 50, CANCELLED) == held
    assert workflows.claims(TENANT, "wf-1") == [held]


def test_a_failed_workflow_lets_its_on_failure_step_be_claimed(workflows: WorkflowStore) -> None:
    created(workflows)
    assert workflows.transition(TENANT, "wf-1", (RUNNING,), FAILED, NOW_MS + 1) is FAILED
    assert workflows.claim(TENANT, "wf-1", "next", WHOLE, NOW_MS, RUNNING) is None
    assert workflows.claim(TENANT, "wf-1", "on_failure", WHOLE, NOW_MS + 2, FAILED) == Claim(
        "on_failure", WHOLE, NOW_MS + 2, created=False)


def test_mark_created_flips_created(workflows: WorkflowStore) -> None:
    created(workflows)
    workflows.claim(TENANT, "wf-1", "a", 3, NOW_MS, RUNNING)
    workflows.mark_created(TENANT, "wf-1", "a", 3)
    done = Claim("a", 3, NOW_MS, created=True)
    assert workflows.claims(TENANT, "wf-1") == [done]
    assert workflows.claim(TENANT, "wf-1", "a", 3, NOW_MS + 9, RUNNING) == done


def test_a_transition_applies_only_from_the_given_states(workflows: WorkflowStore) -> None:
    first = created(workflows)
    assert workflows.transition(TENANT, "wf-1", (FAILED,), CANCELLED, NOW_MS + 1) is RUNNING
    assert workflows.read(TENANT, "wf-1") == first
    assert workflows.transition(TENANT, "wf-1", (RUNNING, FAILED), FAILED, NOW_MS + 2) is FAILED
    assert workflows.read(TENANT, "wf-1") == replace(first, state=FAILED, ended_ms=NOW_MS + 2)
    assert workflows.transition(TENANT, "wf-1", (FAILED,), RUNNING, NOW_MS + 3) is RUNNING  # a replay reopens it
    assert workflows.read(TENANT, "wf-1") == first
    assert workflows.transition(TENANT, "wf-1", (RUNNING,), SUCCEEDED, NOW_MS + 4) is SUCCEEDED
    assert workflows.transition(TENANT, "wf-1", (RUNNING, FAILED), CANCELLED, NOW_MS + 5) is SUCCEEDED
    assert workflows.read(TENANT, "wf-1") == replace(first, state=SUCCEEDED, ended_ms=NOW_MS + 4)


@pytest.mark.parametrize("round_", range(3))
def test_claims_and_a_cancel_are_ordered(workflows: WorkflowStore, round_: int) -> None:
    """Threads claim unit after unit while the workflow is cancelled (once some claims
    are in): what was claimed is exactly what the answers said, and once a thread is
    refused it is refused for good (no claim lands after the cancel)."""
    created(workflows)
    threads, before_cancel, after_refusal = 8, 24, 3
    answered = threading.Semaphore(0)

    def claimer(thread: int) -> list[Claim | None]:
        answers: list[Claim | None] = []
        for index in range(1000):
            answers.append(workflows.claim(TENANT, "wf-1", f"s{thread}", index, NOW_MS + index, RUNNING))
            answered.release()
            if answers[-after_refusal:] == [None] * after_refusal:
                break
        return answers

    def cancel() -> list[Claim | None]:
        for _ in range(before_cancel):
            assert answered.acquire(timeout=60)
        assert workflows.transition(TENANT, "wf-1", (RUNNING,), CANCELLED, NOW_MS) is CANCELLED
        return []

    calls: list[Callable[[], list[Claim | None]]] = [partial(claimer, thread) for thread in range(threads)]
    answers = all_at_once([*calls, cancel])
    made = [claim for thread in answers for claim in thread if claim is not None]
    assert len(made) >= before_cancel
    for thread, claims in enumerate(answers[:-1]):
        won = [claim for claim in claims if claim is not None]
        assert claims == [*won, *[None] * after_refusal], f"thread {thread} claimed after a refusal"
        assert won == [Claim(f"s{thread}", index, NOW_MS + index, False) for index in range(len(won))]
    stored = workflows.claims(TENANT, "wf-1")
    assert sorted(stored, key=lambda c: (c.step, c.index)) == sorted(made, key=lambda c: (c.step, c.index))
    assert workflows.claim(TENANT, "wf-1", "late", WHOLE, NOW_MS, RUNNING) is None


def test_start_check_tells_the_state_and_the_member(workflows: WorkflowStore) -> None:
    assert workflows.start_check(TENANT, "wf-1", "a", 0) == (None, None, None)
    created(workflows)
    assert workflows.start_check(TENANT, "wf-1", "a", 0) == (RUNNING, None, None)
    workflows.record_member(TENANT, "wf-1", member("a", 0), b"r0")
    workflows.record_member(TENANT, "wf-1", member("a", 1, DEAD, error="boom"), None)
    assert workflows.start_check(TENANT, "wf-1", "a", 0) == (RUNNING, member("a", 0), b"r0")
    assert workflows.start_check(TENANT, "wf-1", "a", 1) == (RUNNING, member("a", 1, DEAD, error="boom"), None)
    assert workflows.start_check(TENANT, "wf-1", "a", 2) == (RUNNING, None, None)
    workflows.transition(TENANT, "wf-1", (RUNNING,), CANCELLED, NOW_MS)
    assert workflows.start_check(TENANT, "wf-1", "b", 0) == (CANCELLED, None, None)


def test_the_same_workflow_id_under_two_tenants_is_two_workflows(workflows: WorkflowStore) -> None:
    ours = workflows.create(record(definition=b"ours"))
    theirs = workflows.create(record(tenant="board", definition=b"theirs"))
    assert (ours.definition, theirs.definition) == (b"ours", b"theirs")
    workflows.record_member(TENANT, "wf-1", member("a", 0), b"r0")
    claim = workflows.claim(TENANT, "wf-1", "a", WHOLE, NOW_MS, RUNNING)
    assert workflows.transition(TENANT, "wf-1", (RUNNING,), CANCELLED, NOW_MS) is CANCELLED
    assert workflows.read("board", "wf-1") == theirs
    assert workflows.members("board", "wf-1") == [] and workflows.results("board", "wf-1", "a") == {}
    assert workflows.claims("board", "wf-1") == [] and workflows.claims(TENANT, "wf-1") == [claim]
    assert workflows.start_check("board", "wf-1", "a", 0) == (RUNNING, None, None)
    assert workflows.claim("board", "wf-1", "a", WHOLE, NOW_MS + 7, RUNNING) == Claim("a", WHOLE, NOW_MS + 7, False)


KEPT_S = 2
"""The retention of the stores below: short, so that Cassandra's TTLs run out in a test."""


@pytest.fixture(params=["sqlite", pytest.param("cassandra", marks=pytest.mark.integration)])
def kept(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[WorkflowStore, Callable[[int], bool]]]:
    """A workflow store with a retention of `KEPT_S`, and `gone(at_ms)`: whether what has
    expired by `at_ms` is gone (the embedded store purges then, as the dispatcher's purge
    pass does; Cassandra's TTLs need no one, and count from the wall clock)."""
    if request.param == "sqlite":
        tasks = SqliteTaskStore(tmp_path / "tasks.db")
        sqlite = SqliteWorkflowStore(tmp_path / "tasks.db", retention_s=KEPT_S)
        try:
            yield sqlite, lambda at_ms: sqlite.purge_expired(at_ms, 1000) >= 0
        finally:
            sqlite.close()
            tasks.close()
    else:
        from scheduler.adapters.cassandra.store import CassandraTaskStore
        from scheduler.adapters.cassandra.workflows import CassandraWorkflowStore

        cassandra = CassandraTaskStore.open(request.getfixturevalue("keyspace"))
        try:
            yield CassandraWorkflowStore(cassandra.connection, cassandra.keyspace, retention_s=KEPT_S), lambda _: True
        finally:
            cassandra.close()


def filled(workflows: WorkflowStore, workflow_id: str) -> None:
    created(workflows, workflow_id)
    for index in range(3):
        workflows.record_member(TENANT, workflow_id, member("a", index), b"\xa2ok" if index else None)
    assert workflows.claim(TENANT, workflow_id, "b", WHOLE, NOW_MS, RUNNING) is not None
    workflows.mark_created(TENANT, workflow_id, "b", WHOLE)


def present(workflows: WorkflowStore, workflow_id: str) -> tuple[bool, int, int]:
    """Whether the record is there, and how many member and claim rows."""
    return (workflows.read(TENANT, workflow_id) is not None, len(workflows.members(TENANT, workflow_id)),
            len(workflows.claims(TENANT, workflow_id)))


@pytest.mark.parametrize("end", [SUCCEEDED, CANCELLED])
def test_an_ended_workflow_is_removed_the_retention_after_its_end_and_a_running_one_never(
    kept: tuple[WorkflowStore, Callable[[int], bool]], end: WorkflowState
) -> None:
    """Record, members and claims go together, all of them (a row left behind would be a
    leak no one removes); nothing of a running workflow expires, however long it runs."""
    workflows, gone = kept
    filled(workflows, "ending")
    filled(workflows, "running")
    assert workflows.transition(TENANT, "ending", (RUNNING,), end, NOW_MS) is end
    assert gone(NOW_MS + KEPT_S * 1000 - 1) and present(workflows, "ending") == (True, 3, 1)
    wait_until(lambda: gone(NOW_MS + KEPT_S * 1000) and present(workflows, "ending") == (False, 0, 0),
               timeout_s=15, interval_s=0.2, what="the ended workflow to expire")
    assert gone(NOW_MS + 365 * 86_400_000) and present(workflows, "running") == (True, 3, 1)


def test_a_failed_workflow_is_kept_while_a_replay_may_open_it_and_an_opened_one_for_good(
    kept: tuple[WorkflowStore, Callable[[int], bool]]
) -> None:
    """A replay of a dead member opens its failed workflow again (dead letters are kept 30
    days), and opened, the workflow runs again: nothing of it may expire."""
    workflows, gone = kept
    filled(workflows, "failed")
    filled(workflows, "reopened")
    for workflow_id in ("failed", "reopened"):
        assert workflows.transition(TENANT, workflow_id, (RUNNING,), FAILED, NOW_MS) is FAILED
    assert workflows.transition(TENANT, "reopened", (FAILED,), RUNNING, NOW_MS + 1) is RUNNING
    kept_ms = workflow_kept_s(KEPT_S, reopenable=True) * 1000
    assert kept_ms > DEAD_LETTER_RETENTION_MS
    time.sleep(KEPT_S + 1.5)  # past the retention: a TTL of it would have run out on Cassandra
    assert gone(NOW_MS + kept_ms - 1) and present(workflows, "failed") == (True, 3, 1)
    assert gone(NOW_MS + 365 * 86_400_000) and present(workflows, "reopened") == (True, 3, 1)


def test_a_member_ending_after_its_workflow_keeps_it_the_retention_from_then(tmp_path: Path) -> None:
    """A step still running when its workflow was cancelled ends later: the workflow, its
    row with it, is kept the retention from that end (embedded; see the Cassandra
    adapter's docstring for its one leak)."""
    tasks = SqliteTaskStore(tmp_path / "tasks.db")
    workflows = SqliteWorkflowStore(tmp_path / "tasks.db", retention_s=KEPT_S)
    try:
        filled(workflows, "cancelled")
        assert workflows.transition(TENANT, "cancelled", (RUNNING,), CANCELLED, NOW_MS) is CANCELLED
        late = replace(member("b", 0, MemberOutcome.CANCELLED), finished_ms=NOW_MS + 60_000)
        workflows.record_member(TENANT, "cancelled", late, None)
        assert workflows.purge_expired(NOW_MS + 60_000 + KEPT_S * 1000 - 1, 1000) == 0
        assert workflows.purge_expired(NOW_MS + 60_000 + KEPT_S * 1000, 2) == 2  # a limit cut it short
        assert workflows.purge_expired(NOW_MS + 60_000 + KEPT_S * 1000, 1000) == 4
        assert present(workflows, "cancelled") == (False, 0, 0)
        with pytest.raises(ValueError, match="limit must be positive"):
            workflows.purge_expired(NOW_MS, 0)
    finally:
        workflows.close()
        tasks.close()
