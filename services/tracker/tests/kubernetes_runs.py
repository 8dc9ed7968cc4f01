"""Runs to hand the kubernetes executor in tests: pods of split and unsplit tasks as the tracker would plan them."""

from __future__ import annotations

import dataclasses

from simrun_planner import PodShape, TaskPlan
from simrun_runtime.record import Identity, RunRecord, RunState, TaskRecord
from simrun_tracker.executor import PodRole, PodSpec, RunSpec, TaskSpec

IMAGE = "registry.simrun:5000/simrun/env@sha256:" + "ab" * 32


def pod(
    run_id: str,
    task_id: str,
    worker: str,
    *,
    split: bool = True,
    memory_gb: float = 4.0,
    retry_memory_gb: float = 6.0,
    processes: int = 2,
    cores: int = 2,
    priority: str = "standard",
    merge: bool | None = None,
    image: str = IMAGE,
) -> PodSpec:
    role = PodRole.MERGE if worker == "merge" else PodRole.WORKER if split else PodRole.EXECUTE
    base = worker in ("w0", "merge")
    merges = merge if merge is not None else worker == "w0" and split
    return PodSpec(
        run_id=run_id,
        task_id=task_id,
        worker=worker,
        role=role,
        environment_id="env-1",
        contract={
            "SIMRUN_RUN_DIR": f"runs/{run_id}",
            "SIMRUN_TASK": task_id,
            "SIMRUN_WORKER": worker,
            "SIMRUN_PROCESSES": str(processes),
            "SIMRUN_MERGE": "1" if merges else "0",
            "SIMRUN_GRACE_S": "30",
            "SIMRUN_PROVENANCE": f"runs/{run_id}/tasks/{task_id}/provenance.json",
            "PYTHONDONTWRITEBYTECODE": "1",
        },
        cores=cores,
        memory_gb=memory_gb,
        processes=processes,
        retry_memory_gb=retry_memory_gb,
        priority_class=f"simrun-{priority}-{'base' if base else 'extra'}",
        retry_processes=max(1, processes - 1) if retry_memory_gb > memory_gb else None,
        image=image,
    )


def task(run_id: str, task_id: str, pods: int, depends: list[str] | None = None, **kw: object) -> TaskSpec:
    split = bool(kw.pop("split", True))
    legacy = bool(kw.pop("legacy_merge", False))
    specs = [
        pod(run_id, task_id, f"w{i}", split=split, merge=not legacy and split and i == 0, **kw) for i in range(pods)
    ]  # type: ignore[arg-type]
    merge = pod(run_id, task_id, "merge", merge=True, **kw) if legacy else None  # type: ignore[arg-type]
    return TaskSpec(task_id, specs, depends or [], merge)


def scan_run(
    run_id: str = "20261201-080000-aaaaaa", pods: int = 3, reservation: str | None = None, **kw: object
) -> RunSpec:
    """A split task `scan` of `pods` pods, then an unsplit task `plot` reading it."""
    return RunSpec(
        run_id,
        [task(run_id, "scan", pods, **kw), task(run_id, "plot", 1, ["scan"], split=False, **kw)],
        reservation,
    )


def planned_record(run_id: str = "20261201-080000-aaaaaa", environment: str = "env-1") -> RunRecord:
    """A planned run as the tracker records it: a split task `scan` of 3 pods, then `plot` (unsplit) reading it."""
    shape = PodShape(
        cores=2, memory_gb=4, processes=2, per_worker_gb=1.5, retry_memory_gb=6, retry_per_worker_gb=2.25,
        scratch_gb=0.0, gpus=0,
    )  # fmt: skip

    def plan(task_id: str, pods: int, units: int | None) -> dict:
        return dataclasses.asdict(
            TaskPlan(task_id, pods, shape, "simrun-standard-base", "simrun-standard-extra", units, True)
        )

    return RunRecord(
        run_id=run_id,
        identity=Identity(name="bob", kind="person", priority="standard"),
        state=RunState.RUNNING,
        environment=environment,
        tasks={
            "scan": TaskRecord(task_id="scan", type="m:Scan", split=True, units=12, plan=plan("scan", 3, 12)),
            "plot": TaskRecord(
                task_id="plot", type="m:Plot", inputs={"table": "scan.table"}, plan=plan("plot", 1, None)
            ),
        },
    )
