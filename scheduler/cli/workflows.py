"""`scheduler workflow submit|show|cancel`: workflows of steps (`scheduler.workflows`).

A file is read and checked whole before any store is opened, so a bad workflow is exit
2 with the reason and nothing is written.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

import click

from scheduler.cli.options import Exit, open_client, store_options, tenant_option
from scheduler.errors import HandoffFailed, StoreError
from scheduler.ports.workflows import WorkflowState
from scheduler.workflows.definition import compile_workflow, from_json
from scheduler.workflows.view import describe


@click.group()
def workflow() -> None:
    """Workflows: steps that run after each other, fan out and join.

    \b
    A workflow file is one JSON object:
      {"tenant": "board", "id": "results-2026",
       "steps": [{"name": "render", "type": "render", "payloads": [{"batch": 1}, {"batch": 2}]},
                 {"name": "send", "type": "send_sms", "each_of": "render"},
                 {"name": "report", "type": "report", "after": ["send"], "join": "all_finished"}],
       "on_failure": {"name": "alert", "type": "alert", "payload": {"to": "ops"}}}
    A step without 'after' or 'each_of' starts at once ('payloads': one member each;
    'count': N members of one 'payload'); 'each_of': member i after member i of that
    step succeeded; 'after': once every member of those steps succeeded ('join':
    all_succeeded) or ended ('all_finished'). Each step also takes priority, cost and
    max_attempts. A step that ends dead fails the workflow and starts 'on_failure'.
    See docs/workflows.md.
    """


@workflow.command("submit")
@click.argument("file", type=click.File("r"))
@tenant_option("Tenant that owns the workflow (default: the file's 'tenant').", required=False)
@click.option("--id", "workflow_id", help="The workflow's id (default: the file's 'id', else a new one). "
              "Submitting the same id and file again is safe; another file under the same id is refused.")
@click.option("--json", "as_json", is_flag=True, help="Print {workflow_id, tenant, steps, members} as JSON.")
@store_options
def submit(file: TextIO, tenant: str | None, workflow_id: str | None, as_json: bool, backend: str, db: Path,
           **options: Any) -> None:
    """Store the workflow in FILE (`-`: stdin), start its first steps, print its id."""
    try:
        document = json.load(file)
    except json.JSONDecodeError as exc:
        raise click.BadParameter(f"not JSON ({exc.msg} at line {exc.lineno})", param_hint="FILE") from None
    if isinstance(document, dict) and workflow_id is not None:
        document["id"] = workflow_id
    flow = from_json(document, tenant=tenant)
    definition, _ = compile_workflow(flow)  # InvalidWorkflow (exit 2) before a store is opened
    if flow.workflow_id is None:  # chosen here, so a submit cut short can be finished under it
        flow = replace(flow, workflow_id=str(uuid.uuid4()))
    with open_client(backend, db, **options) as client:
        try:
            submitted = client.workflows.submit(flow)
        except (StoreError, HandoffFailed) as exc:
            click.echo(f"workflow {flow.workflow_id} may be stored part-way ({exc}): submit the same file again "
                       f"with --id {flow.workflow_id} to finish it", err=True)
            raise click.exceptions.Exit(Exit.FAILURE) from None
    if as_json:
        click.echo(json.dumps({"workflow_id": submitted, "tenant": flow.tenant, "steps": len(definition.steps),
                               "members": sum(step.width for step in definition.steps)}))
    else:
        click.echo(submitted)


@workflow.command("show")
@click.argument("workflow_id")
@tenant_option("Tenant that owns the workflow.")
@click.option("--members", "all_members", is_flag=True, help="List every member of wide steps too (by default a "
              "step of more than 10 members shows its counts by state).")
@click.option("--json", "as_json", is_flag=True, help="Print the workflow, its steps and every member as JSON.")
@store_options
def show(workflow_id: str, tenant: str, all_members: bool, as_json: bool, backend: str, db: Path,
         **options: Any) -> None:
    """Show a workflow's state and its steps' members (exit 1 if the tenant has none of this id)."""
    with open_client(backend, db, **options) as client:
        shown = describe(client.workflows, tenant, workflow_id)
    if shown is None:
        click.echo(f"tenant {tenant!r} has no workflow {workflow_id!r}", err=True)
        raise click.exceptions.Exit(Exit.FAILURE)
    if as_json:
        click.echo(json.dumps(shown))
        return
    click.echo(f"workflow {workflow_id} of {tenant}: {shown['state']} (created {_at(shown['created_ms'])}"
               + (f", ended {_at(shown['ended_ms'])})" if shown["ended_ms"] else ")"))
    for step in shown["steps"]:
        after = (f" each of {step['each_of']}" if step["each_of"] else
                 f" after {', '.join(step['after'])} ({step['join']})" if step["after"] else "")
        states = ", ".join(f"{count} {state}" for state, count in sorted(step["states"].items()))
        click.echo(f"  {step['name']} [{step['type']}] x{step['width']}{after}: {states}")
        if step["width"] <= 10 or all_members:
            for member in step["members"]:
                click.echo(f"    #{member['index']} {member['state']:9} task {member['task_id'] or '-'}"
                           f"  created {_at(member['created_ms'])}  ended {_at(member['finished_ms'])}"
                           + (f"  {member['error']}" if member["error"] else ""))


@workflow.command("cancel")
@click.argument("workflow_id")
@tenant_option("Tenant that owns the workflow.")
@store_options
def cancel(workflow_id: str, tenant: str, backend: str, db: Path, **options: Any) -> None:
    """Cancel a workflow: no step starts once this returns; steps running finish; the rest
    are cancelled (exit 1 if the tenant has no such workflow)."""
    with open_client(backend, db, **options) as client:
        outcome = client.workflows.cancel(tenant, workflow_id)
    if outcome is None:
        click.echo(f"tenant {tenant!r} has no workflow {workflow_id!r}", err=True)
        raise click.exceptions.Exit(Exit.FAILURE)
    state, cancels = outcome
    if state is not WorkflowState.CANCELLED:
        click.echo(f"workflow {workflow_id} had already {state.value}; nothing to cancel")
        return
    counts: dict[str, int] = {}
    for result in cancels.values():
        counts[result.value] = counts.get(result.value, 0) + 1
    click.echo(f"workflow {workflow_id} cancelled"
               + (": steps " + ", ".join(f"{n} {what}" for what, n in sorted(counts.items())) if counts else ""))


def _at(ms: int | None) -> str:
    if ms is None:
        return "-"
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")

