"""Observations from the worker reports of a finished task (`tasks/<task>/workers/`), one per pod incarnation."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from simrun_runtime.layout import TaskLayout
from simrun_runtime.reports import WorkerEnd, WorkerReport, load_reports

from simrun_learner.rules import Observation, ObservationKey

MEASURED_MARGIN = 1.25
MEASURED_SLACK_GB = 1 / 16
"""A report may claim at most the executor's own measurement of its worker's pods times the margin, plus the
slack: the two sample the same anonymous memory at different moments, and a peak between the executor's samples
may be in the report. Past that bound a claim is not what the pod used."""


def observations_from_reports(
    task: TaskLayout,
    key: ObservationKey,
    succeeded: bool,
    run_id: str,
    *,
    memory_gb: float | None = None,
    retry_memory_gb: float | None = None,
    processes: int | None = None,
    retry_processes: int | None = None,
    attempts: Mapping[str, int] | None = None,
    kills: Mapping[str, int] | None = None,
    measured_gb: Mapping[str, float] | None = None,
) -> list[Observation]:
    """One observation per report of a finished task's pods (merge pods aside), oldest first.

    Call it once per finished task. Its memory per process is the report's peak over its processes. A pod was
    killed for memory when its cgroup counted a kill or its report still says `running` (killed by SIGKILL,
    which the executor retries as a kill for memory); its memory per process then is its limit over its
    processes: `memory_gb` for a worker's first incarnation, `retry_memory_gb` after it was killed once.

    The reports are the task's to write (its pods run its code), so where the server's own facts are given they
    decide: only the pods it started count (`attempts`, the latest that many reports of each worker), a pod was
    killed for memory only as often as the server saw (`kills`), and no pod used more than the memory it was given
    over the processes it was given (`processes`, `retry_processes`), nor more than the executor measured in the
    worker's pods (`measured_gb`, with `MEASURED_MARGIN`). A task then cannot make its key need more than a pod
    that filled its limit would, and where the executor measures, no more than its pods really used: forged
    reports cannot raise a key's memory run after run.

    Args:
        task: The task's files in the store.
        key: The key of the task.
        succeeded: Whether the task succeeded.
        run_id: The run the task belongs to.
        memory_gb: The memory of a pod of the plan, GiB; without it a kill takes the peak it measured.
        retry_memory_gb: The memory of a retry of the plan, GiB; without it, `memory_gb`.
        processes: The processes of a pod of the plan; `retry_processes` those of a retry (else `processes`).
        attempts: The server's pods started per worker (the record's `attempts`).
        kills: The server's kills for memory per worker (the record's `oom_kills` of the task).
        measured_gb: The most anonymous memory the executor measured per worker over its pods, GiB (the record's
            `measured_memory_gb`); a worker missing from it is bounded by its limit only.
    """
    reports = [r for r in load_reports(task) if r.role != "merge"]
    if attempts is not None:
        kept: list[WorkerReport] = []
        for worker, count in attempts.items():
            kept += sorted((r for r in reports if r.worker == worker), key=lambda r: r.started_ms)[-count:]
        reports = sorted(kept, key=lambda r: (r.started_ms, r.worker))
    observations = []
    killed_before: dict[str, int] = {}
    for report in reports:
        retried = killed_before.get(report.worker, 0) > 0
        limit_gb = (retry_memory_gb or memory_gb) if retried else memory_gb
        given = (retry_processes or processes) if retried else processes
        killed = None
        if kills is not None:
            killed = killed_before.get(report.worker, 0) < kills.get(report.worker, 0)
        seen = None
        if measured_gb is not None and report.worker in measured_gb:
            seen = measured_gb[report.worker] * MEASURED_MARGIN + MEASURED_SLACK_GB
        observation = _observation(report, key, succeeded, run_id, limit_gb, given, killed, seen)
        observation = replace(observation, source=f"{run_id or report.run_id}/{task.task_id}/{report.path(task).stem}")
        if observation.oom_killed:
            killed_before[report.worker] = killed_before.get(report.worker, 0) + 1
        observations.append(observation)
    return observations


def _observation(
    report: WorkerReport,
    key: ObservationKey,
    succeeded: bool,
    run_id: str,
    limit_gb: float | None,
    processes: int | None = None,
    killed: bool | None = None,
    seen_gb: float | None = None,
) -> Observation:
    measured = report.per_process_gb if report.processes > 0 and report.peak_memory_gb > 0 else None
    if measured is not None and (processes or seen_gb is not None):
        # The server's processes, its limit (a pod's memory cgroup holds it there) and what its executor saw: a
        # report of more is not what the pod used.
        peak = report.peak_memory_gb
        if processes and limit_gb:
            peak = min(peak, limit_gb)
        if seen_gb is not None:
            peak = min(peak, seen_gb)
        measured = peak / (processes or report.processes)
    if killed is None:
        killed = bool(report.oom_kills) or report.ended is WorkerEnd.RUNNING
    oom_per_worker_gb = None
    if killed:
        oom_per_worker_gb = limit_gb / max(processes or report.processes, 1) if limit_gb else measured
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
