"""The planner: the shape of a worker pod and the number of pieces of a task."""

from simrun_core.identity import Priority
from simrun_core.resources import ResolvedResources, SplitMode

from simrun_planner.planning import (
    MAX_PIECES,
    POD_START_S,
    RETRY_MEMORY_FACTOR,
    Node,
    PlanError,
    PodShape,
    TaskPlan,
    TaskSpec,
    TaskType,
    plan_task,
    retry_processes,
    shape,
    slots,
    usable_nodes,
)

__all__ = [
    "MAX_PIECES",
    "POD_START_S",
    "RETRY_MEMORY_FACTOR",
    "Node",
    "PlanError",
    "PodShape",
    "Priority",
    "ResolvedResources",
    "SplitMode",
    "TaskPlan",
    "TaskSpec",
    "TaskType",
    "plan_task",
    "retry_processes",
    "shape",
    "slots",
    "usable_nodes",
]
