"""The pods of a task from its plan: the runtime contract's variables, commands, resources and priorities."""

from __future__ import annotations

from simrun_planner import PodShape, retry_processes
from simrun_runtime.layout import RunLayout
from simrun_runtime.record import RunRecord, TaskRecord

from simrun_tracker.executor import PodSpec

MERGE_WORKER = "merge"
"""The worker name of the merge pod of a plan recorded before the coordinator merged (the legacy `<task>-merge`)."""


def coordinator_merges(task: TaskRecord) -> bool:
    """Whether a split task's coordinator merges; plans recorded before that have a merge pod instead."""
    return bool((task.plan or {}).get("coordinator_merges", False))


def task_pods(run: RunLayout, record: RunRecord, task: TaskRecord, interpreter: str, grace_s: float) -> list[PodSpec]:
    """The pods of a task: `w0` at the base priority (it merges a split task), `w1`… extra workers."""
    assert task.plan is not None, f"task {task.task_id} has no plan"
    module = "simrun_runtime.worker" if task.split else "simrun_runtime.execute"
    merges = task.split and coordinator_merges(task)
    return [
        _pod(run, record, task, interpreter, grace_s, f"w{index}", module, merge=merges and index == 0)
        for index in range(task.plan["pods"])
    ]


def merge_pod(run: RunLayout, record: RunRecord, task: TaskRecord, interpreter: str, grace_s: float) -> PodSpec:
    """The pod that merges a split task after its coordinator, for a plan whose coordinator does not merge."""
    return _pod(run, record, task, interpreter, grace_s, MERGE_WORKER, "simrun_runtime.merge", merge=True)


def _pod(
    run: RunLayout,
    record: RunRecord,
    task: TaskRecord,
    interpreter: str,
    grace_s: float,
    worker: str,
    module: str,
    *,
    merge: bool,
) -> PodSpec:
    assert task.plan is not None, f"task {task.task_id} has no plan"
    plan = task.plan
    shape = plan["shape"]
    base_memory_gb = (task.resources or {}).get("base_memory_gb", 0.0)
    layout = run.task(task.task_id)
    env = {
        "SIMRUN_RUN_DIR": str(run.root),
        "SIMRUN_TASK": task.task_id,
        "SIMRUN_WORKER": worker,
        "SIMRUN_PROCESSES": str(shape["processes"]),
        "SIMRUN_MERGE": "1" if merge else "0",
        "SIMRUN_GRACE_S": f"{grace_s:g}",
        "SIMRUN_PROVENANCE": str(layout.provenance),
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    return PodSpec(
        run_id=record.run_id,
        task_id=task.task_id,
        worker=worker,
        command=[interpreter, "-m", module],
        env=env,
        cwd=run.root,
        log_path=layout.logs / f"{worker}.log",
        cores=shape["cores"],
        memory_gb=shape["memory_gb"],
        processes=shape["processes"],
        retry_memory_gb=shape["retry_memory_gb"],
        retry_processes=retry_processes(PodShape(**shape), base_memory_gb),
        priority_class=plan["extra_priority"] if worker.startswith("w") and worker != "w0" else plan["base_priority"],
        grace_s=grace_s,
    )
