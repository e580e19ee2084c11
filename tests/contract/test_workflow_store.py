"""The `WorkflowStore` contract (`scheduler.ports`), run against every adapter: the
embedded SQLite store (in the task store's file) and the Cassandra store on the real
server (fresh keyspace, on the task store's session)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import replace
from functools import partial
from pathlib import Path

import pytest

from scheduler.adapters.embedded.store import SqliteTaskStore
from scheduler.adapters.embedded.workflows import SqliteWorkflowStore
from scheduler.model import TaskId
from scheduler.ports import WHOLE, Claim, Member, MemberOutcome, WorkflowRecord, WorkflowState, WorkflowStore
from tests.support import all_at_once

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
