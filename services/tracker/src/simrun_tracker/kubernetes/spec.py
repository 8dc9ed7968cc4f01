"""A run's record and environment as the executor port's `RunSpec`: a pure function, shared by the adapter's
callers and `simrun render`, until the tracker's own pods builder produces location-free specs for whole runs."""

from __future__ import annotations

from pathlib import PurePosixPath

from simrun_planner import PodShape, retry_processes
from simrun_runtime.layout import PROVENANCE
from simrun_runtime.record import RunRecord, TaskRecord

from simrun_tracker.executor import COORDINATOR, MERGE_WORKER, PodRole, PodSpec, RunSpec, TaskSpec
from simrun_tracker.ports import Environment

__all__ = ["run_spec"]


def run_spec(record: RunRecord, environment: Environment, grace_s: float) -> RunSpec:
    """Every task of a planned run with its pods, the tasks it reads from and, for old plans, its merge pod."""
    tasks = []
    for task in record.tasks.values():
        if task.plan is None:
            raise ValueError(f"task {task.task_id} of run {record.run_id} has no plan")
        pods = [_pod(record, task, environment, grace_s, f"w{i}") for i in range(task.plan["pods"])]
        merges = bool(task.plan.get("coordinator_merges", False))
        merge = _pod(record, task, environment, grace_s, MERGE_WORKER) if task.split and not merges else None
        depends = list(dict.fromkeys(ref.split(".")[0] for ref in task.inputs.values()))
        tasks.append(TaskSpec(task.task_id, pods, depends, merge))
    return RunSpec(record.run_id, tasks, record.reservation)


def _pod(record: RunRecord, task: TaskRecord, environment: Environment, grace_s: float, worker: str) -> PodSpec:
    assert task.plan is not None
    plan = task.plan
    shape = plan["shape"]
    run_dir = PurePosixPath("runs") / record.run_id
    role = PodRole.MERGE if worker == MERGE_WORKER else PodRole.WORKER if task.split else PodRole.EXECUTE
    merges = worker == MERGE_WORKER or (
        task.split and worker == COORDINATOR and bool(plan.get("coordinator_merges", False))
    )
    contract = {
        "SIMRUN_RUN_DIR": str(run_dir),
        "SIMRUN_TASK": task.task_id,
        "SIMRUN_WORKER": worker,
        "SIMRUN_PROCESSES": str(shape["processes"]),
        "SIMRUN_MERGE": "1" if merges else "0",
        "SIMRUN_GRACE_S": f"{grace_s:g}",
        "SIMRUN_PROVENANCE": str(run_dir / "tasks" / task.task_id / PROVENANCE),
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    base_memory_gb = (task.resources or {}).get("base_memory_gb", 0.0)
    extra = worker not in (COORDINATOR, MERGE_WORKER)
    return PodSpec(
        run_id=record.run_id,
        task_id=task.task_id,
        worker=worker,
        role=role,
        environment_id=environment.environment_id,
        contract=contract,
        cores=shape["cores"],
        memory_gb=shape["memory_gb"],
        processes=shape["processes"],
        retry_memory_gb=shape["retry_memory_gb"],
        retry_processes=retry_processes(PodShape(**shape), base_memory_gb),
        priority_class=plan["extra_priority"] if extra else plan["base_priority"],
        grace_s=grace_s,
        image=environment.image,
    )
