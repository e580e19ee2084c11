"""A workflow's definition: what is refused before anything is stored, and what is kept."""

from __future__ import annotations

import json

import pytest

from scheduler.model import Priority, decode_payload
from scheduler.workflows.definition import (
    MAX_MEMBERS,
    MAX_STEPS,
    MAX_WIDTH,
    Definition,
    InvalidWorkflow,
    Step,
    Workflow,
    check_workflow_id,
    compile_workflow,
    from_json,
    parse_step_key,
    step_key,
)


def results_day(batches: int = 3) -> Workflow:
    return Workflow("board", [
        Step("render", "render", payloads=[{"batch": i} for i in range(batches)]),
        Step("send", "send_sms", each_of="render", priority="high"),
        Step("report", "report", after=["send"], payload={"to": "board"}),
    ], on_failure=Step("alert", "alert", payload={"to": "ops"}), workflow_id="results-2026")


def test_a_fan_out_then_member_by_member_then_a_join_compiles_with_widths_and_successors() -> None:
    definition, payloads = compile_workflow(results_day(3))
    widths = {step.name: step.width for step in definition.steps}
    assert widths == {"render": 3, "send": 3, "report": 1}
    assert [decode_payload(p) for p in payloads["render"]] == [{"batch": 0}, {"batch": 1}, {"batch": 2}]
    assert [s.name for s in definition.successors["render"]] == ["send"]
    assert [s.name for s in definition.sinks] == ["report"]
    assert definition.by_name["send"].priority is Priority.HIGH
    assert definition.on_failure is not None and definition.on_failure.name == "alert"
    assert Definition.decode(definition.encode()) == definition


def test_only_steps_before_all_finished_joins_tolerate_a_dead_member() -> None:
    definition, _ = compile_workflow(Workflow("t", [
        Step("a", "x", count=2), Step("b", "x", after=["a"], join="all_finished"),
        Step("c", "x", each_of="b"), Step("d", "x", after=["c"])]))
    assert definition.tolerated("a")
    assert not definition.tolerated("b")  # c follows b member by member
    assert not definition.tolerated("d")  # a sink: nothing is left to tolerate it


@pytest.mark.parametrize(("steps", "message"), [
    ([], "at least one step"),
    ([Step("a", "x"), Step("a", "y")], "two steps are named 'a'"),
    ([Step("a", "x", after=["b"]), Step("b", "x")], "not a step listed before it"),
    ([Step("a", "x"), Step("b", "x", after=["a"], each_of="a")], "both 'after' and 'each_of'"),
    ([Step("a", "x"), Step("b", "x", each_of="a", payloads=[1])], "only a step without dependencies"),
    ([Step("a", "x", count=MAX_WIDTH + 1)], "1 to 10,000 members"),
    ([Step("a", "x", count=0)], "1 to 10,000 members"),
    ([Step("bad name", "x")], "a step's name"),
    ([Step("a", "")], "step 'a': a task needs a type"),
    ([Step("a", "x", join="any")], "join is one of"),  # type: ignore[arg-type]
    ([Step("a", "x", priority="urgent")], "priority is high, normal or low"),
    ([Step("a", "x", payload=object())], "msgpack"),
    ([Step("a", "x", payloads=[1], count=2)], "not both"),
])
def test_a_bad_step_is_refused_with_what_is_wrong(steps: list[Step], message: str) -> None:
    with pytest.raises(InvalidWorkflow, match=message):
        compile_workflow(Workflow("t", steps))


def test_limits_on_steps_and_members() -> None:
    with pytest.raises(InvalidWorkflow, match=f"at most {MAX_STEPS} steps"):
        compile_workflow(Workflow("t", [Step(f"s{i}", "x") for i in range(MAX_STEPS + 1)]))
    with pytest.raises(InvalidWorkflow, match="step members in all"):
        compile_workflow(Workflow("t", [Step("a", "x", count=MAX_WIDTH), Step("b", "x", each_of="a"),
                                        Step("c", "x", each_of="b")]))
    assert 3 * MAX_WIDTH > MAX_MEMBERS


def test_step_keys_round_trip_and_other_keys_are_not_steps() -> None:
    assert parse_step_key(step_key("results-2026", "send", 41)) == ("results-2026", "send", 41)
    for other in (None, "order-17", "workflow/", "workflow/x/y/z", "workflow/x//1"):
        assert parse_step_key(other) is None
    with pytest.raises(InvalidWorkflow):
        check_workflow_id("has/slash")


def test_the_json_form_gives_the_same_workflow() -> None:
    document = json.loads("""{"tenant": "board", "id": "results-2026",
        "steps": [{"name": "render", "type": "render", "payloads": [{"batch": 0}, {"batch": 1}, {"batch": 2}]},
                  {"name": "send", "type": "send_sms", "each_of": "render", "priority": "high"},
                  {"name": "report", "type": "report", "after": ["send"], "payload": {"to": "board"}}],
        "on_failure": {"name": "alert", "type": "alert", "payload": {"to": "ops"}}}""")
    assert compile_workflow(from_json(document)) == compile_workflow(results_day(3))
    with pytest.raises(InvalidWorkflow, match="unknown field"):
        from_json({"tenant": "t", "steps": [{"name": "a", "type": "x", "retries": 3}]})
    with pytest.raises(InvalidWorkflow, match="unknown workflow field"):
        from_json({"tenant": "t", "steps": [], "owner": "me"})
    with pytest.raises(InvalidWorkflow, match="needs a 'name' and a 'type'"):
        from_json({"tenant": "t", "steps": [{"name": "a"}]})


@pytest.mark.parametrize(("second", "message"), [
    ({"name": "b", "type": "x", "after": None}, "'after' is a list of step names"),
    ({"name": "b", "type": "x", "after": 5}, "'after' is a list of step names"),
    ({"name": "b", "type": "x", "after": [["a"]]}, "'after' is a list of step names"),
    ({"name": "b", "type": "x", "each_of": ["a"]}, "'each_of' is one step's name"),
    ({"name": "b", "type": "x", "count": "3"}, "1 to 10,000 members"),
    ({"name": "b", "type": "x", "priority": 1}, "priority is high, normal or low"),
])
def test_a_file_with_a_value_of_the_wrong_kind_is_refused_with_what_is_wrong(second: dict[str, object],
                                                                             message: str) -> None:
    """Every mistake in a file is an `InvalidWorkflow` naming it (exit 2 from the CLI),
    never a traceback."""
    with pytest.raises(InvalidWorkflow, match=message):
        compile_workflow(from_json({"tenant": "t", "steps": [{"name": "a", "type": "x"}, second]}))


def test_a_bad_workflow_id_is_refused_before_anything_is_opened() -> None:
    with pytest.raises(InvalidWorkflow, match="a workflow id is"):
        compile_workflow(from_json({"tenant": "t", "id": 5, "steps": [{"name": "a", "type": "x"}]}))
