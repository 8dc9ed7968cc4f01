"""Workflow files: parsing, and the checks that need no task type (names, input references, cycles)."""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from graphlib import CycleError, TopologicalSorter
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from simrun_core.errors import InvalidArgument
from simrun_core.resources import SplitMode
from simrun_core.validation import first_error

# libyaml's safe loader where PyYAML was built with it (ten times faster on a submission's workflow), else Python's.
_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
# Task ids become parts of pod and Kubernetes object names: DNS-1123 labels, kept short.
_TASK_ID = re.compile(r"^[a-z0-9]([a-z0-9-]{0,38}[a-z0-9])?$")
_INPUT_REF = re.compile(r"^(?P<task>[^.\s]+)\.(?P<port>[^.\s]+)$")


class TaskSpec(BaseModel):
    """One task of a workflow file (frozen: a parsed workflow is shared by the submissions of the same text)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    type: str = Field(min_length=1, description="`module:Class` or a `simrun.task_types` entry point name.")
    settings: dict[str, Any] = Field(default_factory=dict)
    inputs: dict[str, str] = Field(default_factory=dict, description="input port -> `<task>.<port>`")
    mode: SplitMode | None = None
    unit_timeout_s: float | None = Field(
        default=None,
        gt=0,
        allow_inf_nan=False,
        description="The time limit of one unit of this task (of an unsplit task: its run), seconds "
        "(SIMRUN_UNIT_TIMEOUT_S in its pods); unset: the type's own limit, else a day (an unsplit task: none).",
    )


class WorkflowSpec(BaseModel):
    """A workflow file: tasks with types, settings and inputs; a mode, group and reservation for the run (frozen,
    as its tasks are)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str = "workflow"
    group: str | None = None
    mode: SplitMode = SplitMode.FASTEST
    reserve: str | None = None
    tasks: dict[str, TaskSpec] = Field(min_length=1)

    @field_validator("tasks")
    @classmethod
    def _task_ids(cls, tasks: dict[str, TaskSpec]) -> dict[str, TaskSpec]:
        for task_id in tasks:
            if not _TASK_ID.match(task_id):
                raise ValueError(
                    f"task id {task_id!r} must be lowercase letters, digits and '-', at most 40 characters"
                )
        return tasks


@dataclass(frozen=True)
class InputRef:
    """An input of a task: the output port `port` of the task `task`."""

    task: str
    port: str


@dataclass(frozen=True)
class Workflow:
    """A parsed workflow whose tasks are in the order they run (inputs first)."""

    spec: WorkflowSpec
    text: str
    order: tuple[str, ...]
    inputs: dict[str, dict[str, InputRef]] = field(default_factory=dict)

    def mode_of(self, task_id: str, override: SplitMode | None = None) -> SplitMode:
        """The split mode of a task: the submission's, else the task's, else the workflow's."""
        return override or self.spec.tasks[task_id].mode or self.spec.mode


def parse_workflow(text: str, source: str = "workflow") -> Workflow:
    """Parses a workflow file and checks what needs no task type.

    Raises:
        InvalidArgument: bad YAML, an unknown or missing field, a bad task id, an input naming a task that does
            not exist or not written `<task>.<port>`, a task reading itself, or a cycle (named).
    """
    try:
        data = yaml.load(text, Loader=_SAFE_LOADER)
    except yaml.YAMLError as exc:
        raise InvalidArgument(f"{source} is not valid YAML: {str(exc).splitlines()[0]}") from exc
    if not isinstance(data, dict):
        raise InvalidArgument(f"{source} must be a mapping with `tasks:`")
    try:
        spec = WorkflowSpec.model_validate(data)
    except ValidationError as exc:
        raise InvalidArgument(f"{source}: {first_error(exc)}") from exc
    inputs: dict[str, dict[str, InputRef]] = {}
    graph: dict[str, set[str]] = {}
    for task_id, task in spec.tasks.items():
        refs: dict[str, InputRef] = {}
        for port, ref_text in task.inputs.items():
            match = _INPUT_REF.match(ref_text)
            if not match:
                raise InvalidArgument(
                    f"{source}: tasks.{task_id}.inputs.{port}: {ref_text!r} must be written <task>.<port>"
                )
            ref = InputRef(match["task"], match["port"])
            if ref.task not in spec.tasks:
                raise InvalidArgument(f"{source}: tasks.{task_id}.inputs.{port}: no task {ref.task!r} in the workflow")
            if ref.task == task_id:
                raise InvalidArgument(f"{source}: tasks.{task_id}.inputs.{port}: a task cannot read itself")
            refs[port] = ref
        inputs[task_id] = refs
        graph[task_id] = {ref.task for ref in refs.values()}
    try:
        TopologicalSorter(graph).prepare()
    except CycleError as exc:
        cycle = " -> ".join(exc.args[1])
        raise InvalidArgument(f"{source}: the tasks' inputs form a cycle: {cycle}") from exc
    return Workflow(spec=spec, text=text, order=_stable_order(list(spec.tasks), graph), inputs=inputs)


class WorkflowCache:
    """The workflows parsed from the texts submitted last, by text: agents send the same workflow again and again,
    and parsing one costs tens of microseconds alone, a quarter of a millisecond
    of CPU under ten clients' submissions. At most `chars` of text are kept (a text may be a
    megabyte). A cached workflow is shared: read it only (its specs are frozen)."""

    def __init__(self, chars: int = 4 << 20) -> None:
        self._chars = chars
        self._kept = 0
        self._parsed: OrderedDict[str, Workflow] = OrderedDict()
        self._lock = threading.Lock()

    def parse(self, text: str) -> Workflow:
        """`parse_workflow(text)`, from the cache where the same text was parsed lately (errors are not kept)."""
        with self._lock:
            workflow = self._parsed.get(text)
            if workflow is not None:
                self._parsed.move_to_end(text)
                return workflow
        workflow = parse_workflow(text)
        if len(text) > self._chars:
            return workflow
        with self._lock:
            if text not in self._parsed:
                self._parsed[text] = workflow
                self._kept += len(text)
            while self._kept > self._chars:
                dropped, _ = self._parsed.popitem(last=False)
                self._kept -= len(dropped)
        return workflow


def _stable_order(tasks: list[str], graph: dict[str, set[str]]) -> tuple[str, ...]:
    """Inputs first, and the file's order among tasks that do not depend on each other."""
    done: list[str] = []
    remaining = list(tasks)
    while remaining:
        ready = next(t for t in remaining if graph[t] <= set(done))
        done.append(ready)
        remaining.remove(ready)
    return tuple(done)
