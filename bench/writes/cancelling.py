"""Cancels of tasks in each place a task can be, through each way a caller has.

`Client.cancel` is definite (`scheduler.cancels`): once it answered `cancelled`, no
attempt of the task starts, however the cancelling client was built. Here, on a
deployment with one `scheduler worker` of concurrency 1 (its `--check` as the caller
chose: `never` is the hardest, nothing but the cancel marks stops a start):

1. a blocker (the test app's `wait_for` mode) takes the worker's one slot;
2. the *published* group, due a second ahead, is written and waited for in the ready
   topics: its messages then wait in the worker's buffer or in the topic;
3. the *wheel* group is written due `wheel_lead_ms` ahead, so that it is in the
   dispatcher's wheel (through the hand-off) or in the store behind its read;
4. in each group, tasks written through `connect` and through `Client(store)` are
   cancelled through `connect`, through `Client(store)` (no hand-off: the dispatcher is
   not told) and through `scheduler cancel`, all at once; some of each are kept;
5. once every cancel answered, the blocker is let go.

Since nothing could start while the blocker held the only slot, a cancelled task that
starts at all starts after its cancel answered: each must never start, each kept one
must run. The wait ends when every kept task started, every cancelled task's time has
passed by `AFTER_DUE_MS`, and the worker has dealt with every published message of a
cancelled task (skipped it, or started it) with nothing left running or buffered.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from bench.writes.figures import Cancelled
from bench.writes.scenario import (
    OK,
    TASK_TYPE,
    TENANT,
    Producers,
    RunLog,
    handler_starts,
    now_ms,
    published,
    run_scheduler,
)
from scheduler.model import TaskId

GROUPS = ("published", "wheel")
WRITTEN_BY = ("connect", "client")
CANCEL_BY: tuple[str | None, ...] = ("connect", "client", "cli", None)
"""None: kept, not cancelled."""
PUBLISHED_LEAD_MS = 1000
WHEEL_LEAD_MS = 5000
"""Due this far ahead when written: past every cancel's answer (a `scheduler cancel`
process takes a second or two to start, then the 2 s every cancel of a task due soon
waits), so the wheel group is still unfired when its cancels come."""
CLI_CANCEL_MS = 3000
"""What one `scheduler cancel` process is allowed in the wheel group's lead."""
AFTER_DUE_MS = 3000
"""How long past a cancelled task's time the run goes on: the dispatcher fires what it
still holds at its time, and the worker gets it within this."""
TIMEOUT_S = 60.0


class Idle:
    """Whether the worker dealt with `messages` published messages of cancelled tasks,
    from its stats document: skipped (as cancelled, finished or superseded) or started."""

    def __init__(self, stats: Callable[[], Sequence[Mapping[str, Any]]]) -> None:
        self.stats = stats

    def __call__(self, messages: int, started: int) -> bool:
        documents = self.stats()
        skipped = sum(int(d.get(name, 0)) for d in documents
                      for name in ("skipped_cancelled", "skipped_finished", "skipped_superseded"))
        busy = sum(int(d.get("running", 0)) + sum(int(n) for n in d.get("buffered", {}).values()) for d in documents)
        return bool(documents) and busy == 0 and skipped + started >= messages


@dataclass
class CancelRun:
    cases: list[Cancelled]
    blocker: TaskId
    published: set[TaskId]
    """Tasks of the run that reached a ready topic."""
    starts: dict[TaskId, list[int]]
    settled: bool
    """Whether the wait ended as it should (else after `TIMEOUT_S`: see the figures)."""


def wait(condition: Callable[[], bool], timeout_s: float) -> bool:
    """Whether `condition` held within `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


class ScenarioFailure(Exception):
    """The scenario could not be set up: what it waited for did not happen."""


def write_group(producers: Producers, group: str, lead_ms: int, per_cell: int) -> list[Cancelled]:
    cases = []
    for written_by in WRITTEN_BY:
        client = producers.client(written_by)
        for cancel_by in CANCEL_BY:
            for _ in range(per_cell):
                task_id = client.submit(TASK_TYPE, OK, delay=lead_ms / 1000)
                cases.append(Cancelled(group, written_by, cancel_by, task_id))
    return cases


def cancel_through(producers: Producers, by: str, cases: Sequence[Cancelled], cli_parallel: int) -> list[Cancelled]:
    """Cancel `cases` through `by`: one `cancel_many` for a client, a process each for the CLI."""
    if by != "cli":
        asked = now_ms()
        outcomes = producers.client(by).cancel_many([case.task_id for case in cases])
        answered = now_ms()
        return [replace(case, outcome=outcomes[case.task_id].value, asked_ms=asked, answered_ms=answered)
                for case in cases]

    def one(case: Cancelled) -> Cancelled:
        asked = now_ms()
        answer = run_scheduler(producers.env, "cancel", str(case.task_id), "--tenant", TENANT)
        text, at = answer.last()
        outcome = text.rsplit(": ", 1)[-1] if answer.code == 0 else f"exit {answer.code}: {answer.stderr[-500:]}"
        return replace(case, outcome=outcome, asked_ms=asked, answered_ms=at)

    with ThreadPoolExecutor(cli_parallel, thread_name_prefix="cancel-cli") as pool:
        return list(pool.map(one, cases))


def run_cancels(producers: Producers, log: RunLog, worker_stats: Callable[[], Sequence[Mapping[str, Any]]],
                hold: Path, per_cell: int = 1, cli_parallel: int = 2) -> CancelRun:
    """The scenario of the module docstring; `hold` is a path that does not exist yet
    (the blocker waits until it does), `worker_stats` reads the worker's stats document."""
    blocker = producers.connected.submit(TASK_TYPE, {"mode": "wait_for", "path": str(hold)})
    try:
        if not wait(lambda: blocker in handler_starts(log), 30):
            raise ScenarioFailure(f"the blocker {blocker} did not start within 30 s")
        cases = write_group(producers, "published", PUBLISHED_LEAD_MS, per_cell)
        group = {case.task_id for case in cases}
        if not wait(lambda: group <= published(producers.settings).keys(), 30):
            missing = group - published(producers.settings).keys()
            raise ScenarioFailure(f"{len(missing)} tasks of the published group were not published within 30 s: "
                                  f"{sorted(map(str, missing))}")
        cli_cancels = 2 * len(WRITTEN_BY) * per_cell  # both groups
        lead = WHEEL_LEAD_MS + CLI_CANCEL_MS * -(-cli_cancels // cli_parallel)
        cases += write_group(producers, "wheel", lead, per_cell)
        by_path: dict[str, list[Cancelled]] = {}
        for case in cases:
            if case.cancel_by is not None:
                by_path.setdefault(case.cancel_by, []).append(case)
        with ThreadPoolExecutor(len(by_path), thread_name_prefix="cancel") as pool:
            jobs = [pool.submit(cancel_through, producers, by, chosen, cli_parallel) for by, chosen in by_path.items()]
            answered = {case.task_id: case for job in jobs for case in job.result()}
    finally:
        hold.touch()
    cases = [answered.get(case.task_id, case) for case in cases]

    kept = {case.task_id for case in cases if case.cancel_by is None}
    cancelled = {case.task_id for case in cases if case.cancel_by is not None}
    last_due = max(task_id.run_at_ms for task_id in cancelled)
    idle = Idle(worker_stats)

    def settled() -> bool:
        starts = handler_starts(log)
        if not kept <= starts.keys() or now_ms() < last_due + AFTER_DUE_MS:
            return False
        messages = sum(len(stamps) for task_id, stamps in published(producers.settings).items()
                       if task_id in cancelled)
        return idle(messages, sum(len(starts.get(task_id, [])) for task_id in cancelled))

    finished = wait(settled, TIMEOUT_S)
    return CancelRun(cases, blocker, set(published(producers.settings)), handler_starts(log), finished)
