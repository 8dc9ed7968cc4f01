"""Observations from the worker reports of a finished task (`tasks/<task>/workers/`), one per pod incarnation."""

from __future__ import annotations

from simrun_runtime.layout import TaskLayout
from simrun_runtime.reports import WorkerEnd, WorkerReport, load_reports

from simrun_learner.rules import Observation, ObservationKey


def observations_from_reports(
    task: TaskLayout,
    key: ObservationKey,
    succeeded: bool,
    run_id: str,
    *,
    memory_gb: float | None = None,
    retry_memory_gb: float | None = None,
) -> list[Observation]:
    """One observation per report of a finished task's pods (merge pods aside), oldest first.

    Call it once per finished task. Its memory per process is the report's peak over its processes. A pod was
    killed for memory when its cgroup counted a kill or its report still says `running` (killed by SIGKILL,
    which the executor retries as a kill for memory); its memory per process then is its limit over its
    processes: `memory_gb` for a worker's first incarnation, `retry_memory_gb` after it was killed once.

    Args:
        task: The task's files in the store.
        key: The key of the task.
        succeeded: Whether the task succeeded.
        run_id: The run the task belongs to.
        memory_gb: The memory of a pod of the plan, GiB; without it a kill takes the peak it measured.
        retry_memory_gb: The memory of a retry of the plan, GiB; without it, `memory_gb`.
    """
    observations = []
    killed_before: set[str] = set()
    for report in load_reports(task):
        if report.role == "merge":
            continue
        limit_gb = (retry_memory_gb or memory_gb) if report.worker in killed_before else memory_gb
        observation = _observation(report, key, succeeded, run_id, limit_gb)
        if observation.oom_killed:
            killed_before.add(report.worker)
        observations.append(observation)
    return observations


def _observation(
    report: WorkerReport, key: ObservationKey, succeeded: bool, run_id: str, limit_gb: float | None
) -> Observation:
    measured = report.per_process_gb if report.processes > 0 and report.peak_memory_gb > 0 else None
    killed = bool(report.oom_kills) or report.ended is WorkerEnd.RUNNING
    oom_per_worker_gb = None
    if killed:
        oom_per_worker_gb = limit_gb / max(report.processes, 1) if limit_gb else measured
    return Observation(
        key=key,
        per_worker_gb=measured,
        # Without a limit or a measurement there is no memory a floor could be taken from.
        oom_killed=killed and bool(oom_per_worker_gb),
        oom_per_worker_gb=oom_per_worker_gb if killed else None,
        succeeded=succeeded,
        unit_seconds=_unit_seconds(report),
        run_id=run_id or report.run_id,
        observed_at=report.ended_at or report.started_at,
    )


def _unit_seconds(report: WorkerReport) -> tuple[float, ...]:
    """The seconds of the report's units; an unsplit task that ran to its end is one unit, its run's seconds.

    Without it an unsplit task would never have learned seconds, and its estimate would stay unknown however
    often it ran. Only a run that ended done counts: a stopped or failed one says nothing about its length.
    """
    # Schema 2 reports summarise their units: one value per unit, exact up to 64 units, else within 2.2%.
    seconds = report.seconds_of_units()
    if report.role == "exec" and not seconds:
        if report.ended is WorkerEnd.DONE and report.ended_at is not None:
            return (max((report.ended_at - report.started_at).total_seconds(), 0.0),)
        return ()
    return tuple(seconds)
