"""The workflow engine on the embedded store's real adapters (SQLite task store and
workflow store, a producer client): each step's end is fed to `Workflows.ended` as a
worker's settler feeds it, including the repeats and crashes a worker can cause."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path

import pytest

from scheduler.adapters.embedded.store import SqliteTaskStore
from scheduler.adapters.embedded.workflows import SqliteWorkflowStore
from scheduler.errors import InvalidTask, StoreError
from scheduler.model import Task, TaskId, encode_payload
from scheduler.ports import CancelOutcome, TaskStatus
from scheduler.ports.workflows import WHOLE, Member, MemberOutcome, WorkflowState
from scheduler.producer import Client
from scheduler.visibility.counts import EventCounter
from scheduler.workflows.definition import InvalidWorkflow, Step, Workflow, step_key
from scheduler.workflows.engine import StepEnd, Workflows, decode_definition, member_task_ids

pytestmark = pytest.mark.timeout(120)

TENANT = "board"


class Rig:
    def __init__(self, path: Path) -> None:
        self.tasks = SqliteTaskStore(path)
        self.store = SqliteWorkflowStore(path)
        self.client = Client(self.tasks, tenant=TENANT)
        self.flows = Workflows(self.store, self.client)

    def close(self) -> None:
        self.store.close()
        self.tasks.close()

    def ids(self, workflow_id: str) -> dict[tuple[str, int], TaskId]:
        record = self.store.read(TENANT, workflow_id)
        assert record is not None
        return member_task_ids(TENANT, workflow_id, decode_definition(record.definition),
                               self.store.claims(TENANT, workflow_id))

    def task(self, workflow_id: str, step: str, index: int) -> Task:
        task_id = self.ids(workflow_id)[(step, index)]
        stored = self.tasks.get(task_id)
        assert stored is not None, f"{step}[{index}] was claimed but not stored"
        return stored.task

    def end(self, workflow_id: str, step: str, index: int, outcome: MemberOutcome = MemberOutcome.DONE,
            result: object = None) -> None:
        task = self.task(workflow_id, step, index)
        self.flows.ended(StepEnd(task, outcome, None if result is None else encode_payload(result),
                                 "boom" if outcome is MemberOutcome.DEAD else None))

    def created(self, workflow_id: str) -> set[tuple[str, int]]:
        return set(self.ids(workflow_id))

    def state(self, workflow_id: str) -> WorkflowState:
        record = self.store.read(TENANT, workflow_id)
        assert record is not None
        return record.state


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    made = Rig(tmp_path / "tasks.db")
    try:
        yield made
    finally:
        made.close()


def results_day(batches: int, workflow_id: str = "results", on_failure: bool = True, join: str = "all_succeeded"
                ) -> Workflow:
    return Workflow(TENANT, [
        Step("render", "render", payloads=[{"batch": i} for i in range(batches)]),
        Step("send", "send_sms", each_of="render"),
        Step("report", "report", after=["send"], join=join),  # type: ignore[arg-type]
    ], on_failure=Step("alert", "alert") if on_failure else None, workflow_id=workflow_id)


def test_each_step_is_created_when_what_it_follows_succeeded_and_the_workflow_succeeds(rig: Rig) -> None:
    wf = rig.flows.submit(results_day(3))
    assert rig.created(wf) == {("render", 0), ("render", 1), ("render", 2)}
    assert rig.task(wf, "render", 2).idempotency_key == step_key(wf, "render", 2)
    rig.end(wf, "render", 1, result={"pages": 10})
    assert ("send", 1) in rig.created(wf) and ("send", 0) not in rig.created(wf)
    rig.end(wf, "render", 0)
    rig.end(wf, "render", 2)
    rig.end(wf, "send", 0)
    rig.end(wf, "send", 1)
    assert ("report", 0) not in rig.created(wf)
    rig.end(wf, "send", 2)
    assert ("report", 0) in rig.created(wf)
    assert rig.state(wf) is WorkflowState.RUNNING
    rig.end(wf, "report", 0)
    assert rig.state(wf) is WorkflowState.SUCCEEDED
    assert rig.flows.results(TENANT, wf, "render") == [None, {"pages": 10}, None]


def test_an_end_recorded_twice_or_cut_short_after_its_record_creates_one_successor(rig: Rig) -> None:
    wf = rig.flows.submit(results_day(2))
    rig.end(wf, "render", 0)
    first = rig.ids(wf)[("send", 0)]
    rig.end(wf, "render", 0)  # the same message settled again
    assert rig.ids(wf)[("send", 0)] == first
    # A worker killed after the member's outcome was stored, before anything followed.
    render1 = rig.task(wf, "render", 1)
    rig.store.record_member(TENANT, wf, Member("render", 1, MemberOutcome.DONE, render1.id, 1, 0), None)
    assert ("send", 1) not in rig.created(wf)
    assert rig.flows.start_check(render1).done  # the next worker does not run the handler again...
    rig.end(wf, "render", 1)  # ...and settles the end again, which creates what follows
    assert ("send", 1) in rig.created(wf)
    # Killed after the claim, before the insert: the claim's time gives the same task.
    rig.end(wf, "send", 0)
    claim = rig.store.claim(TENANT, wf, "report", WHOLE, 1_790_000_000_000, WorkflowState.RUNNING)
    assert claim is not None and not claim.created
    rig.end(wf, "send", 1)
    report = rig.task(wf, "report", 0)
    assert report.run_at_ms == 1_790_000_000_000
    assert {c.step: c.created for c in rig.store.claims(TENANT, wf)}["report"]


def test_a_thousand_wide_join_fires_once_when_every_member_ends_twice_from_eight_threads(rig: Rig) -> None:
    wf = rig.flows.submit(Workflow(TENANT, [Step("part", "p", count=1000), Step("sum", "s", after=["part"])],
                                   workflow_id="wide"))
    ends = [i for i in range(1000) for _ in range(2)]
    barrier = threading.Barrier(8)

    def run(share: list[int]) -> None:
        barrier.wait()
        for index in share:
            rig.end(wf, "part", index)

    threads = [threading.Thread(target=run, args=(ends[n::8],)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    claims = [c for c in rig.store.claims(TENANT, wf) if c.step == "sum"]
    assert len(claims) == 1 and claims[0].created
    assert rig.task(wf, "sum", 0).type == "s"


def test_a_dead_step_fails_the_workflow_skips_what_follows_and_runs_the_on_failure_step_once(rig: Rig) -> None:
    wf = rig.flows.submit(results_day(2))
    rig.end(wf, "render", 0, MemberOutcome.DEAD)
    rig.end(wf, "render", 0, MemberOutcome.DEAD)  # settled twice
    assert rig.state(wf) is WorkflowState.FAILED
    assert ("alert", 0) in rig.created(wf)
    rig.end(wf, "render", 1)  # ends after the failure: nothing new starts
    assert rig.created(wf) == {("render", 0), ("render", 1), ("alert", 0)}
    # A dead-letter replay of render[0]: a new task under the same key, which succeeds.
    dead = rig.task(wf, "render", 0)
    replayed = Task(TaskId.for_key(dead.run_at_ms + 5_000, TENANT, dead.idempotency_key or ""), TENANT, dead.type,
                    dead.payload, dead.run_at_ms + 5_000, idempotency_key=dead.idempotency_key)
    rig.flows.ended(StepEnd(replayed, MemberOutcome.DONE))
    assert rig.state(wf) is WorkflowState.RUNNING
    assert {("send", 0), ("send", 1)} <= rig.created(wf)  # including the one skipped while failed


def test_a_member_that_dies_while_a_replay_reopens_the_workflow_fails_it_again(rig: Rig) -> None:
    """render[0] died; its replay succeeds and reopens the workflow; render[1] dies just
    after the reopen read the members, so its own attempt to fail the workflow finds it
    still failed and does nothing. The reopen reads again after opening it and fails it:
    the workflow is not left running with a dead member."""
    wf = rig.flows.submit(results_day(2))
    rig.end(wf, "render", 0, MemberOutcome.DEAD)
    dead = rig.task(wf, "render", 0)
    replayed = Task(TaskId.for_key(dead.run_at_ms + 5_000, TENANT, dead.idempotency_key or ""), TENANT, dead.type,
                    dead.payload, dead.run_at_ms + 5_000, idempotency_key=dead.idempotency_key)
    reads = rig.store.members
    injected: list[bool] = []

    def members_then_a_death(tenant: str, workflow_id: str, steps: tuple[str, ...] | None = None) -> list[Member]:
        found = reads(tenant, workflow_id, steps)
        if not injected:  # the reopen's first read: render[1] dies now, while the workflow is still failed
            injected.append(True)
            rig.end(wf, "render", 1, MemberOutcome.DEAD)
        return found

    rig.store.members = members_then_a_death  # type: ignore[method-assign]
    rig.flows.ended(StepEnd(replayed, MemberOutcome.DONE))
    rig.store.members = reads  # type: ignore[method-assign]
    assert injected
    assert rig.state(wf) is WorkflowState.FAILED
    assert [c.step for c in rig.store.claims(TENANT, wf)].count("alert") == 1  # the on-failure step, once


def test_a_copy_that_succeeds_while_another_copy_fails_the_workflow_opens_it_again(rig: Rig) -> None:
    """Two copies of render[0]: one ends dead and reads the member (dead); before it fails
    the workflow, the other ends done and finds the workflow still running. The dead copy
    fails it, reads again, finds the member done, and opens it again: the workflow is not
    left failed with no dead member."""
    wf = rig.flows.submit(results_day(1))
    checks = rig.store.start_check
    injected: list[bool] = []

    def check_then_the_other_copy_succeeds(tenant: str, workflow_id: str, step: str, index: int
                                           ) -> tuple[WorkflowState | None, Member | None, bytes | None]:
        found = checks(tenant, workflow_id, step, index)
        if not injected:
            injected.append(True)
            rig.end(wf, "render", 0)  # the done copy, start to end
        return found

    rig.store.start_check = check_then_the_other_copy_succeeds  # type: ignore[method-assign]
    rig.end(wf, "render", 0, MemberOutcome.DEAD)
    rig.store.start_check = checks  # type: ignore[method-assign]
    assert injected
    assert rig.state(wf) is WorkflowState.RUNNING
    assert ("send", 0) in rig.created(wf)
    rig.end(wf, "send", 0)
    rig.end(wf, "report", 0)
    assert rig.state(wf) is WorkflowState.SUCCEEDED


def test_a_dead_on_failure_step_does_not_keep_a_replayed_workflow_failed(rig: Rig) -> None:
    wf = rig.flows.submit(results_day(1))
    rig.end(wf, "render", 0, MemberOutcome.DEAD)
    rig.end(wf, "alert", 0, MemberOutcome.DEAD)  # the alert itself failed
    dead = rig.task(wf, "render", 0)
    replayed = Task(TaskId.for_key(dead.run_at_ms + 5_000, TENANT, dead.idempotency_key or ""), TENANT, dead.type,
                    dead.payload, dead.run_at_ms + 5_000, idempotency_key=dead.idempotency_key)
    rig.flows.ended(StepEnd(replayed, MemberOutcome.DONE))
    assert rig.state(wf) is WorkflowState.RUNNING and ("send", 0) in rig.created(wf)


def test_a_copy_that_dies_after_another_copy_succeeded_changes_nothing(rig: Rig) -> None:
    """Two copies of render[0] ran at once (a rebalance): one succeeded, then the other
    died. The member stays done with its result, the workflow running, send[0] created."""
    wf = rig.flows.submit(results_day(2))
    rig.end(wf, "render", 0, result={"pdfs": 3})
    rig.end(wf, "render", 0, MemberOutcome.DEAD)
    assert rig.state(wf) is WorkflowState.RUNNING
    assert ("send", 0) in rig.created(wf) and ("alert", 0) not in rig.created(wf)
    assert rig.flows.results(TENANT, wf, "render") == [{"pdfs": 3}, None]


def test_a_dead_member_before_an_all_finished_join_does_not_fail_the_workflow(rig: Rig) -> None:
    wf = rig.flows.submit(Workflow(TENANT, [Step("send", "s", count=3), Step("report", "r", after=["send"],
                                                                             join="all_finished")],
                                   workflow_id="tolerant"))
    rig.end(wf, "send", 0)
    rig.end(wf, "send", 1, MemberOutcome.DEAD)
    rig.end(wf, "send", 2)
    assert rig.state(wf) is WorkflowState.RUNNING and ("report", 0) in rig.created(wf)
    rig.end(wf, "report", 0)
    assert rig.state(wf) is WorkflowState.SUCCEEDED


def test_a_cancelled_workflow_cancels_its_steps_and_creates_nothing_more(rig: Rig) -> None:
    rig.client.cancel_settle_s = 0.0
    wf = rig.flows.submit(results_day(3))
    rig.end(wf, "render", 0)
    outcome = rig.flows.cancel(TENANT, wf)
    assert outcome is not None and outcome[0] is WorkflowState.CANCELLED
    for step, index in [("render", 1), ("render", 2), ("send", 0)]:
        stored = rig.tasks.get(rig.ids(wf)[(step, index)])
        assert stored is not None and stored.status is TaskStatus.CANCELLED
    rig.end(wf, "render", 1)  # it was running when the cancel came
    assert ("send", 1) not in rig.created(wf)
    assert rig.flows.start_check(rig.task(wf, "send", 0)).cancelled
    assert rig.state(wf) is WorkflowState.CANCELLED
    again = rig.flows.cancel(TENANT, wf)  # again (a cancel that failed part-way): safe
    assert again is not None and again[0] is WorkflowState.CANCELLED
    assert set(again[1].values()) == {CancelOutcome.ALREADY_CANCELLED}
    assert rig.flows.cancel(TENANT, "no-such") is None
    assert rig.flows.cancel("another-tenant", wf) is None


class Submitted(EventCounter):
    """Counts what a client reports as submitted, by type."""

    def __init__(self) -> None:
        super().__init__("test")
        self.by_type: Counter[str] = Counter()

    def add_many(self, event: str, counts: Mapping[tuple[str, str], int]) -> None:
        if event == "submitted":
            for (_, type_), n in counts.items():
                self.by_type[type_] += n


def test_a_step_inserted_again_after_a_cut_short_create_is_counted_as_submitted_once(rig: Rig) -> None:
    """render[0]'s end claims send[0] and stores it, then the mark fails; the end is
    settled again, finds the claim unmarked and inserts the same task again, uncounted:
    `scheduler status` must not show a send waiting for ever."""
    counted = Submitted()
    client = Client(rig.tasks, tenant=TENANT, events=counted)
    flows = Workflows(rig.store, client)
    wf = flows.submit(results_day(1))
    assert counted.by_type == Counter({"render": 1})
    marks = rig.store.mark_created
    failed: list[str] = []

    def mark_fails_once(tenant: str, workflow_id: str, step: str, index: int) -> None:
        if step == "send" and not failed:
            failed.append(step)
            raise StoreError("timed out")
        marks(tenant, workflow_id, step, index)

    rig.store.mark_created = mark_fails_once  # type: ignore[method-assign]
    render = StepEnd(rig.task(wf, "render", 0), MemberOutcome.DONE)
    with pytest.raises(StoreError):
        flows.ended(render)
    flows.ended(render)  # the batch settled again
    assert failed and ("send", 0) in rig.created(wf)
    assert counted.by_type == Counter({"render": 1, "send_sms": 1})


def test_a_step_cannot_be_forged_nor_cancelled_alone(rig: Rig) -> None:
    """A task with a step's key would be taken for that step when it ends, and a step
    cancelled alone would leave its workflow waiting for ever: the producer refuses both,
    and nothing is written."""
    wf = rig.flows.submit(results_day(2))
    with pytest.raises(InvalidTask, match="workflow steps"):
        rig.client.submit("send_sms", {}, idempotency_key=step_key(wf, "send", 0),
                          run_at=datetime.now(UTC))
    assert rig.created(wf) == {("render", 0), ("render", 1)}
    render = rig.task(wf, "render", 0)
    with pytest.raises(InvalidTask, match="cancel its workflow"):
        rig.client.cancel(render.id, TENANT)
    stored = rig.tasks.get(render.id)
    assert stored is not None and stored.status is TaskStatus.SCHEDULED
    rig.end(wf, "render", 0)
    rig.end(wf, "render", 1)
    assert rig.created(wf) >= {("send", 0), ("send", 1)}


def test_submitting_again_is_safe_and_another_definition_under_the_same_id_is_refused(rig: Rig) -> None:
    wf = rig.flows.submit(results_day(2))
    before = rig.ids(wf)
    assert rig.flows.submit(results_day(2)) == wf
    assert rig.ids(wf) == before
    with pytest.raises(InvalidWorkflow, match="another definition"):
        rig.flows.submit(results_day(3))
    generated = rig.flows.submit(results_day(2, workflow_id=None))  # type: ignore[arg-type]
    assert generated != wf and len(rig.ids(generated)) == 2
