"""The pods of a task from its plan: the runtime contract's variables, roles, resources and priorities.

Everything here is location-free: store paths are relative to the store root, and the environment is an id.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from simrun_planner import PodShape, retry_processes
from simrun_runtime.layout import StoreLayout
from simrun_runtime.record import RunRecord, TaskRecord, TaskState

from simrun_tracker.executor import COORDINATOR, MERGE_WORKER, PodRole, PodSpec, RunSpec, TaskSpec

__all__ = ["COORDINATOR", "MERGE_WORKER", "coordinator_merges", "merge_pod", "run_spec", "task_pods"]


def coordinator_merges(task: TaskRecord) -> bool:
    """Whether a split task's coordinator merges; plans recorded before that have a merge pod instead."""
    return bool((task.plan or {}).get("coordinator_merges", False))


RELATIVE_STORE = StoreLayout(Path(""))
"""The store's layout with its root left out: the store-relative paths of the runtime contract."""


def task_pods(record: RunRecord, task: TaskRecord, environment_id: str, grace_s: float) -> list[PodSpec]:
    """The pods of a task: `w0` at the base priority (it merges a split task), `w1`… extra workers."""
    assert task.plan is not None, f"task {task.task_id} has no plan"
    role = PodRole.WORKER if task.split else PodRole.EXECUTE
    merges = task.split and coordinator_merges(task)
    return [
        _pod(record, task, environment_id, grace_s, f"w{index}", role, merge=merges and index == 0)
        for index in range(task.plan["pods"])
    ]


def merge_pod(record: RunRecord, task: TaskRecord, environment_id: str, grace_s: float) -> PodSpec:
    """The pod that merges a split task after its coordinator, for a plan whose coordinator does not merge."""
    return _pod(record, task, environment_id, grace_s, MERGE_WORKER, PodRole.MERGE, merge=True)


def run_spec(record: RunRecord, environment_id: str, grace_s: float, image: str = "") -> RunSpec:
    """A whole run for an adapter that orders its tasks itself: every task's pods and the tasks it reads."""
    tasks = []
    # A task reused from an earlier run is SUCCEEDED before the run starts: it has no pods, and nothing waits for it.
    done = {task.task_id for task in record.tasks.values() if task.state == TaskState.SUCCEEDED}
    for task in record.tasks.values():
        if task.task_id in done:
            continue
        depends = sorted({ref.split(".")[0] for ref in task.inputs.values()} - done)
        pods = [_with_image(p, image) for p in task_pods(record, task, environment_id, grace_s)]
        legacy = None
        if task.split and not coordinator_merges(task):
            legacy = _with_image(merge_pod(record, task, environment_id, grace_s), image)
        tasks.append(TaskSpec(task.task_id, pods, depends, legacy))
    # From each snapshot's name and id, never a recorded path: what a pod may read of the store's snapshots.
    snapshots = [RELATIVE_STORE.snapshot(s.name, s.snapshot_id).as_posix() for s in record.snapshots]
    return RunSpec(record.run_id, tasks, record.reservation, snapshots)


def _with_image(spec: PodSpec, image: str) -> PodSpec:
    return replace(spec, image=image) if image else spec


def _pod(
    record: RunRecord,
    task: TaskRecord,
    environment_id: str,
    grace_s: float,
    worker: str,
    role: PodRole,
    *,
    merge: bool,
) -> PodSpec:
    assert task.plan is not None, f"task {task.task_id} has no plan"
    plan = task.plan
    shape = plan["shape"]
    base_memory_gb = (task.resources or {}).get("base_memory_gb", 0.0)
    run = RELATIVE_STORE.run(record.run_id)
    contract = {
        "SIMRUN_RUN_DIR": str(run.root),
        "SIMRUN_TASK": task.task_id,
        "SIMRUN_WORKER": worker,
        "SIMRUN_PROCESSES": str(shape["processes"]),
        "SIMRUN_MERGE": "1" if merge else "0",
        "SIMRUN_GRACE_S": f"{grace_s:g}",
        "SIMRUN_PROVENANCE": str(run.task(task.task_id).provenance),
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    if task.unit_timeout_s:
        contract["SIMRUN_UNIT_TIMEOUT_S"] = f"{task.unit_timeout_s:g}"
    # The W3C environment carrier: the pod's report names its span's parent (the task's, else the submission's).
    if traceparent := task.traceparent or record.traceparent:
        contract["TRACEPARENT"] = traceparent
    return PodSpec(
        run_id=record.run_id,
        task_id=task.task_id,
        worker=worker,
        role=role,
        environment_id=environment_id,
        contract=contract,
        cores=shape["cores"],
        memory_gb=shape["memory_gb"],
        processes=shape["processes"],
        retry_memory_gb=shape["retry_memory_gb"],
        retry_processes=retry_processes(PodShape(**shape), base_memory_gb),
        priority_class=plan["extra_priority"] if worker not in (COORDINATOR, MERGE_WORKER) else plan["base_priority"],
        grace_s=grace_s,
        base_memory_gb=base_memory_gb,
    )
