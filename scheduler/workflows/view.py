"""A workflow as `scheduler workflow show` and the SDK's `describe` present it: its state,
and each step's members with what they are doing and when.

A member's state comes from the first place that knows it: its recorded outcome
(`done`, `dead`, `cancelled`); else, once created, its task's status (`waiting`,
`running`, `retrying`, `cancelled`); else what the workflow's state implies for a step
never created: `pending` (its predecessors have not ended) in a running workflow,
`skipped` in a failed one, `cancelled` in a cancelled one.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from scheduler.ports import TaskStatus
from scheduler.ports.workflows import MemberOutcome, WorkflowState
from scheduler.workflows.engine import Workflows, decode_definition, member_task_ids

_TASK_STATES = {
    TaskStatus.SCHEDULED: "waiting",
    TaskStatus.RUNNING: "running",
    TaskStatus.FAILED: "retrying",
    TaskStatus.CANCELLED: "cancelled",
    TaskStatus.DONE: "done",
    TaskStatus.DEAD: "dead",
}
_NEVER_CREATED = {
    WorkflowState.RUNNING: "pending",
    WorkflowState.SUCCEEDED: "pending",
    WorkflowState.FAILED: "skipped",
    WorkflowState.CANCELLED: "cancelled",
}


def describe(workflows: Workflows, tenant: str, workflow_id: str) -> dict[str, Any] | None:
    """The workflow and every member of every step, or None if the tenant has no such
    workflow. Reads the workflow's partition and the created members' home rows."""
    record = workflows.store.read(tenant, workflow_id)
    if record is None:
        return None
    definition = decode_definition(record.definition)
    members = {(m.step, m.index): m for m in workflows.store.members(tenant, workflow_id)}
    claims = workflows.store.claims(tenant, workflow_id)
    created_at = {}
    for claim in claims:
        step = definition.by_name.get(claim.step)
        if step is not None:
            for index in (range(step.width) if claim.index < 0 else (claim.index,)):
                created_at[(claim.step, index)] = claim.run_at_ms
    ids = member_task_ids(tenant, workflow_id, definition, claims)
    unended = [task_id for key, task_id in ids.items() if key not in members]
    stored = workflows.client.store.get_many(unended) if unended else {}
    steps = []
    for step in definition.steps + ((definition.on_failure,) if definition.on_failure else ()):
        rows = []
        for index in range(step.width):
            key = (step.name, index)
            member = members.get(key)
            task_id = ids.get(key)
            if member is not None:
                state = member.outcome.value
            elif task_id is not None and task_id in stored:
                state = _TASK_STATES[stored[task_id].status]
            elif task_id is not None:
                state = "waiting"
            elif definition.on_failure is not None and step.name == definition.on_failure.name:
                state = "not needed" if record.state is not WorkflowState.CANCELLED else "cancelled"
            else:
                state = _NEVER_CREATED[record.state]
            rows.append({
                "index": index, "state": state, "task_id": None if task_id is None else str(task_id),
                "created_ms": created_at.get(key),
                "finished_ms": None if member is None else member.finished_ms,
                "attempt": None if member is None else member.attempt,
                "error": None if member is None or member.outcome is not MemberOutcome.DEAD else member.error,
            })
        steps.append({
            "name": step.name, "type": step.type, "width": step.width,
            "after": list(step.preds), "join": None if step.each_of or step.root else step.join,
            "each_of": step.each_of, "states": dict(Counter(row["state"] for row in rows)), "members": rows,
        })
    return {
        "workflow_id": workflow_id, "tenant": tenant, "state": record.state.value,
        "created_ms": record.created_ms, "ended_ms": record.ended_ms,
        "on_failure": None if definition.on_failure is None else definition.on_failure.name, "steps": steps,
    }
