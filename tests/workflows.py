"""Workflow scenarios against real `scheduler dispatcher` and `scheduler worker`
processes, shared by the embedded backend's tests (tests/embedded/test_workflows_embedded.py)
and the real servers' (tests/integration/test_workflows_cluster.py).

Each scenario checks what a user of workflows relies on: every step runs after what
it follows, each successor is created once however its predecessor's end was repeated
or cut short by a kill -9, a join fires once, a dead step fails the workflow and a
replay opens it again, a cancel stops everything not yet started. What ran is read
from the handlers' own record (the sink), what exists from the stores.
"""

from __future__ import annotations

import json
import signal
from collections import Counter
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import scheduler
from scheduler import backends
from scheduler.connecting import backend_settings
from scheduler.model import Priority, TaskId, encode_message
from scheduler.ports.workflows import WHOLE, WorkflowState
from scheduler.producer import Client
from scheduler.workflows.definition import Step, Workflow
from scheduler.workflows.engine import decode_definition, member_task_ids
from tests.dispatchers import Fleet
from tests.support import run_cli, wait_until
from tests.workers import Workers

TENANT = "board"


@contextmanager
def client_of(env: Mapping[str, str]) -> Iterator[Client]:
    with scheduler.connect(env=env, tenant=TENANT) as client:
        yield client


def state(client: Client, workflow_id: str) -> WorkflowState | None:
    record = client.workflows.store.read(TENANT, workflow_id)
    return None if record is None else record.state


def wait_state(client: Client, workflow_id: str, wanted: WorkflowState, timeout_s: float) -> None:
    wait_until(lambda: state(client, workflow_id) is wanted, timeout_s=timeout_s, interval_s=0.2,
               what=f"workflow {workflow_id} to be {wanted.value} (it is {state(client, workflow_id)})")


def member_ids(client: Client, workflow_id: str) -> dict[tuple[str, int], TaskId]:
    store = client.workflows.store
    record = store.read(TENANT, workflow_id)
    assert record is not None
    return member_task_ids(TENANT, workflow_id, decode_definition(record.definition), store.claims(TENANT, workflow_id))


def runs_by_task(workers: Workers) -> Counter[str]:
    sink = workers.sink()
    try:
        return Counter(task for task, *_ in sink.runs())
    finally:
        sink.close()


def show(env: Mapping[str, str], workflow_id: str) -> dict[str, Any]:
    result = run_cli("workflow", "show", workflow_id, "--tenant", TENANT, "--json", env=dict(env))
    assert result.returncode == 0, result.stderr
    shown: dict[str, Any] = json.loads(result.stdout)
    return shown


def step_states(shown: Mapping[str, Any]) -> dict[str, dict[str, int]]:
    return {step["name"]: step["states"] for step in shown["steps"]}


def start(fleet: Fleet, workers: Workers, *, worker_env: Mapping[str, str] | None = None) -> None:
    fleet.start("d1")
    worker = workers.start("w1", concurrency=8, env=worker_env)
    workers.wait_started(worker)


def results_day_file(path: Path, batches: int, render_payloads: list[dict[str, Any]] | None = None) -> Path:
    """The README's results-day workflow as a file for `scheduler workflow submit`."""
    path.write_text(json.dumps({
        "tenant": TENANT, "id": "results-day",
        "steps": [
            {"name": "render", "type": "step", "payloads": render_payloads or [{"batch": i} for i in range(batches)]},
            {"name": "send", "type": "step", "each_of": "render", "priority": "high"},
            {"name": "report", "type": "step", "after": ["send"]},
        ],
        "on_failure": {"name": "alert", "type": "step", "payload": {"to": "ops"}},
    }))
    return path


def results_day_runs_through(env: Mapping[str, str], fleet: Fleet, workers: Workers, tmp_path: Path,
                             timeout_s: float = 90) -> None:
    """Submitted with the CLI as a user would: every step runs once, after what it
    follows, each send gets its render's result, the report joins every send."""
    full_env = {**env, "SCHEDULER_TEST_SINK": str(workers.sink_path)}
    start(fleet, workers)
    result = run_cli("workflow", "submit", str(results_day_file(tmp_path / "results.json", 5)), env=full_env)
    assert result.returncode == 0, result.stderr
    workflow_id = result.stdout.strip()
    assert workflow_id == "results-day"
    with client_of(full_env) as client:
        wait_state(client, workflow_id, WorkflowState.SUCCEEDED, timeout_s)
        ids = member_ids(client, workflow_id)
        flows = client.workflows
        sends = flows.results(TENANT, workflow_id, "send")
        report = flows.results(TENANT, workflow_id, "report")
    assert set(ids) == {("render", i) for i in range(5)} | {("send", i) for i in range(5)} | {("report", 0)}
    runs = runs_by_task(workers)
    assert all(runs[str(task_id)] == 1 for task_id in ids.values()), runs
    assert [s["input"]["index"] for s in sends] == [0, 1, 2, 3, 4]  # send i read render i's result
    assert report[0]["joined"] == 5
    sink = workers.sink()
    started = {task: started_ms for task, _, _, started_ms, *_ in sink.runs()}
    sink.close()
    for i in range(5):  # never early: each send started after its render ended, the report after all
        assert started[str(ids[("send", i)])] > started[str(ids[("render", i)])]
        assert started[str(ids[("report", 0)])] > started[str(ids[("send", i)])]
    shown = show(full_env, workflow_id)
    assert shown["state"] == "succeeded"
    assert step_states(shown) == {"render": {"done": 5}, "send": {"done": 5}, "report": {"done": 1},
                                  "alert": {"not needed": 1}}


def kill_between_a_steps_end_and_its_successor(env: Mapping[str, str], fleet: Fleet, workers: Workers,
                                               tmp_path: Path, timeout_s: float = 90) -> None:
    """The worker that ran step `a` is killed (SIGKILL) after `a`'s end was recorded and
    before anything followed; the next worker does not run `a` again and creates `b`,
    once."""
    full_env = {**env, "SCHEDULER_TEST_SINK": str(workers.sink_path)}
    marker = tmp_path / "crashed"
    fleet.start("d1")
    doomed = workers.start("w1", concurrency=4, env={"SCHEDULER_TEST_CRASH_AFTER_STEP_END": str(marker)})
    workers.wait_started(doomed)
    with client_of(full_env) as client:
        workflow_id = client.workflows.submit(Workflow(TENANT, [Step("a", "step"), Step("b", "step", after=["a"])],
                                                       workflow_id="chain"))
        wait_until(lambda: marker.exists() and not doomed.alive(), timeout_s=timeout_s,
                   what="the worker to kill itself after a's end was recorded")
        assert doomed.process.returncode == -signal.SIGKILL
        assert set(member_ids(client, workflow_id)) == {("a", 0)}  # nothing followed yet
        assert client.workflows.store.members(TENANT, workflow_id)[0].step == "a"
        survivor = workers.start("w2", concurrency=4)
        workers.wait_started(survivor)
        wait_state(client, workflow_id, WorkflowState.SUCCEEDED, timeout_s)
        ids = member_ids(client, workflow_id)
        claims = client.workflows.store.claims(TENANT, workflow_id)
    assert sorted((c.step, c.index) for c in claims) == [("a", WHOLE), ("b", WHOLE)]
    runs = runs_by_task(workers)
    assert runs[str(ids[("a", 0)])] == 1  # the survivor found a's end recorded and did not run it again
    assert runs[str(ids[("b", 0)])] == 1


def a_step_delivered_twice_creates_one_successor(env: Mapping[str, str], fleet: Fleet, workers: Workers,
                                                 timeout_s: float = 90) -> None:
    """A copy of step `a`'s message, as a dispatcher re-firing it or a rebalance would
    deliver it, published beside the original before any worker reads either."""
    full_env = {**env, "SCHEDULER_TEST_SINK": str(workers.sink_path)}
    fleet.start("d1")
    settings = backend_settings(env=full_env)
    with client_of(full_env) as client:
        workflow_id = client.workflows.submit(Workflow(TENANT, [Step("a", "step"), Step("b", "step", after=["a"])],
                                                       workflow_id="twice"))
        a_id = member_ids(client, workflow_id)[("a", 0)]
        stored = client.store.get(a_id)
        assert stored is not None
        shard = stored.task.id.shard(client.store.shard_count)
        token = wait_until(lambda: client.store.read_shard(shard).lease_token or 0, timeout_s=timeout_s,
                           what=f"shard {shard} to be owned")
        with backends.open_dead_letters(settings) as (_, publisher):
            publisher.publish(settings.kafka.ready_topic(Priority.NORMAL.value),
                              [encode_message(stored.task, token)])
            publisher.flush(30.0)
        worker = workers.start("w1", concurrency=8)
        workers.wait_started(worker)
        wait_state(client, workflow_id, WorkflowState.SUCCEEDED, timeout_s)
        # Both copies are settled: the worker's stats count the one it ran and the one it
        # did not run again (skipped at the home-row check, or answered from the stored end).
        wait_until(lambda: _settled(worker.stats()) >= 3, timeout_s=timeout_s, what="both copies of a settled")
        ids = member_ids(client, workflow_id)
        claims = client.workflows.store.claims(TENANT, workflow_id)
    assert sorted((c.step, c.index) for c in claims) == [("a", WHOLE), ("b", WHOLE)]
    runs = runs_by_task(workers)
    assert runs[str(ids[("a", 0)])] == 1 and runs[str(ids[("b", 0)])] == 1


def _settled(stats: Mapping[str, Any]) -> int:
    return sum(int(stats.get(name, 0)) for name in ("done", "skipped_finished", "merged", "skipped_repeat"))


def a_wide_join_fires_once_under_redeliveries(env: Mapping[str, str], fleet: Fleet, workers: Workers,
                                              tmp_path: Path, width: int = 1000, timeout_s: float = 180) -> None:
    """`width` parts joined by one step, with two workers, one killing itself after a
    part's end was recorded (its uncommitted parts are delivered again to the other)."""
    full_env = {**env, "SCHEDULER_TEST_SINK": str(workers.sink_path)}
    fleet.start("d1")
    doomed = workers.start("w1", concurrency=8, env={"SCHEDULER_TEST_CRASH_AFTER_STEP_END": str(tmp_path / "k")})
    survivor = workers.start("w2", concurrency=8)
    workers.wait_started(doomed, survivor)
    with client_of(full_env) as client:
        workflow_id = client.workflows.submit(Workflow(TENANT, [
            Step("part", "step", count=width, payload={"mode": "sleep", "s": 0.01}),
            Step("sum", "step", after=["part"])], workflow_id="wide"))
        wait_state(client, workflow_id, WorkflowState.SUCCEEDED, timeout_s)
        claims = [c for c in client.workflows.store.claims(TENANT, workflow_id) if c.step == "sum"]
        total = client.workflows.results(TENANT, workflow_id, "sum")[0]
        ids = member_ids(client, workflow_id)
    assert not doomed.alive() and (tmp_path / "k").exists()
    assert len(claims) == 1
    assert total["joined"] == width
    runs = runs_by_task(workers)
    assert runs[str(ids[("sum", 0)])] == 1
    assert all(runs[str(ids[("part", i)])] >= 1 for i in range(width))


def a_dead_step_fails_the_workflow_and_a_replay_reopens_it(env: Mapping[str, str], fleet: Fleet, workers: Workers,
                                                           tmp_path: Path, timeout_s: float = 90) -> None:
    """render #1 fails permanently once: the workflow fails, its send is skipped, the
    report never created, the on-failure step runs once; replaying the dead letter
    (which then succeeds) opens the workflow again and it completes."""
    full_env = {**env, "SCHEDULER_TEST_SINK": str(workers.sink_path)}
    start(fleet, workers)
    payloads: list[dict[str, Any]] = [{"batch": 0}, {"mode": "permanent_once", "marker": str(tmp_path / "failed")},
                                      {"batch": 2}]
    result = run_cli("workflow", "submit", str(results_day_file(tmp_path / "wf.json", 3, payloads)), env=full_env)
    assert result.returncode == 0, result.stderr
    workflow_id = result.stdout.strip()
    with client_of(full_env) as client:
        wait_state(client, workflow_id, WorkflowState.FAILED, timeout_s)
        wait_until(lambda: step_states(show(full_env, workflow_id))["alert"] == {"done": 1}, timeout_s=timeout_s,
                   what="the on-failure step to run")
        wait_until(lambda: step_states(show(full_env, workflow_id))["render"] == {"done": 2, "dead": 1},
                   timeout_s=timeout_s, what="the other renders to end")
        shown = step_states(show(full_env, workflow_id))
        # send #1 is skipped; #0 and #2 ran or were skipped, as their renders ended before or after #1 died
        assert shown["send"].get("skipped", 0) >= 1 and sum(shown["send"].values()) == 3, shown
        assert shown["report"] == {"skipped": 1}
        replay = run_cli("dlq", "replay", "--all", "--tenant", TENANT, env=full_env)
        assert replay.returncode == 0, replay.stderr + replay.stdout
        wait_state(client, workflow_id, WorkflowState.SUCCEEDED, timeout_s)
        ids = member_ids(client, workflow_id)
    shown = step_states(show(full_env, workflow_id))
    assert shown["render"] == {"done": 3} and shown["send"] == {"done": 3} and shown["report"] == {"done": 1}
    runs = runs_by_task(workers)
    assert runs[str(ids[("alert", 0)])] == 1


def a_workflow_cancelled_half_way_starts_nothing_more(env: Mapping[str, str], fleet: Fleet, workers: Workers,
                                                      tmp_path: Path, timeout_s: float = 90) -> None:
    """Renders #0 and #1 finish, #2 and #3 are held running: `scheduler workflow cancel`;
    the held ones finish afterwards, and no send or report after the cancel ever starts."""
    full_env = {**env, "SCHEDULER_TEST_SINK": str(workers.sink_path)}
    start(fleet, workers)
    release = tmp_path / "release"
    payloads: list[dict[str, Any]] = [{"batch": 0}, {"batch": 1}, {"mode": "wait_for", "path": str(release)},
                                      {"mode": "wait_for", "path": str(release)}]
    result = run_cli("workflow", "submit", str(results_day_file(tmp_path / "wf.json", 4, payloads)), env=full_env)
    assert result.returncode == 0, result.stderr
    workflow_id = result.stdout.strip()
    with client_of(full_env) as client:
        wait_until(lambda: step_states(show(full_env, workflow_id))["send"].get("done") == 2, timeout_s=timeout_s,
                   what="sends #0 and #1 to run")
        cancelled = run_cli("workflow", "cancel", workflow_id, "--tenant", TENANT, env=full_env)
        assert cancelled.returncode == 0, cancelled.stderr
        assert "cancelled" in cancelled.stdout
        assert state(client, workflow_id) is WorkflowState.CANCELLED
        runs_at_cancel = runs_by_task(workers)
        release.write_text("go")
        wait_until(lambda: step_states(show(full_env, workflow_id))["render"] == {"done": 4}, timeout_s=timeout_s,
                   what="the held renders to finish")
        ids = member_ids(client, workflow_id)
    shown = step_states(show(full_env, workflow_id))
    assert shown["send"] == {"done": 2, "cancelled": 2} and shown["report"] == {"cancelled": 1}
    runs = runs_by_task(workers)
    new = {task for task in runs if task not in runs_at_cancel}
    assert not new, f"steps started after the cancel: {new}"
    assert ("send", 2) not in ids and ("report", 0) not in ids
