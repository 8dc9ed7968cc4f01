"""Conversions between the planner's protobuf messages and its domain objects."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from simrun.v1 import common_pb2
from simrun_core import messages
from simrun_core.messages import priority_from_proto, resources_from_proto
from simrun_core.resources import SplitMode

from simrun_planner.planning import POD_START_S, Node, PodShape, TaskPlan


@dataclass(frozen=True)
class TaskRef:
    """A task as the planner reads it from a request: its id."""

    id: str


def node_from_proto(message: common_pb2.Node) -> Node:
    """A node; unset (zero) allocatable cores and memory default to the node's cores and memory."""
    return Node(
        name=message.name,
        cores=message.cores,
        memory_gb=message.memory_gb,
        gpus=message.gpus,
        reserved_by=message.reserved_by or None,
        allocatable_cores=message.allocatable_cores or None,  # type: ignore[arg-type]
        allocatable_memory_gb=message.allocatable_memory_gb or None,  # type: ignore[arg-type]
    )


def nodes_from_proto(messages: Iterable[common_pb2.Node]) -> list[Node]:
    """The nodes of a request."""
    return [node_from_proto(m) for m in messages]


def max_processes_from_proto(value: int) -> int | None:
    """0 stands for as many as fit."""
    return None if value == 0 else value


def mode_from_proto(value: int) -> SplitMode:
    """An unset mode is the default, fastest."""
    return messages.mode_from_proto(value) or SplitMode.FASTEST


def pod_start_from_proto(value: float) -> float:
    """0 stands for the default seconds a pod takes to start."""
    return POD_START_S if value == 0 else value


def shape_to_proto(shape: PodShape) -> common_pb2.PodShape:
    """The message of a pod shape."""
    return common_pb2.PodShape(
        cores=shape.cores,
        memory_gb=shape.memory_gb,
        processes=shape.processes,
        per_worker_gb=shape.per_worker_gb,
        retry_memory_gb=shape.retry_memory_gb,
        retry_per_worker_gb=shape.retry_per_worker_gb,
        scratch_gb=shape.scratch_gb,
        gpus=shape.gpus,
    )


def plan_to_proto(plan: TaskPlan) -> common_pb2.TaskPlan:
    """The message of a task plan; units stay absent for an unsplit task."""
    message = common_pb2.TaskPlan(
        task_id=plan.task_id,
        pods=plan.pods,
        shape=shape_to_proto(plan.shape),
        base_priority=plan.base_priority,
        extra_priority=plan.extra_priority,
        coordinator_merges=plan.coordinator_merges,
    )
    if plan.units is not None:
        message.units = plan.units
    return message


__all__ = [
    "max_processes_from_proto",
    "mode_from_proto",
    "node_from_proto",
    "nodes_from_proto",
    "plan_to_proto",
    "pod_start_from_proto",
    "priority_from_proto",
    "resources_from_proto",
    "shape_to_proto",
]
