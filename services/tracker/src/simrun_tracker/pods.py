"""The pods of a task from its plan: the runtime contract's variables, commands, resources and priorities."""

from __future__ import annotations

from simrun_planner import PodShape, retry_processes
from simrun_runtime.layout import RunLayout
from simrun_runtime.record import RunRecord, TaskRecord

from simrun_tracker.executor import PodSpec


def task_pods(run: RunLayout, record: RunRecord, task: TaskRecord, interpreter: str, grace_s: float) -> list[PodSpec]:
    """The pods of a task: `w0` at the base priority (it merges a split task), `w1`… extra workers."""
    assert task.plan is not None, f"task {task.task_id} has no plan"
    plan = task.plan
    shape = plan["shape"]
    base_memory_gb = (task.resources or {}).get("base_memory_gb", 0.0)
    layout = run.task(task.task_id)
    module = "simrun_runtime.worker" if task.split else "simrun_runtime.execute"
    pods = []
    for index in range(plan["pods"]):
        worker = f"w{index}"
        env = {
            "SIMRUN_RUN_DIR": str(run.root),
            "SIMRUN_TASK": task.task_id,
            "SIMRUN_WORKER": worker,
            "SIMRUN_PROCESSES": str(shape["processes"]),
            "SIMRUN_MERGE": "1" if task.split and index == 0 and plan.get("coordinator_merges", True) else "0",
            "SIMRUN_GRACE_S": f"{grace_s:g}",
            "SIMRUN_PROVENANCE": str(layout.provenance),
            "PYTHONDONTWRITEBYTECODE": "1",
        }
        pods.append(
            PodSpec(
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
                priority_class=plan["base_priority"] if index == 0 else plan["extra_priority"],
                grace_s=grace_s,
            )
        )
    return pods
