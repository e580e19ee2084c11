"""Workflows: steps that follow each other (chains, fan-out, joins) on the same store,
each step an ordinary task. `definition` says what a workflow is, `engine` how its steps
follow each other whatever crashes or repeats, `steps` what a worker does around a
step's handler. The SDK entry is `Workflows.submit` (`scheduler.connect().workflows`)."""

from scheduler.workflows.definition import InvalidWorkflow, Step, Workflow

__all__ = ["InvalidWorkflow", "Step", "Workflow"]
