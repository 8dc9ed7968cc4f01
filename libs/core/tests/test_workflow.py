"""Workflow files: parsing, task order, and the checks that need no task type."""

from __future__ import annotations

import pydantic
import pytest
from simrun_core.errors import InvalidArgument
from simrun_core.resources import SplitMode
from simrun_core.workflow import InputRef, WorkflowCache, parse_workflow

GOOD = """
name: sweep
group: paper-1
mode: single-server
reserve: big
tasks:
  report:
    type: model.tasks:Report
    inputs: {table: fit.table, raw: scan.table}
  scan:
    type: model.tasks:Scan
    settings: {points: 8}
    mode: fastest
  fit:
    type: model.tasks:Fit
    inputs: {table: scan.table}
  plot:
    type: model.tasks:Plot
"""


def test_good_file_parses_with_its_fields() -> None:
    workflow = parse_workflow(GOOD, "sweep.yaml")
    spec = workflow.spec
    assert (spec.name, spec.group, spec.mode, spec.reserve) == ("sweep", "paper-1", SplitMode.SINGLE_SERVER, "big")
    assert spec.tasks["scan"].settings == {"points": 8}
    assert workflow.text == GOOD
    assert workflow.inputs["report"] == {"table": InputRef("fit", "table"), "raw": InputRef("scan", "table")}
    assert workflow.inputs["scan"] == {}


def test_defaults() -> None:
    spec = parse_workflow("tasks: {a: {type: m:A}}").spec
    assert (spec.name, spec.group, spec.mode, spec.reserve) == ("workflow", None, SplitMode.FASTEST, None)


def test_order_puts_inputs_first_and_keeps_the_file_order_among_independent_tasks() -> None:
    assert parse_workflow(GOOD).order == ("scan", "fit", "report", "plot")
    independent = "tasks: {c: {type: t}, a: {type: t}, b: {type: t}}"
    assert parse_workflow(independent).order == ("c", "a", "b")


def test_mode_of_prefers_the_submission_then_the_task_then_the_workflow() -> None:
    workflow = parse_workflow(GOOD)
    assert workflow.mode_of("fit") is SplitMode.SINGLE_SERVER  # the workflow's
    assert workflow.mode_of("scan") is SplitMode.FASTEST  # the task's over the workflow's
    assert workflow.mode_of("scan", SplitMode.SINGLE_SERVER) is SplitMode.SINGLE_SERVER  # the submission's
    assert workflow.mode_of("fit", SplitMode.FASTEST) is SplitMode.FASTEST


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("tasks: [a, b", "wf.yaml is not valid YAML: "),
        ("- a\n- b\n", "wf.yaml must be a mapping with `tasks:`"),
        ("", "wf.yaml must be a mapping with `tasks:`"),
        ("tasks: {a: {type: t, setings: {}}}", "wf.yaml: tasks.a.setings: unknown field (misspelled?)"),
        ("tasks: {a: {type: t}}\ngruop: g", "wf.yaml: gruop: unknown field (misspelled?)"),
        ("name: x", "wf.yaml: tasks: required field is missing"),
        ("tasks: {}", "wf.yaml: tasks: "),
        ("tasks: {a: {type: t}}\nmode: quickest", "wf.yaml: mode: "),
        ("tasks: {Fit_1: {type: t}}", "task id 'Fit_1' must be lowercase letters, digits and '-'"),
        ("tasks: {-a: {type: t}}", "task id '-a'"),
        (f"tasks: {{{'a' * 41}: {{type: t}}}}", "at most 40 characters"),
        ("tasks: {a: {type: t}, b: {type: t, inputs: {x: a}}}", "tasks.b.inputs.x: 'a' must be written <task>.<port>"),
        ("tasks: {a: {type: t}, b: {type: t, inputs: {x: a.o.p}}}", "'a.o.p' must be written <task>.<port>"),
        ("tasks: {a: {type: t}, b: {type: t, inputs: {x: c.o}}}", "tasks.b.inputs.x: no task 'c' in the workflow"),
        ("tasks: {a: {type: t, inputs: {x: a.o}}}", "tasks.a.inputs.x: a task cannot read itself"),
    ],
)
def test_refusals_name_the_culprit(text: str, message: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        parse_workflow(text, "wf.yaml")
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_forty_character_task_id_is_accepted() -> None:
    assert parse_workflow(f"tasks: {{{'a' * 40}: {{type: t}}}}").order == ("a" * 40,)


def test_a_cycle_is_named() -> None:
    text = """
tasks:
  a: {type: t, inputs: {i: c.o}}
  b: {type: t, inputs: {i: a.o}}
  c: {type: t, inputs: {i: b.o}}
  d: {type: t}
"""
    with pytest.raises(InvalidArgument, match="the tasks' inputs form a cycle: ") as info:
        parse_workflow(text, "wf.yaml")
    cycle = str(info.value).split("cycle: ")[1].split(" -> ")
    assert cycle[0] == cycle[-1]
    assert sorted(cycle[:-1]) == ["a", "b", "c"]


def test_a_task_may_set_the_time_limit_of_its_units() -> None:
    spec = parse_workflow("tasks: {a: {type: m:A, unit_timeout_s: 90}, b: {type: m:B}}").spec
    assert (spec.tasks["a"].unit_timeout_s, spec.tasks["b"].unit_timeout_s) == (90, None)
    for bad in ("0", "-5", "soon"):
        with pytest.raises(InvalidArgument, match="unit_timeout_s"):
            parse_workflow(f"tasks: {{a: {{type: m:A, unit_timeout_s: {bad}}}}}", "wf.yaml")


def test_the_cache_parses_a_text_once_and_keeps_no_error_and_no_more_than_its_characters() -> None:
    cache = WorkflowCache(chars=200)
    text = "tasks:\n  a:\n    type: m:A\n    settings: {n: 1}\n"
    first = cache.parse(text)
    assert cache.parse(text) is first
    assert first == parse_workflow(text)
    with pytest.raises(pydantic.ValidationError):  # shared, so read only
        first.spec.tasks["a"].type = "m:B"  # type: ignore[misc]
    bad = "tasks:\n  A:\n    type: m:A\n"
    for _ in range(2):  # an error is raised again, not remembered as a workflow
        with pytest.raises(InvalidArgument, match="task id 'A'"):
            cache.parse(bad)
    others = [f"tasks:\n  t{n}:\n    type: m:A\n" for n in range(10)]  # 27 characters each: 200 hold 7
    for other in others:
        cache.parse(other)
    assert cache.parse(text) is not first  # dropped for the newer texts
    assert cache.parse(others[-1]) is cache.parse(others[-1])
    huge = "tasks:\n  a:\n    type: m:A\n    settings: {n: '" + "x" * 300 + "'}\n"
    assert cache.parse(huge) is not cache.parse(huge)  # larger than the whole cache: never kept
