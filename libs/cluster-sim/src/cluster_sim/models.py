"""What the simulator reports: process states, observations, cost terms and run reports."""

from __future__ import annotations

import enum
from dataclasses import dataclass, fields

import numpy as np

__all__ = [
    "CostBreakdown",
    "ProcessState",
    "ProcessStatus",
    "QueueRow",
    "SimulationObservation",
    "SimulationReport",
]


class ProcessState(enum.StrEnum):
    """Where a batch process is in its lifecycle."""

    UNRELEASED = "unreleased"
    QUEUED = "queued"
    RUNNING = "running"
    FINISHED = "finished"
    CENSORED = "censored"


@dataclass(frozen=True, slots=True)
class ProcessStatus:
    """One batch process at the simulator's current time.

    Attributes:
        name: The process name.
        state: Its lifecycle state; ``CENSORED`` once the horizon is reached unfinished.
        machine: The machine it runs or ran on, or None if it never started.
        release: Release time, seconds.
        start: Start time, seconds, or None.
        finish: Completion time, seconds, or None.
        work_done: Core-seconds completed so far.
        remaining_work: Core-seconds still needed (``cpu × duration - work_done``).
        flow_time: Seconds from release to completion, or to the current time if unfinished
            (the restricted flow time); 0 before release.
    """

    name: str
    state: ProcessState
    machine: str | None
    release: float
    start: float | None
    finish: float | None
    work_done: float
    remaining_work: float
    flow_time: float


@dataclass(frozen=True, slots=True)
class QueueRow:
    """One queued process as a scheduler sees it (no true duration).

    Attributes:
        name: The process name.
        cpu: CPU request, cores.
        memory: Memory request.
        estimate: Duration estimate, seconds.
        waited: Seconds since release.
    """

    name: str
    cpu: float
    memory: float
    estimate: float
    waited: float


@dataclass(frozen=True, slots=True, eq=False)
class SimulationObservation:
    """The cluster at one instant; arrays hold one value per machine in flow order.

    Attributes:
        time: Seconds from the start of the flow.
        demand: Online CPU demand, cores.
        online_quota: Online CPU quota in effect, cores.
        batch_budget: CPU batch processes may use now, cores (capacity minus quota, plus idle
            online capacity when borrowing).
        batch_cpu_requested: Sum of the CPU requests of running processes, cores.
        batch_cpu_in_use: CPU running processes actually get, cores (at most the budget).
        batch_memory_in_use: Memory held by running processes.
        queued: Number of released processes waiting to start.
        running: Number of running processes.
        finished: Number of finished processes.
        unreleased: Number of processes not yet released.
        queued_cpu: Sum of the CPU requests of queued processes, cores.
        queue: The first queued processes in the current queue order.
    """

    time: float
    demand: np.ndarray
    online_quota: np.ndarray
    batch_budget: np.ndarray
    batch_cpu_requested: np.ndarray
    batch_cpu_in_use: np.ndarray
    batch_memory_in_use: np.ndarray
    queued: int
    running: int
    finished: int
    unreleased: int
    queued_cpu: float
    queue: tuple[QueueRow, ...]


_set_observation = tuple(getattr(SimulationObservation, name).__set__ for name in SimulationObservation.__slots__)


def new_observation(
    time: float,
    demand: np.ndarray,
    online_quota: np.ndarray,
    batch_budget: np.ndarray,
    batch_cpu_requested: np.ndarray,
    batch_cpu_in_use: np.ndarray,
    batch_memory_in_use: np.ndarray,
    queued: int,
    running: int,
    finished: int,
    unreleased: int,
    queued_cpu: float,
    queue: tuple[QueueRow, ...],
) -> SimulationObservation:
    """``SimulationObservation(...)`` with the fields in order, for the simulator's hot path.

    The same object the constructor makes, built by setting its slots directly: the frozen
    dataclass's ``__init__`` goes through ``object.__setattr__`` once per field and costs about
    twice as much, once per event when an observer is called.
    """
    (s_time, s_demand, s_quota, s_budget, s_requested, s_in_use, s_memory, s_queued, s_running, s_finished,
     s_unreleased, s_queued_cpu, s_queue) = _set_observation  # fmt: skip
    observation = object.__new__(SimulationObservation)
    s_time(observation, time)
    s_demand(observation, demand)
    s_quota(observation, online_quota)
    s_budget(observation, batch_budget)
    s_requested(observation, batch_cpu_requested)
    s_in_use(observation, batch_cpu_in_use)
    s_memory(observation, batch_memory_in_use)
    s_queued(observation, queued)
    s_running(observation, running)
    s_finished(observation, finished)
    s_unreleased(observation, unreleased)
    s_queued_cpu(observation, queued_cpu)
    s_queue(observation, queue)
    return observation


@dataclass(frozen=True, slots=True)
class CostBreakdown:
    """The cost terms of the reward, raw and weighted.

    Attributes:
        online_shortfall: Online CPU demand above the online quota, integrated, core-seconds.
        unfinished_processes: Released but unfinished batch processes, integrated, process-seconds.
        quota_change: Sum over quota changes of ``|new - old|`` summed over machines, cores.
        shortfall_cost: ``shortfall_weight × online_shortfall``.
        unfinished_cost: ``unfinished_weight × unfinished_processes``.
        quota_change_cost: ``quota_change_weight × quota_change``.
        total: The sum of the three weighted costs; a step's reward is minus its increase.
    """

    online_shortfall: float = 0.0
    unfinished_processes: float = 0.0
    quota_change: float = 0.0
    shortfall_cost: float = 0.0
    unfinished_cost: float = 0.0
    quota_change_cost: float = 0.0
    total: float = 0.0

    def __sub__(self, other: CostBreakdown) -> CostBreakdown:
        return CostBreakdown(*(getattr(self, f.name) - getattr(other, f.name) for f in fields(self)))

    def as_dict(self) -> dict[str, float]:
        """The fields as a new dict of floats."""
        return {f.name: float(getattr(self, f.name)) for f in fields(self)}


@dataclass(frozen=True, slots=True)
class SimulationReport:
    """Totals up to the simulator's current time.

    Attributes:
        time: Seconds from the start of the flow.
        horizon: The flow's horizon, seconds.
        released: Processes released so far.
        finished: Processes finished.
        running: Processes running.
        queued: Processes waiting.
        unfinished: Released but unfinished processes (queued + running); censored at the horizon.
        unreleased: Processes not released yet (or released after the horizon).
        remaining_work: Core-seconds still needed by the unfinished processes.
        completed_work: Core-seconds done, by finished and running processes.
        restricted_flow_time: Sum over released processes of ``min(finish, time) - release``, seconds.
        mean_restricted_flow_time: ``restricted_flow_time / released`` (0 if nothing was released).
        batch_cpu_used: Batch CPU actually used, integrated, core-seconds.
        events: Events the simulator has processed.
        costs: The reward's cost terms, counted after the warm-up.
    """

    time: float
    horizon: float
    released: int
    finished: int
    running: int
    queued: int
    unfinished: int
    unreleased: int
    remaining_work: float
    completed_work: float
    restricted_flow_time: float
    mean_restricted_flow_time: float
    batch_cpu_used: float
    events: int
    costs: CostBreakdown
