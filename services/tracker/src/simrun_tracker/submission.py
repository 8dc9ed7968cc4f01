"""Turns a submitted workflow into a planned run: type checks in a subprocess, resolved resources, plans."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from simrun_core.errors import FailedPrecondition, InvalidArgument, NotFound
from simrun_core.identity import Priority
from simrun_core.resources import ObservationKey, ResolvedResources, SplitMode
from simrun_core.workflow import Workflow
from simrun_planner import Node, PlanError, TaskPlan, plan_task
from simrun_runtime.describe import DescribeRequest
from simrun_runtime.layout import StoreLayout
from simrun_runtime.loading import TypeDescription
from simrun_runtime.record import SnapshotRef

from simrun_tracker.describer import TypeDescriber
from simrun_tracker.ports import LearnerPort


@dataclass(frozen=True)
class PlannedTask:
    """A task of a submission, checked against its type, with its resources and plan."""

    task_id: str
    description: TypeDescription
    resources: ResolvedResources
    plan: TaskPlan
    key: ObservationKey


@dataclass(frozen=True)
class _PlanTask:
    """What `plan_task` reads of a task: its id."""

    id: str


@dataclass(frozen=True)
class _PlanType:
    """What `plan_task` reads of a type: its name and whether it is split."""

    name: str
    split: bool


def check_snapshots(store: StoreLayout, snapshots: list[SnapshotRef]) -> Path:
    """The model root (the first snapshot); `NotFound` for a snapshot not in the store."""
    if not snapshots:
        raise InvalidArgument("a run needs the snapshot of its model: snapshot the working tree first")
    roots = [snapshot.resolve(store) for snapshot in snapshots]
    for snapshot, root in zip(snapshots, roots, strict=True):
        if not root.is_dir():
            raise NotFound(snapshot.not_in_store("tracker"))
    return roots[0]


def describe_tasks(
    describer: TypeDescriber,
    interpreter: str,
    model_root: Path,
    workflow: Workflow,
    libraries: tuple[Path, ...] = (),
) -> dict[str, TypeDescription]:
    """Loads every task's type in a subprocess and checks settings and inputs against it; `libraries` are the
    run's other snapshots, which the model's imports may read.

    Raises:
        InvalidArgument: an unknown task type, an unknown or misspelled setting, an input port the type does not
            have, an unconnected input port, or an input reading a port its task does not have.
    """
    order = list(workflow.order)
    requests = [
        DescribeRequest(
            type=workflow.spec.tasks[t].type,
            model_root=str(model_root),
            settings=workflow.spec.tasks[t].settings,
            libraries=[str(p) for p in libraries],
        )
        for t in order
    ]
    responses = describer.describe(interpreter, model_root, requests, libraries)
    descriptions: dict[str, TypeDescription] = {}
    for task_id, response in zip(order, responses, strict=True):
        if not response.ok or response.description is None:
            raise InvalidArgument(f"task {task_id}: {response.error}")
        description = response.description
        if description.settings_errors:
            raise InvalidArgument(f"task {task_id}: {'; '.join(description.settings_errors)}")
        descriptions[task_id] = description
    for task_id in order:
        description = descriptions[task_id]
        wired = workflow.inputs[task_id]
        for port, ref in wired.items():
            if port not in description.inputs:
                known = ", ".join(description.inputs) or "none"
                raise InvalidArgument(
                    f"task {task_id}: unknown input port {port!r} of type {description.type} (its inputs: {known})"
                )
            upstream = descriptions[ref.task]
            if ref.port not in upstream.outputs:
                known = ", ".join(upstream.outputs) or "none"
                raise InvalidArgument(
                    f"task {task_id}: input {port} reads {ref.task}.{ref.port}, but {ref.task} has no output "
                    f"port {ref.port!r} (its outputs: {known})"
                )
        for port in description.inputs:
            if port not in wired:
                raise InvalidArgument(f"task {task_id}: input port {port!r} is not connected: add inputs.{port}")
    return descriptions


def reserving(nodes: list[Node], run_id: str, reserve: str | None) -> list[Node]:
    """The nodes as they will be once the run holds its reservation, for the planner to plan with.

    Raises:
        NotFound: the node to reserve does not exist.
        FailedPrecondition: another run holds the node to reserve.
    """
    if reserve is None:
        return nodes
    for node in nodes:
        if node.name == reserve:
            if node.reserved_by not in (None, run_id):
                raise FailedPrecondition(f"node {reserve} is reserved by run {node.reserved_by}")
            return [dataclasses.replace(n, reserved_by=run_id) if n is node else n for n in nodes]
    raise NotFound(f"no node {reserve!r}: `simrun nodes` lists them")


def plan_tasks(
    workflow: Workflow,
    descriptions: dict[str, TypeDescription],
    learner: LearnerPort,
    nodes: list[Node],
    model: str,
    priority: Priority,
    mode: SplitMode | None,
    run_id: str,
) -> list[PlannedTask]:
    """Resolves each task's resources through the learner and plans its pods through the planner."""
    planned = []
    for task_id in workflow.order:
        description = descriptions[task_id]
        hint = description.resources
        key = ObservationKey(description.type, model, description.cost_value or "")
        resources = learner.resolve(
            key,
            ResolvedResources(
                base_memory_gb=hint.base_memory_gb,
                per_worker_gb=hint.per_worker_gb,
                cores_per_process=hint.cores_per_process,
                gpus=hint.gpus,
                scratch_gb=hint.scratch_gb,
            ),
        )
        try:
            plan = plan_task(
                _PlanTask(task_id),
                _PlanType(description.type, description.split),
                resources,
                nodes,
                workflow.mode_of(task_id, mode),
                priority,
                description.units if description.split else None,
                run_id=run_id,
            )
        except PlanError as exc:
            raise FailedPrecondition(f"task {task_id}: {exc}") from exc
        planned.append(PlannedTask(task_id, description, resources, plan, key))
    return planned
