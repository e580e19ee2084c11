"""What a workflow is: named steps, each an ordinary task (type, payload, priority, cost),
and how they depend on each other; checked whole before anything is stored.

A step has a width (its members 0..N-1, one task each) and at most one kind of
dependency:

- none: a *root*, created when the workflow is submitted. `count=N` makes N members
  with the same payload; `payloads=[...]` makes one member per payload (a fan-out);
- `after=("a", "b")`: a *join*, created once every member of `a` and `b` has
  succeeded (`join="all_succeeded"`, the default) or has ended, done or dead
  (`join="all_finished"`). It has `count` members (default 1);
- `each_of="a"`: created member by member, member i once member i of `a` succeeded;
  as wide as `a` (results day: send batch i's SMS once batch i is rendered).

`on_failure` names one more step, created once if a step ends dead (see
`scheduler.workflows.engine`). Only roots take per-member `payloads`: a later step's
members differ by what their predecessors returned (`ctx.workflow.input`), so the
stored definition stays small whatever the width.

Limits (`InvalidWorkflow` past any): `MAX_STEPS` steps, `MAX_WIDTH` members a step,
`MAX_MEMBERS` in all, `MAX_DEFINITION_BYTES` encoded; a step's result is at most
`MAX_RESULT_BYTES` (`scheduler.workflows.steps`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import msgpack

from scheduler.errors import InvalidTask
from scheduler.model import DEFAULT_MAX_ATTEMPTS, Priority, check_cost, check_name, encode_payload, valid_max_attempts

MAX_STEPS = 100
MAX_WIDTH = 10_000
MAX_MEMBERS = 25_000
MAX_DEFINITION_BYTES = 256 * 1024
MAX_RESULT_BYTES = 16 * 1024
"""A step's result, encoded: a 1,000-wide join reads at most ~16 MB of its inputs."""

KEY_PREFIX = "workflow/"
"""Idempotency keys of steps start with this; the producer refuses it for any other task."""

_STEP_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_WORKFLOW_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,99}")

Join = Literal["all_succeeded", "all_finished"]
JOINS: tuple[Join, ...] = ("all_succeeded", "all_finished")


class InvalidWorkflow(InvalidTask):
    """A workflow that cannot be submitted: a bad step, a cycle, a name used twice, a
    limit passed. Nothing of it is stored."""


@dataclass(frozen=True)
class Step:
    name: str
    type: str
    payload: Any = None
    payloads: Sequence[Any] | None = None
    count: int | None = None
    after: Sequence[str] = ()
    each_of: str | None = None
    join: Join = "all_succeeded"
    priority: Priority | str = Priority.NORMAL
    cost: int = 1
    max_attempts: int = DEFAULT_MAX_ATTEMPTS


@dataclass(frozen=True)
class Workflow:
    tenant: str
    steps: Sequence[Step]
    on_failure: Step | None = None
    workflow_id: str | None = None
    """Names the workflow within its tenant; submitting the same id again is safe (a
    different definition under it is refused). None: a fresh id."""


@dataclass(frozen=True)
class StepSpec:
    """A step as stored and as the engine reads it (no per-member payloads)."""

    name: str
    type: str
    payload: bytes
    width: int
    after: tuple[str, ...]
    each_of: str | None
    join: Join
    priority: Priority
    cost: int
    max_attempts: int

    @property
    def root(self) -> bool:
        return not self.after and self.each_of is None

    @property
    def preds(self) -> tuple[str, ...]:
        return self.after if self.each_of is None else (self.each_of,)


@dataclass(frozen=True)
class Definition:
    steps: tuple[StepSpec, ...]
    on_failure: StepSpec | None
    by_name: Mapping[str, StepSpec] = field(init=False, repr=False, compare=False)
    successors: Mapping[str, tuple[StepSpec, ...]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        every = self.steps + ((self.on_failure,) if self.on_failure else ())
        object.__setattr__(self, "by_name", {step.name: step for step in every})
        successors: dict[str, list[StepSpec]] = {step.name: [] for step in self.steps}
        for step in self.steps:
            for pred in step.preds:
                successors[pred].append(step)
        object.__setattr__(self, "successors", {name: tuple(found) for name, found in successors.items()})

    @property
    def sinks(self) -> tuple[StepSpec, ...]:
        return tuple(step for step in self.steps if not self.successors[step.name])

    def tolerated(self, step: str) -> bool:
        """Whether a dead member of `step` leaves the workflow running: only when every
        step after it is an `all_finished` join."""
        after = self.successors.get(step, ())
        return bool(after) and all(s.each_of is None and s.join == "all_finished" for s in after)

    def encode(self) -> bytes:
        encoded: bytes = msgpack.packb([[_spec_fields(s) for s in self.steps],
                              None if self.on_failure is None else _spec_fields(self.on_failure)], use_bin_type=True)
        return encoded

    @classmethod
    def decode(cls, data: bytes) -> Definition:
        steps, failure = msgpack.unpackb(data, raw=False)
        return cls(tuple(_spec_of(f) for f in steps), None if failure is None else _spec_of(failure))


def _spec_fields(s: StepSpec) -> list[Any]:
    return [s.name, s.type, s.payload, s.width, list(s.after), s.each_of, s.join, s.priority.value, s.cost,
            s.max_attempts]


def _spec_of(f: list[Any]) -> StepSpec:
    return StepSpec(f[0], f[1], f[2], f[3], tuple(f[4]), f[5], f[6], Priority(f[7]), f[8], f[9])


def check_workflow_id(workflow_id: object) -> str:
    if not isinstance(workflow_id, str) or not _WORKFLOW_ID.fullmatch(workflow_id):
        raise InvalidWorkflow(f"a workflow id is 1 to 100 of A-Z a-z 0-9 _ . : - (starting with a letter or digit), "
                              f"got {workflow_id!r}")
    return workflow_id


def compile_workflow(workflow: Workflow) -> tuple[Definition, dict[str, list[bytes]]]:
    """The stored definition, and each root's members' payloads (encoded), or
    `InvalidWorkflow` naming the first problem."""
    check_name("tenant", workflow.tenant)
    if workflow.workflow_id is not None:
        check_workflow_id(workflow.workflow_id)
    if isinstance(workflow.steps, (str, bytes)) or not isinstance(workflow.steps, Sequence):
        raise InvalidWorkflow(f"a workflow's steps are a list of steps, got {workflow.steps!r}")
    if not workflow.steps:
        raise InvalidWorkflow("a workflow needs at least one step")
    if len(workflow.steps) > MAX_STEPS:
        raise InvalidWorkflow(f"a workflow has at most {MAX_STEPS} steps, got {len(workflow.steps)}")
    specs: dict[str, StepSpec] = {}
    root_payloads: dict[str, list[bytes]] = {}
    for step in workflow.steps:
        if not isinstance(step, Step):
            raise InvalidWorkflow(f"a workflow's steps are Step objects, got {step!r}")
        spec, payloads = _compile_step(step, specs)
        specs[spec.name] = spec
        if payloads is not None:
            root_payloads[spec.name] = payloads
    failure = None
    if workflow.on_failure is not None:
        step = workflow.on_failure
        if step.after or step.each_of or step.payloads is not None:
            raise InvalidWorkflow(f"the on-failure step {step.name!r} has no dependencies and one payload")
        failure, _ = _compile_step(step, specs)
    total = sum(spec.width for spec in specs.values()) + (failure.width if failure else 0)
    if total > MAX_MEMBERS:
        raise InvalidWorkflow(f"a workflow has at most {MAX_MEMBERS:,} step members in all, got {total:,}")
    definition = Definition(tuple(specs.values()), failure)
    if len(definition.encode()) > MAX_DEFINITION_BYTES:
        raise InvalidWorkflow(f"a workflow's definition (steps and their payloads, roots' member payloads apart) is "
                              f"at most {MAX_DEFINITION_BYTES // 1024} KiB encoded")
    return definition, root_payloads


def _compile_step(step: Step, earlier: Mapping[str, StepSpec]) -> tuple[StepSpec, list[bytes] | None]:
    """Steps are given in an order where each names only earlier ones, so no cycle can
    be written."""
    try:
        return _checked_step(step, earlier)
    except InvalidWorkflow:
        raise
    except InvalidTask as exc:  # a bad type, payload or cost, said of the step
        raise InvalidWorkflow(f"step {step.name!r}: {exc}") from None


def _checked_step(step: Step, earlier: Mapping[str, StepSpec]) -> tuple[StepSpec, list[bytes] | None]:
    where = f"step {step.name!r}"
    if not isinstance(step.name, str) or not _STEP_NAME.fullmatch(step.name):
        raise InvalidWorkflow(f"a step's name is 1 to 64 of A-Z a-z 0-9 _ . - (starting with a letter or digit), "
                              f"got {step.name!r}")
    if step.name in earlier:
        raise InvalidWorkflow(f"two steps are named {step.name!r}")
    check_name("type", step.type)
    if isinstance(step.after, str):
        after: tuple[str, ...] = (step.after,)
    elif isinstance(step.after, Sequence) and all(isinstance(name, str) for name in step.after):
        after = tuple(step.after)
    else:
        raise InvalidWorkflow(f"{where}: 'after' is a list of step names, got {step.after!r}")
    if step.each_of is not None and not isinstance(step.each_of, str):
        raise InvalidWorkflow(f"{where}: 'each_of' is one step's name, got {step.each_of!r}")
    if after and step.each_of is not None:
        raise InvalidWorkflow(f"{where} has both 'after' and 'each_of': a step is a join or follows another "
                              "member by member, not both")
    for pred in after + ((step.each_of,) if step.each_of is not None else ()):
        if pred not in earlier:
            raise InvalidWorkflow(f"{where} depends on {pred!r}, which is not a step listed before it")
    if len(set(after)) != len(after):
        raise InvalidWorkflow(f"{where} names a step twice in 'after'")
    if step.join not in JOINS:
        raise InvalidWorkflow(f"{where}: join is one of {', '.join(JOINS)}, got {step.join!r}")
    payloads: list[bytes] | None = None
    if step.payloads is not None:
        if after or step.each_of is not None:
            raise InvalidWorkflow(f"{where}: only a step without dependencies takes 'payloads' (one per member); "
                                  "later steps get what their predecessors returned")
        if step.count is not None or step.payload is not None:
            raise InvalidWorkflow(f"{where}: give 'payloads' or 'payload' and 'count', not both")
        if isinstance(step.payloads, (str, bytes)) or not isinstance(step.payloads, Sequence):
            raise InvalidWorkflow(f"{where}: 'payloads' is a list, one payload per member")
        payloads = [encode_payload(p) for p in step.payloads]
        width = len(payloads)
    elif step.each_of is not None:
        if step.count is not None:
            raise InvalidWorkflow(f"{where} is as wide as {step.each_of!r}; it takes no 'count'")
        width = earlier[step.each_of].width
    else:
        width = 1 if step.count is None else step.count
    if not isinstance(width, int) or isinstance(width, bool) or not 1 <= width <= MAX_WIDTH:
        raise InvalidWorkflow(f"{where}: a step has 1 to {MAX_WIDTH:,} members, got {width!r}")
    payload = encode_payload(step.payload)
    if not valid_max_attempts(step.max_attempts):
        raise InvalidWorkflow(f"{where}: max_attempts must be an integer from 1 up, got {step.max_attempts!r}")
    check_cost(step.cost)
    priority = _priority(step.priority, where)
    if payloads is None and not after and step.each_of is None:
        payloads = [payload] * width
    return StepSpec(step.name, step.type, payload, width, after, step.each_of, step.join, priority, step.cost,
                    step.max_attempts), payloads


def _priority(value: object, where: str) -> Priority:
    if isinstance(value, Priority):
        return value
    if isinstance(value, str) and value.lower() in {p.value for p in Priority}:
        return Priority(value.lower())
    raise InvalidWorkflow(f"{where}: priority is high, normal or low, got {value!r}")


def step_key(workflow_id: str, step: str, index: int) -> str:
    """The idempotency key of a member's task: with the tenant and the claim's time it
    fixes the task's id (`TaskId.for_key`)."""
    return f"{KEY_PREFIX}{workflow_id}/{step}/{index}"


def parse_step_key(key: str | None) -> tuple[str, str, int] | None:
    """(workflow id, step, index) of a step's key; None for any other key."""
    if key is None or not key.startswith(KEY_PREFIX):
        return None
    workflow_id, _, rest = key[len(KEY_PREFIX):].partition("/")
    step, _, index = rest.partition("/")
    if not workflow_id or not step or not index.isdigit():
        return None
    return workflow_id, step, int(index)


def from_json(document: object, *, tenant: str | None = None) -> Workflow:
    """A `Workflow` from a JSON document (`scheduler workflow submit FILE`):

        {"tenant": "board", "id": "results-2026",
         "steps": [{"name": "render", "type": "render", "payloads": [{"batch": 1}, {"batch": 2}]},
                   {"name": "send", "type": "send_sms", "each_of": "render"},
                   {"name": "report", "type": "report", "after": ["send"], "join": "all_finished"}],
         "on_failure": {"name": "alert", "type": "alert", "payload": {"to": "ops"}}}
    """
    if not isinstance(document, dict):
        raise InvalidWorkflow("a workflow file holds one JSON object with 'tenant' and 'steps'")
    unknown = set(document) - {"tenant", "id", "steps", "on_failure"}
    if unknown:
        raise InvalidWorkflow(f"unknown workflow field(s): {', '.join(sorted(unknown))}")
    steps = document.get("steps")
    if not isinstance(steps, list):
        raise InvalidWorkflow("'steps' is a list of steps")
    failure = document.get("on_failure")
    return Workflow(tenant=tenant or document.get("tenant"),  # type: ignore[arg-type]  # checked by compile
                    steps=[_step_from_json(s) for s in steps],
                    on_failure=None if failure is None else _step_from_json(failure),
                    workflow_id=document.get("id"))


_STEP_FIELDS = {"name", "type", "payload", "payloads", "count", "after", "each_of", "join", "priority", "cost",
                "max_attempts"}


def _step_from_json(item: object) -> Step:
    if not isinstance(item, dict):
        raise InvalidWorkflow(f"a step is a JSON object, got {item!r}")
    unknown = set(item) - _STEP_FIELDS
    if unknown:
        raise InvalidWorkflow(f"step {item.get('name')!r}: unknown field(s) {', '.join(sorted(unknown))}")
    if "name" not in item or "type" not in item:
        raise InvalidWorkflow(f"a step needs a 'name' and a 'type': {item!r}")
    return Step(**item)
