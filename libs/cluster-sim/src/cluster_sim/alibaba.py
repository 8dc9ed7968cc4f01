"""A loader for Alibaba's cluster-trace-v2018 files (machine meta and usage, batch tasks) into a ProcessFlow.

Unit conversions (the trace's ``schema.txt``):

* Times in every file are seconds from the start of the trace; a ``time_stamp`` (or task
  ``start_time``/``end_time``) of 0 means "outside the 8-day window" and such rows carry no time.
  Flow time 0 is ``start`` seconds into the trace.
* ``machine_meta.cpu_num`` is a core count and becomes ``Machine.cpu`` as is.
* ``machine_meta.mem_size`` and ``batch_task.plan_mem`` are both normalised so that the largest
  machine has 100; the flow keeps that unit ("percent of the largest machine") for memory.
* ``machine_usage.cpu_util_percent`` is the whole machine's CPU utilisation in [0, 100]; the online
  demand is ``cpu_util_percent / 100 × cpu_num`` cores. The value covers online containers and
  batch work together, so it over-states online demand. -1 and 101 (and empty cells) mark invalid
  samples, which are dropped: demand holds the last valid value.
* ``batch_task.plan_cpu`` is in hundredths of a core: ``cpu = plan_cpu / 100`` cores.
* A task's release is its ``start_time`` (the trace has no submit time for tasks), its duration
  ``end_time - start_time``, and its estimate equals its duration (the trace has no estimate).
"""

from __future__ import annotations

import csv
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cluster_sim.processes import BatchProcess, DemandSample, Machine, ProcessFlow

__all__ = [
    "BATCH_TASK_COLUMNS",
    "MACHINE_META_COLUMNS",
    "MACHINE_USAGE_COLUMNS",
    "load_alibaba_v2018",
]

MACHINE_META_COLUMNS = ("machine_id", "time_stamp", "failure_domain_1", "failure_domain_2", "cpu_num",
                        "mem_size", "status")  # fmt: skip
"""Column order of ``machine_meta.csv`` (the files have no header row)."""

MACHINE_USAGE_COLUMNS = ("machine_id", "time_stamp", "cpu_util_percent", "mem_util_percent", "mem_gps", "mkpi",
                         "net_in", "net_out", "disk_io_percent")  # fmt: skip
"""Column order of ``machine_usage.csv``."""

BATCH_TASK_COLUMNS = ("task_name", "instance_num", "job_name", "task_type", "status", "start_time", "end_time",
                      "plan_cpu", "plan_mem")  # fmt: skip
"""Column order of ``batch_task.csv``."""

_INVALID_PERCENT = (-1.0, 101.0)


@dataclass(frozen=True, slots=True)
class _Capacity:
    time: float
    cpu: float
    memory: float


def _number(text: str) -> float | None:
    text = text.strip()
    if not text:
        return None
    try:
        return float(text)
    except ValueError:
        return None


def _rows(path: Path, width: int) -> list[list[str]]:
    with path.open(newline="") as handle:
        return [row for row in csv.reader(handle) if len(row) >= width]


def load_alibaba_v2018(
    machine_meta: str | Path,
    *,
    machine_usage: str | Path | None = None,
    batch_task: str | Path | None = None,
    machines: Sequence[str] | None = None,
    start: float | None = None,
    horizon: float | None = None,
    online_memory_fraction: float = 0.5,
    task_statuses: Collection[str] | None = ("Terminated",),
    expand_instances: bool = False,
) -> ProcessFlow:
    """Build a flow from cluster-trace-v2018 files; see the module docstring for the units.

    Args:
        machine_meta: ``machine_meta.csv``.
        machine_usage: ``machine_usage.csv``; without it online demand is zero.
        batch_task: ``batch_task.csv``; without it the flow has no batch processes.
        machines: Machine ids to keep, in this order; by default those in ``machine_usage`` (in
            order of first appearance), or every machine of ``machine_meta`` without a usage file.
        start: Trace second that becomes flow time 0; by default the earliest valid usage sample or
            task start.
        horizon: Length of the flow, seconds; by default up to the latest usage sample or task end.
        online_memory_fraction: Share of each machine's memory reserved for online work (the trace
            does not separate online from batch memory).
        task_statuses: Task ``status`` values to keep (None keeps all).
        expand_instances: Make ``instance_num`` processes per task (named ``job/task#k``) instead of
            one process per task.

    Returns:
        The flow; its provenance names the files, the window and how many rows were dropped and why.

    Raises:
        ValueError: If a requested machine is not in ``machine_meta`` or nothing is left to simulate.
    """
    meta_path = Path(machine_meta)
    capacities: dict[str, list[_Capacity]] = {}
    for row in _rows(meta_path, len(MACHINE_META_COLUMNS)):
        time, cpu, memory = _number(row[1]), _number(row[4]), _number(row[5])
        if time is None or cpu is None or memory is None or cpu <= 0 or memory <= 0:
            continue
        capacities.setdefault(row[0], []).append(_Capacity(time, cpu, memory))

    usage: dict[str, list[tuple[float, float]]] = {}
    invalid_samples = 0
    if machine_usage is not None:
        for row in _rows(Path(machine_usage), 3):
            if machines is not None and row[0] not in machines:
                continue
            time, percent = _number(row[1]), _number(row[2])
            samples = usage.setdefault(row[0], [])
            if time is None or time <= 0 or percent is None or percent in _INVALID_PERCENT or not 0 <= percent <= 100:
                invalid_samples += 1
                continue
            samples.append((time, percent))

    names = list(machines) if machines is not None else (list(usage) if machine_usage is not None else list(capacities))
    for name in names:
        if name not in capacities:
            raise ValueError(f"machine {name!r} has no usable row in {meta_path.name}")
    if not names:
        raise ValueError("no machines selected")

    tasks: list[tuple[str, int, float, float, float, float]] = []
    skipped = {"status": 0, "outside the window": 0, "missing plan": 0}
    if batch_task is not None:
        for row in _rows(Path(batch_task), len(BATCH_TASK_COLUMNS)):
            task_name, instances, job_name, _, status, first, last, plan_cpu, plan_mem = row[:9]
            if task_statuses is not None and status not in task_statuses:
                skipped["status"] += 1
                continue
            begin, end = _number(first), _number(last)
            if begin is None or end is None or begin <= 0 or end <= begin:
                skipped["outside the window"] += 1  # 0 marks a time outside the trace window
                continue
            cpu, memory, count = _number(plan_cpu), _number(plan_mem), _number(instances)
            if cpu is None or memory is None or cpu <= 0 or memory < 0:
                skipped["missing plan"] += 1
                continue
            tasks.append((f"{job_name}/{task_name}", max(int(count or 1), 1), begin, end, cpu / 100.0, memory))

    times = [t for name in names for t, _ in usage.get(name, [])] + [t for task in tasks for t in task[2:4]]
    if start is None:
        start = min((t for name in names for t, _ in usage.get(name, [])), default=0.0)
        start = min([start, *(task[2] for task in tasks)]) if tasks else start
    if horizon is None:
        horizon = max(times, default=start + 1.0) - start
        horizon = horizon if horizon > 0 else 1.0
    end_time = start + horizon

    machine_list = []
    for name in names:
        rows = capacities[name]
        known = [c for c in rows if c.time <= start]  # time 0 rows count as known before the window
        capacity = known[-1] if known else rows[0]
        machine_list.append(Machine(name, capacity.cpu, capacity.memory, online_memory_fraction * capacity.memory))

    demand = _demand(names, machine_list, usage, start, end_time)

    processes: list[BatchProcess] = []
    too_large = 0
    outside = 0
    cpu_caps = np.array([m.cpu for m in machine_list])
    memory_caps = np.array([m.batch_memory for m in machine_list])
    seen: dict[str, int] = {}
    for name, count, begin, end, cpu, memory in sorted(tasks, key=lambda task: task[2]):
        release = begin - start
        if release < 0 or release >= horizon:
            outside += 1
            continue
        if not np.any((cpu_caps >= cpu) & (memory_caps >= memory)):
            too_large += 1
            continue
        copies = count if expand_instances else 1
        for k in range(copies):
            label = f"{name}#{k}" if expand_instances else name
            if label in seen:
                seen[label] += 1
                label = f"{label}~{seen[label]}"
            else:
                seen[label] = 0
            processes.append(BatchProcess(label, release, cpu, memory, end - begin, end - begin))

    skipped["outside the window"] += outside
    skipped["larger than every machine"] = too_large
    files = ", ".join(
        f"{kind}={Path(path).name}"
        for kind, path in (("machine_meta", machine_meta), ("machine_usage", machine_usage), ("batch_task", batch_task))
        if path is not None
    )
    dropped = ", ".join(f"{why}: {n}" for why, n in skipped.items() if n)
    provenance = (
        f"alibaba cluster-trace-v2018 ({files}); {len(names)} machines; trace window [{start:g}, {end_time:g}) s; "
        f"{len(demand)} demand samples ({invalid_samples} invalid usage rows dropped); "
        f"{len(tasks)} usable task rows, {len(processes)} processes kept"
        + (f"; tasks dropped: {dropped}" if dropped else "")
    )
    return ProcessFlow(tuple(machine_list), tuple(processes), demand, float(horizon), provenance)


def _demand(
    names: list[str],
    machines: list[Machine],
    usage: dict[str, list[tuple[float, float]]],
    start: float,
    end: float,
) -> tuple[DemandSample, ...]:
    """Merge per-machine utilisation into samples that give every machine's demand at each time."""
    series = []
    for name in names:
        samples = sorted(usage.get(name, []))
        series.append((np.array([t for t, _ in samples]), np.array([p for _, p in samples])))
    inside = sorted({t for times, _ in series for t in times.tolist() if start < t < end})
    grid = np.array([start, *inside])
    columns = []
    for (times, percent), machine in zip(series, machines, strict=True):
        if times.size == 0:
            columns.append(np.zeros(grid.size))
            continue
        # Each machine holds its last valid value; before its first sample, that first value.
        position = np.maximum(np.searchsorted(times, grid, side="right") - 1, 0)
        columns.append(np.round(percent[position] / 100.0 * machine.cpu, 6))
    values = np.stack(columns, axis=1)
    keep = np.ones(grid.size, dtype=bool)
    keep[1:] = np.any(values[1:] != values[:-1], axis=1)
    return tuple(
        DemandSample(float(t - start), tuple(row.tolist())) for t, row in zip(grid[keep], values[keep], strict=True)
    )
