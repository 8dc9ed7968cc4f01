"""The planner's domain: the shape of a worker pod and the number of pieces of a task, with no gRPC."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from simrun_core.errors import InvalidArgument
from simrun_core.identity import PodRole, Priority, priority_class
from simrun_core.resources import ResolvedResources, SplitMode

MAX_PIECES = 8
"""At most this many pods of one split task."""

POD_START_S = 10
"""About the seconds a pod takes to start on the cluster."""

RETRY_MEMORY_FACTOR = 1.5
"""A pod killed for memory is retried once with this many times the memory per process."""

# Sums of GiB such as 0.1 * 3 land a hair above a whole number; without this slack they would round up a GiB.
_EPS = 1e-9


class PlanError(ValueError):
    """A task which cannot be planned on the nodes."""


class TaskSpec(Protocol):
    """What the planner reads of a task: its id (a workflow's task, or anything with an `id`)."""

    @property
    def id(self) -> str: ...


class TaskType(Protocol):
    """What the planner reads of a task type: its name and whether it is split (e.g. `simrun.v1.TaskType`)."""

    @property
    def name(self) -> str: ...

    @property
    def split(self) -> bool: ...


@dataclass(frozen=True)
class Node:
    """A node of the cluster.

    Attributes:
        name: Name of the node.
        cores: The whole cores a worker pod of a run can have on the node, what the planner plans with.
        memory_gb: The GiB of memory a worker pod of a run can have on the node, what the planner plans with.
        gpus: Number of GPUs.
        reserved_by: Name of the reservation holding the node (the id of the run reserving it), None if free.
        allocatable_cores: The cores the scheduler gives the pods of the runs (sidecars included), as it counts
            their requests.
        allocatable_memory_gb: The GiB of memory the scheduler gives the pods of the runs, as it counts their
            requests.
    """

    name: str
    cores: int
    memory_gb: float
    gpus: int = 0
    reserved_by: str | None = None
    allocatable_cores: float = None  # type: ignore[assignment]  # None until __post_init__ fills in `cores`
    allocatable_memory_gb: float = None  # type: ignore[assignment]

    def __post_init__(self) -> None:
        """Create the node; the allocatable cores and memory default to the others."""
        if self.allocatable_cores is None:
            object.__setattr__(self, "allocatable_cores", float(self.cores))
        if self.allocatable_memory_gb is None:
            object.__setattr__(self, "allocatable_memory_gb", float(self.memory_gb))
        if self.cores < 0 or self.memory_gb < 0 or self.gpus < 0:
            raise InvalidArgument(f"node {self.name!r}: cores, memory_gb and gpus must not be negative")
        if self.allocatable_cores < 0 or self.allocatable_memory_gb < 0:
            raise InvalidArgument(f"node {self.name!r}: allocatable cores and memory must not be negative")


@dataclass(frozen=True)
class PodShape:
    """The resources of a worker pod.

    Attributes:
        cores: Number of cores.
        memory_gb: Memory in GiB, rounded up.
        processes: Number of worker processes.
        per_worker_gb: Memory per worker process in GiB.
        retry_memory_gb: Memory of a retry in GiB.
        retry_per_worker_gb: Memory per worker process of a retry in GiB.
        scratch_gb: Local scratch in GiB.
        gpus: Number of GPUs.
    """

    cores: int
    memory_gb: int
    processes: int
    per_worker_gb: float
    retry_memory_gb: int
    retry_per_worker_gb: float
    scratch_gb: float
    gpus: int


@dataclass(frozen=True)
class TaskPlan:
    """The plan of a task.

    Attributes:
        task_id: Id of the task.
        pods: Number of worker pods.
        shape: Shape of a pod.
        base_priority: Priority class of the first pods.
        extra_priority: Priority class of the further pods.
        units: Number of units, None for an unsplit task.
        coordinator_merges: Whether the coordinator of a split task merges once its ledger is complete, so the
            task has no merge pod. False for plans recorded before the merge moved into the coordinator.
    """

    task_id: str
    pods: int
    shape: PodShape
    base_priority: str
    extra_priority: str
    units: int | None
    coordinator_merges: bool = field(default=False)


def shape(
    resources: ResolvedResources,
    nodes: Sequence[Node],
    max_processes: int | None = None,
    *,
    run_id: str | None = None,
) -> PodShape:
    """Sizes a pod for the most common node which is not reserved.

    When one worker does not fit that node, the largest usable node is taken.

    The most common node is the most frequent (cores, memory, GPUs) among the usable nodes; of equally
    frequent ones the largest. The usable nodes are the free ones; a run holding a reservation (`run_id`)
    selects its reserved nodes, so for it those are the usable ones. The processes are as many as the node's
    cores (over cores per process) and memory (base plus memory per process, rounded up to whole GiB) allow.

    Args:
        resources: The resources of the task.
        nodes: The nodes of the cluster.
        max_processes: At most this many processes, as many as fit by default.
        run_id: The run asking; nodes reserved by it are usable (and the only usable ones).

    Returns:
        The shape of a pod.

    Raises:
        PlanError: One worker fits on no node.
    """
    _check_resources(resources)
    if max_processes is not None and max_processes < 1:
        raise InvalidArgument(f"max_processes must be at least 1, got {max_processes}")
    usable = usable_nodes(nodes, run_id)
    node = _sizing_node(resources, usable, nodes)
    processes = _processes_on(resources, node, resources.per_worker_gb)
    if max_processes is not None:
        processes = min(processes, max_processes)
    retry_per_worker_gb, _, retry_memory_gb = _retry(resources, node, processes)
    return PodShape(
        cores=processes * resources.cores_per_process,
        memory_gb=_memory_gb(resources.base_memory_gb, resources.per_worker_gb, processes),
        processes=processes,
        per_worker_gb=resources.per_worker_gb,
        retry_memory_gb=retry_memory_gb,
        retry_per_worker_gb=retry_per_worker_gb,
        scratch_gb=resources.scratch_gb,
        gpus=resources.gpus,
    )


def retry_processes(pod: PodShape, base_memory_gb: float) -> int:
    """The worker processes of a pod's retry after a kill for memory: as many as its retry memory holds.

    The retry gives each process `retry_per_worker_gb`; where the node cannot hold every process with that,
    the retry runs fewer (at least one). `PodShape` has no field for it, so the executor derives it here.
    """
    if pod.retry_per_worker_gb <= 0:
        return pod.processes
    fits = math.floor((pod.retry_memory_gb - base_memory_gb) / pod.retry_per_worker_gb + _EPS)
    return max(1, min(pod.processes, fits))


def plan_task(
    task: TaskSpec,
    task_type: TaskType,
    resources: ResolvedResources,
    nodes: Sequence[Node],
    mode: SplitMode,
    priority: Priority,
    units: int | None,
    pod_start_s: float = POD_START_S,
    *,
    run_id: str | None = None,
) -> TaskPlan:
    """Plans the pods of a task.

    A pod of a split task has no more processes than the task has units. A split task of the mode `fastest`
    gets at most `MAX_PIECES` pods, as many as fit on the nodes, and no pod without a unit for each of its
    processes. With the learned seconds of a unit it gets a further pod only while every pod still has at
    least `pod_start_s` of work: a pod which takes longer to start than its share of the work would find the
    units taken by the others and only hold cores.

    Args:
        task: The task.
        task_type: Its type.
        resources: The resolved resources.
        nodes: The nodes of the cluster.
        mode: The split mode.
        priority: The priority of the run.
        units: The number of units, None for an unsplit task.
        pod_start_s: About the seconds a pod takes to start on the cluster.
        run_id: The run asking; nodes reserved by it are usable (and the only usable ones).

    Returns:
        The plan; extra pods are not limited by idle capacity, Kueue queues them.

    Raises:
        PlanError: The task fits on no node.
    """
    mode = SplitMode(mode)
    priority = Priority(priority)
    if pod_start_s < 0:
        raise InvalidArgument(f"pod_start_s must not be negative, got {pod_start_s}")
    base, extra = priority_class(priority, PodRole.BASE), priority_class(priority, PodRole.EXTRA)
    try:
        if not task_type.split:
            pod = shape(resources, nodes, max_processes=1, run_id=run_id)
            return TaskPlan(task.id, 1, pod, base, extra, None, coordinator_merges=True)
        if units is None or units < 0:
            raise InvalidArgument(f"split task {task.id!r} needs a number of units of at least 0, got {units}")
        # A task of no units still runs its coordinator, which finds the ledger complete and merges.
        pod = shape(resources, nodes, max_processes=max(units, 1), run_id=run_id)
    except PlanError as exc:
        raise PlanError(f"task {task.id!r} of type {task_type.name}: {exc}") from None
    pods = 1
    if mode is SplitMode.FASTEST:
        pods = _fastest_pods(pod, usable_nodes(nodes, run_id), units, resources.unit_seconds, pod_start_s)
    return TaskPlan(task.id, pods, pod, base, extra, units, coordinator_merges=True)


def usable_nodes(nodes: Sequence[Node], run_id: str | None = None) -> list[Node]:
    """The nodes a run's pods may use: those it reserved if it holds a reservation, else the free ones."""
    if run_id:
        reserved = [n for n in nodes if n.reserved_by == run_id]
        if reserved:
            return reserved
    return [n for n in nodes if not n.reserved_by]


def slots(pod: PodShape, node: Node) -> int:
    """How many pods of a shape the node holds, counting requests as the scheduler does."""
    if pod.cores > node.cores or pod.memory_gb > node.memory_gb + _EPS or pod.gpus > node.gpus:
        return 0
    # A shape has at least one core and one GiB (shape() guarantees both), so neither division is by zero.
    count = min(
        math.floor(node.allocatable_memory_gb / pod.memory_gb + _EPS),
        math.floor(node.allocatable_cores / pod.cores + _EPS),
    )
    return min(count, node.gpus // pod.gpus) if pod.gpus else count


def _fastest_pods(pod: PodShape, usable: list[Node], units: int, unit_seconds: float | None, pod_start_s: float) -> int:
    free_slots = sum(slots(pod, node) for node in usable)
    limit = max(1, min(MAX_PIECES, free_slots, units // pod.processes))
    if unit_seconds is None:
        return limit
    pods = 1
    # Each pod's share of the work, in wall seconds: its units' seconds spread over its processes.
    while pods < limit and units * unit_seconds / ((pods + 1) * pod.processes) >= pod_start_s - _EPS:
        pods += 1
    return pods


def _check_resources(resources: ResolvedResources) -> None:
    if resources.base_memory_gb < 0 or resources.per_worker_gb < 0 or resources.scratch_gb < 0:
        raise InvalidArgument("base_memory_gb, per_worker_gb and scratch_gb must not be negative")
    if resources.cores_per_process < 1:
        raise InvalidArgument(f"cores_per_process must be at least 1, got {resources.cores_per_process}")
    if resources.gpus < 0:
        raise InvalidArgument(f"gpus must not be negative, got {resources.gpus}")


def _memory_gb(base_memory_gb: float, per_worker_gb: float, processes: int) -> int:
    return max(1, math.ceil(base_memory_gb + per_worker_gb * processes - _EPS))


def _processes_on(resources: ResolvedResources, node: Node, per_worker_gb: float) -> int:
    """As many processes as the node's cores and its memory (whole GiB) allow; 0 when not one fits."""
    whole_gb = math.floor(node.memory_gb + _EPS)
    if resources.gpus > node.gpus or resources.cores_per_process > node.cores:
        return 0
    if _memory_gb(resources.base_memory_gb, per_worker_gb, 1) > whole_gb:
        return 0
    by_cores = node.cores // resources.cores_per_process
    if per_worker_gb <= 0:
        return by_cores
    return min(by_cores, math.floor((whole_gb - resources.base_memory_gb) / per_worker_gb + _EPS))


def _sizing_node(resources: ResolvedResources, usable: list[Node], nodes: Sequence[Node]) -> Node:
    if not nodes:
        raise PlanError("the cluster has no nodes")
    if not usable:
        raise PlanError(f"no node is usable: all {len(nodes)} nodes are reserved by other runs")
    counts = Counter((n.cores, n.memory_gb, n.gpus) for n in usable)
    common = max(counts, key=lambda size: (counts[size], size))
    node = next(n for n in usable if (n.cores, n.memory_gb, n.gpus) == common)
    if _processes_on(resources, node, resources.per_worker_gb) >= 1:
        return node
    fitting = [n for n in usable if _processes_on(resources, n, resources.per_worker_gb) >= 1]
    if fitting:
        return max(
            fitting,
            key=lambda n: (_processes_on(resources, n, resources.per_worker_gb), n.memory_gb, n.cores, n.gpus),
        )
    largest = max(usable, key=lambda n: (n.memory_gb, n.cores, n.gpus))
    need_gb = _memory_gb(resources.base_memory_gb, resources.per_worker_gb, 1)
    raise PlanError(
        f"one worker needs {resources.cores_per_process} core(s), {need_gb} GiB of memory "
        f"({resources.base_memory_gb:g} GiB base + {resources.per_worker_gb:g} GiB per process) and "
        f"{resources.gpus} GPU(s); the largest usable node, {largest.name}, has {largest.cores} cores, "
        f"{largest.memory_gb:g} GiB and {largest.gpus} GPU(s)"
    )


def _retry(resources: ResolvedResources, node: Node, processes: int) -> tuple[float, int, int]:
    """The retry of a pod killed for memory: its memory per process, its processes and its memory (GiB).

    Each process gets 1.5 times its memory (fewer processes where the node must), the pod's memory rounded up
    to whole GiB. A retry always has more than the attempt that was killed: at least one GiB more where the
    rounding would absorb the 1.5 times, up to what the node holds; where the pod already fills its node, one
    process fewer, so that each of the others has more. Only a pod of one process that fills its node has no
    larger retry. The memory per process is the retry's share, `(memory - base) / processes`, so that the plan,
    the executor's messages and `retry_processes` agree.
    """
    base = resources.base_memory_gb
    whole_gb = math.floor(node.memory_gb + _EPS)
    first_gb = _memory_gb(base, resources.per_worker_gb, processes)
    wanted = resources.per_worker_gb * RETRY_MEMORY_FACTOR
    fits = _processes_on(resources, node, wanted)
    if fits >= 1:
        count = min(processes, fits)
        memory_gb = min(max(_memory_gb(base, wanted, count), first_gb + 1), max(whole_gb, first_gb))
    else:
        # Not even one process gets 1.5 times on this node: the retry gets what the node holds for one.
        count, memory_gb = 1, max(whole_gb, first_gb)
    if memory_gb <= first_gb and count == processes and processes > 1:
        count -= 1
    return (memory_gb - base) / count, count, memory_gb
