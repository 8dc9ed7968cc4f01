"""The event-driven physics: queueing, placement, CPU sharing, memory, time and cost accounting."""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields
from heapq import heappop, heappush
from typing import Any, Final, cast

import numpy as np

from cluster_sim._structures import COMPILED, TOL, MachineIndex, OrderedQueue
from cluster_sim.allocation import Allocation, QueueOrder, capped_quota
from cluster_sim.models import (
    CostBreakdown,
    ProcessState,
    ProcessStatus,
    QueueRow,
    SimulationObservation,
    SimulationReport,
    new_observation,
)
from cluster_sim.processes import ProcessFlow

__all__ = ["ClusterSimulator", "SimulatorConfig"]

# Event priorities: at equal times, completions free resources first, then a delayed allocation
# takes effect, then demand changes, then releases; one placement pass follows all of them.
_COMPLETION: Final = 0
_ALLOCATION: Final = 1
_DEMAND: Final = 2
_RELEASE: Final = 3

_UNRELEASED: Final = 0
_QUEUED: Final = 1
_RUNNING: Final = 2
_FINISHED: Final = 3

# Absolute slack for comparisons of sums of cores and memory, which accumulate rounding.
_TOL: Final = TOL

# Above this many machines to update at once, numpy's vector operations beat a loop over Python floats.
_BULK: Final = 16

# ``ndarray.sum`` without its Python wrapper: the same reduction, in the same order.
_add_reduce = np.add.reduce

# States of the batch CPU in use summed per numpy call.
_USE_ROWS: Final = 256

# Above this many integration steps or shortfall segments pending, they are added up (memory stays bounded).
_SHORTFALL_STEPS: Final = 4096
_SHORTFALL_SEGMENTS: Final = 256

# Above this many queued processes, a placement pass filters the queue with numpy first.
_LONG_QUEUE: Final = 48

# Up to this many machines whose free resources grew, an older process is checked against each first.
_FEW_GROWN: Final = 4

# Quota changes whose size is summed per numpy call.
_QUOTA_CHANGES: Final = 256


@dataclass(frozen=True, slots=True)
class SimulatorConfig:
    """Settings of the physics and of the cost.

    Attributes:
        control_interval: Seconds one environment step advances.
        actuation_delay: Seconds between :meth:`ClusterSimulator.submit` and the allocation taking effect.
        warmup: Seconds at the start that the cost does not count; the environments advance through
            them under the initial allocation when they reset.
        borrowing: Whether batch processes may use online quota that online demand leaves idle.
        aging_limit: Seconds after which the oldest queued processes are considered first, in release
            order; the first of them that could start under the current budgets but does not fit now
            reserves the machine closest to fitting it, where no younger process starts until it does.
            None turns the guard off.
        shortfall_weight: Cost per core-second of online demand above the online quota.
        unfinished_weight: Cost per second per released, unfinished batch process.
        quota_change_weight: Cost per core of online quota change (summed over machines).
    """

    control_interval: float = 60.0
    actuation_delay: float = 0.0
    warmup: float = 0.0
    borrowing: bool = False
    aging_limit: float | None = 1800.0
    shortfall_weight: float = 0.02
    unfinished_weight: float = 0.002
    quota_change_weight: float = 0.01

    def __post_init__(self) -> None:
        for name in (
            "control_interval",
            "actuation_delay",
            "warmup",
            "shortfall_weight",
            "unfinished_weight",
            "quota_change_weight",
        ):
            value = float(getattr(self, name))
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be a finite number >= 0, got {value}")
            object.__setattr__(self, name, value)
        if self.control_interval <= 0:
            raise ValueError(f"control_interval must be positive, got {self.control_interval}")
        if self.aging_limit is not None:
            limit = float(self.aging_limit)
            if not limit >= 0:
                raise ValueError(f"aging_limit must be >= 0 or None, got {self.aging_limit}")
            object.__setattr__(self, "aging_limit", limit)

    def __reduce__(self) -> tuple[object, ...]:
        # Copied and pickled by its fields (the default cannot rebuild a compiled class).
        return (SimulatorConfig, tuple(getattr(self, f.name) for f in fields(self)))


@dataclass(frozen=True, slots=True)
class _FlowTables:
    """What the simulator derives from a flow, once per flow: arrays are read-only, lists never written.

    Python lists of floats serve the per-event arithmetic (the same IEEE operations as on the
    arrays, without numpy's per-element overhead); the arrays serve reports and whole-cluster sums.
    """

    cpu: np.ndarray  # cores per machine
    batch_memory: np.ndarray
    p_release: np.ndarray  # s
    p_cpu: np.ndarray  # cores
    p_memory: np.ndarray
    p_duration: np.ndarray  # s
    cpu_list: list[float]
    batch_memory_list: list[float]
    p_cpu_list: list[float]
    p_memory_list: list[float]
    p_duration_list: list[float]
    queues: dict[QueueOrder, OrderedQueue]  # empty, one per order, to copy
    fifo_release: list[float]  # release times in FIFO order
    release_process: list[int]  # processes in FIFO order: the order equal release times are handled in
    release_time: list[float]  # fifo_release and a final infinity
    demand_rows: np.ndarray  # (1 + samples, machines) cores: zero (before the first sample), then each sample
    demand_time: list[float]  # sample times and a final infinity

    @classmethod
    def of(cls, flow: ProcessFlow) -> _FlowTables:
        """The tables of ``flow``, derived on first use and kept with the flow."""
        tables = flow._derived.get(__name__)
        if not isinstance(tables, _FlowTables):
            tables = cls._derive(flow)
            flow._derived[__name__] = tables
        return tables

    @classmethod
    def _derive(cls, flow: ProcessFlow) -> _FlowTables:
        machines = flow.machines
        processes = flow.processes
        n = len(processes)
        cpu = np.array([m.cpu for m in machines], dtype=float)
        batch_memory = np.array([m.batch_memory for m in machines], dtype=float)
        p_release = np.array([p.release for p in processes], dtype=float)
        p_cpu = np.array([p.cpu for p in processes], dtype=float)
        p_memory = np.array([p.memory for p in processes], dtype=float)
        p_duration = np.array([p.duration for p in processes], dtype=float)
        p_estimate = np.array([p.estimate for p in processes], dtype=float)
        index = np.arange(n)
        total_memory = float(batch_memory.sum())
        share = np.maximum(p_cpu / float(cpu.sum()), p_memory / total_memory if total_memory > 0 else 0.0)
        fifo = np.lexsort((index, p_release))
        orders = {
            QueueOrder.FIFO: fifo,
            QueueOrder.SHORTEST_ESTIMATE: np.lexsort((index, p_release, p_estimate)),
            QueueOrder.DOMINANT_SHARE: np.lexsort((index, p_release, share)),
        }
        demand_samples = np.array([s.cpu for s in flow.demand], dtype=float).reshape(len(flow.demand), len(machines))
        demand_rows = np.concatenate([np.zeros((1, len(machines))), demand_samples])
        for array in (cpu, batch_memory, p_release, p_cpu, p_memory, p_duration, demand_rows):
            array.flags.writeable = False
        fifo_release = p_release[fifo].tolist()
        return cls(
            cpu=cpu,
            batch_memory=batch_memory,
            p_release=p_release,
            p_cpu=p_cpu,
            p_memory=p_memory,
            p_duration=p_duration,
            cpu_list=cpu.tolist(),
            batch_memory_list=batch_memory.tolist(),
            p_cpu_list=p_cpu.tolist(),
            p_memory_list=p_memory.tolist(),
            p_duration_list=p_duration.tolist(),
            queues={order: OrderedQueue(ranking) for order, ranking in orders.items()},
            fifo_release=fifo_release,
            release_process=fifo.tolist(),
            release_time=[*fifo_release, math.inf],
            demand_rows=demand_rows,
            demand_time=[*(s.time for s in flow.demand), math.inf],
        )


class ClusterSimulator:
    """Discrete-event simulator of one :class:`ProcessFlow` under submitted allocations.

    The simulator jumps between exact event times (releases, demand samples, delayed allocations,
    completions and the time asked for by :meth:`advance`). Events are ordered by
    ``(time, priority, sequence)`` so equal times resolve the same way on every run: releases and
    demand samples are read in that order from the flow's sorted lists, and the events made while
    running (completions, allocations) live in a heap, so its size follows the machines, not the
    flow. Each machine keeps a virtual clock of "full-speed seconds": every process on a machine
    progresses at the same fraction of its CPU request, so a process finishes when its machine's
    virtual clock has advanced by its duration, and a rate change reschedules one event per machine.

    The cost of an event does not grow with the flow: the queue is kept sorted in each queue order
    and touched only where a process enters or starts, machines are kept sorted by free CPU for best
    fit and re-sorted only where their free resources change, and CPU rates are recomputed only on
    the machines whose budget or requests changed.

    Args:
        flow: The process flow to simulate.
        config: Physics and cost settings; defaults to ``SimulatorConfig()``.
        initial_allocation: The allocation in effect from time 0; by default the online quota equals
            the demand at time 0, FIFO order, 100 % admission.
    """

    def __init__(
        self,
        flow: ProcessFlow,
        config: SimulatorConfig | None = None,
        *,
        initial_allocation: Allocation | None = None,
    ) -> None:
        self._flow = flow
        self._config = config if config is not None else SimulatorConfig()
        tables = _FlowTables.of(flow)
        m_count = len(flow.machines)
        n = len(flow.processes)
        self._cpu = tables.cpu  # cores
        self._batch_memory = tables.batch_memory
        self._p_release = tables.p_release  # s
        self._p_cpu = tables.p_cpu  # cores
        self._p_memory = tables.p_memory
        self._p_duration = tables.p_duration  # s
        self._cpu_list = tables.cpu_list
        self._batch_memory_list = tables.batch_memory_list
        self._p_cpu_list = tables.p_cpu_list
        self._p_memory_list = tables.p_memory_list
        self._p_duration_list = tables.p_duration_list
        self._queues = {order: queue.empty_copy() for order, queue in tables.queues.items()}
        self._fifo_queue = self._queues[QueueOrder.FIFO]
        self._fifo_release = tables.fifo_release
        self._release_process = tables.release_process
        self._release_time = tables.release_time
        self._next_release = 0
        self._n_processes = n

        # Per process, as Python lists (an element costs less to write than a numpy scalar; the
        # reports gather them into arrays).
        self._state = [_UNRELEASED] * n
        self._machine_of = [-1] * n
        self._start = [math.nan] * n
        self._finish = [math.nan] * n
        self._target = [0.0] * n  # the machine's virtual clock value at which the process is done

        self._demand_rows = tables.demand_rows
        self._demand_time = tables.demand_time
        self._next_demand = 0  # the demand in effect is _demand_rows[_next_demand], cores
        self._quota = np.zeros(m_count)  # cores
        self._budget_array = self._cpu.copy()  # cores batch processes may use, kept with quota and demand
        self._budget_list: list[float] = self._budget_array.tolist()
        # With borrowing: the budgets of the demand rows from _budget_rows_first on under the quota in
        # effect, as an array (one row per demand row) and as lists (see _set_budget).
        self._budget_rows = np.zeros((0, m_count))
        self._budget_lists: list[list[float]] = []
        self._budget_rows_first = 0
        self._requested = [0.0] * m_count  # cores requested by running processes
        self._requested_array = np.zeros(m_count)  # the same values, for the sums over machines
        self._memory_used = [0.0] * m_count
        self._memory_used_array = np.zeros(m_count)  # the same values, for the observation
        self._virtual = [0.0] * m_count  # full-speed seconds elapsed on the machine
        self._virtual_at = [0.0] * m_count  # time at which _virtual was last brought up to date
        self._rate = [1.0] * m_count  # fraction of its request each running process gets
        self._rate_array = np.ones(m_count)  # the same values, for the sums over machines
        self._slowed: set[int] = set()  # machines whose rate is not 1
        self._use = np.zeros(m_count)  # requested × rate per machine: the batch CPU in use, cores
        # Batch CPU in use, summed over machines as numpy sums them, once per batch of states: each
        # state's per-machine values are a row, and each integration step notes its row and length.
        self._use_rows = np.zeros((_USE_ROWS, m_count))
        self._use_steps: list[float] = []  # the seconds of each integration step since the last sum
        self._use_row_first: list[int] = []  # per row in use, the index of its first step in _use_steps
        self._version = [0] * m_count
        # Per machine, the rate and the earliest target (inf: none running) its completion in the heap
        # was computed from: a completion is pushed again only when either changes (NaN: none pushed yet).
        self._scheduled_rate = [math.nan] * m_count
        self._scheduled_top = [math.inf] * m_count
        self._running: list[list[tuple[float, int]]] = [[] for _ in range(m_count)]
        self._changed: set[int] = set()  # machines whose batch budget or requested CPU changed
        self._all_changed = False  # every machine's budget changed (an allocation): as if all were in _changed
        self._touched: set[int] = set()  # machines whose set of running processes changed
        self._free = MachineIndex([0.0] * m_count, self._batch_memory_list)
        self._stale: set[int] = set()  # machines whose entry in _free is out of date
        self._all_stale = True  # every machine's entry in _free is out of date: as if all were in _stale
        self._memory_stale: set[int] = set(range(m_count))  # those of them whose memory in use changed
        self._every = range(m_count)
        self._dirty = False
        self._fresh: list[int] = []  # processes released since the last placement pass

        self._order = QueueOrder.FIFO
        self._fraction = 1.0
        self._time = 0.0
        self._n_released = 0
        self._n_queued = 0
        self._n_running = 0
        self._n_finished = 0
        self._queued_cpu = 0.0
        # The online shortfall integrated lazily: the seconds counted of each integration step, and the
        # segments of steps under one demand row and one quota, (first step, row of _demand_rows, quota).
        # The shortfall rate of every segment is computed per numpy call when they are added up.
        self._shortfall_steps: list[float] = []
        self._shortfall_segments: list[tuple[int, int, np.ndarray]] = []
        self._batch_use_rate = 0.0  # cores, when no row is pending
        self._use_rate_stale = False  # requests or rates changed since the last row
        self._shortfall = 0.0  # core-seconds after the warm-up
        self._unfinished = 0.0  # process-seconds after the warm-up
        self._quota_change = 0.0  # cores after the warm-up, up to the changes still pending
        # Quota changes (old, new) after the warm-up not yet added to _quota_change: summed per numpy call.
        self._quota_changes: list[tuple[np.ndarray, np.ndarray]] = []
        self._batch_used = 0.0  # core-seconds
        self._events = 0

        # (time, priority, sequence, machine, version) of a completion, or (time, priority, sequence, 0, 0)
        # of an allocation (kept in _allocations by its sequence number); the unique sequence numbers
        # order equal times, so the rest is never compared.
        self._heap: list[tuple[float, int, int, int, int]] = []
        self._allocations: dict[int, Allocation] = {}
        self._sequence = n + len(flow.demand)  # the flow's own events come first at equal keys

        if initial_allocation is None:
            first = flow.demand[0].cpu if flow.demand and flow.demand[0].time == 0 else (0.0,) * m_count
            initial_allocation = Allocation(tuple(min(d, c) for d, c in zip(first, self._cpu, strict=True)))
        self._check_allocation(initial_allocation)
        self._quota = np.minimum(np.array(initial_allocation.online_quota, dtype=float), self._cpu)
        self._order = QueueOrder(initial_allocation.queue_order)
        self._fraction = initial_allocation.admission_fraction
        self._shortfall_segments.append((0, 0, self._quota))
        self._set_budget()

    def __reduce__(self) -> tuple[object, ...]:
        # A run is copied (copy.deepcopy) and pickled mid-way by its attributes; a compiled class has
        # no __dict__ for the default to copy, so they are named (mypyc lists them in __mypyc_attrs__).
        names: tuple[str, ...] = getattr(type(self), "__mypyc_attrs__", None) or tuple(vars(self))
        state = {name: getattr(self, name) for name in names if name not in ("_flow", "_config")}
        return (_restored_simulator, (self._flow, self._config, state))

    # Public API -----------------------------------------------------------------------------

    @property
    def flow(self) -> ProcessFlow:
        """The simulated flow."""
        return self._flow

    @property
    def config(self) -> SimulatorConfig:
        """The physics and cost settings."""
        return self._config

    @property
    def time(self) -> float:
        """The current simulation time, seconds."""
        return self._time

    @property
    def done(self) -> bool:
        """Whether the horizon has been reached."""
        return self._time >= self._flow.horizon

    def submit(self, allocation: Allocation) -> float:
        """Schedule ``allocation`` to take effect after the actuation delay.

        Returns:
            The simulation time at which it takes effect (allocations due after the horizon never do).

        Raises:
            ValueError: If the allocation's quota does not give one value per machine.
        """
        self._check_allocation(allocation)
        effect = self._time + self._config.actuation_delay
        self._push(effect, _ALLOCATION, allocation)
        return effect

    def advance(
        self,
        time: float,
        *,
        queue_rows: int = 16,
        on_event: Callable[[SimulationObservation], None] | None = None,
    ) -> SimulationObservation:
        """Process every event up to ``time`` (capped at the horizon) and observe the cluster there.

        Args:
            time: Absolute simulation time, seconds; not earlier than :attr:`time`.
            queue_rows: How many queued processes the observation lists.
            on_event: Called with an observation (without queue rows) after each event time.

        Raises:
            ValueError: If ``time`` lies in the past.
        """
        if not time >= self._time:
            raise ValueError(f"cannot advance to t={time}: the simulator is already at t={self._time}")
        target = min(float(time), self._flow.horizon)
        heap = self._heap
        release_time = self._release_time
        release_process = self._release_process
        demand_time = self._demand_time
        warmup = self._config.warmup
        version = self._version
        changed = self._changed
        touched = self._touched
        use_steps = self._use_steps
        use_row_first = self._use_row_first
        # A row of batch CPU in use is copied through memoryviews (cheaper than numpy's item assignment).
        m_count = len(self._use)
        use_now = memoryview(cast(Any, self._use))  # numpy's stubs do not declare the buffer protocol
        use_rows = memoryview(cast(Any, self._use_rows.reshape(-1)))
        shortfall_steps = self._shortfall_steps
        shortfall_segments = self._shortfall_segments
        borrowing = self._config.borrowing
        state = self._state
        fresh = self._fresh
        p_cpu = self._p_cpu_list
        next_release = self._next_release
        next_demand = self._next_demand
        release_at = release_time[next_release]
        demand_at = demand_time[next_demand]
        while True:
            # The next instant: the earliest of the next release, the next demand sample and the heap.
            now = release_at if release_at < demand_at else demand_at
            if heap and heap[0][0] < now:
                now = heap[0][0]
            if not now <= target:
                break
            # What :meth:`_integrate` does, inline: the costs and the batch CPU used up to now.
            previous = self._time
            elapsed = now - previous
            if elapsed > 0:
                if self._use_rate_stale:
                    row = len(use_row_first)
                    if row == _USE_ROWS:
                        self._flush_use()
                        row = 0
                    start = row * m_count
                    use_rows[start : start + m_count] = use_now
                    use_row_first.append(len(use_steps))
                    use_steps.append(elapsed)
                    self._use_rate_stale = False
                elif use_row_first:
                    use_steps.append(elapsed)
                else:
                    self._batch_used += self._batch_use_rate * elapsed
                counted = now - (previous if previous > warmup else warmup)
                if counted > 0:
                    shortfall_steps.append(counted)
                    self._unfinished += (self._n_queued + self._n_running) * counted
            self._time = now
            handled = self._events
            # At one instant: completions, then allocations (both in the heap, by priority and
            # sequence), then the demand sample, then releases in FIFO order.
            while heap and heap[0][0] == now:
                entry = heappop(heap)
                if entry[1] == _COMPLETION:
                    j = entry[3]
                    if entry[4] == version[j]:  # else superseded: the machine's rate or next completion changed
                        self._complete(j)
                else:
                    self._apply(self._allocations.pop(entry[2]))
            if demand_at == now:
                next_demand += 1
                if borrowing:
                    self._set_demand(next_demand)
                else:
                    # What :meth:`_set_demand` does without borrowing: a new shortfall segment.
                    self._events += 1
                    self._next_demand = next_demand
                    steps = len(shortfall_steps)
                    if shortfall_segments[-1][0] == steps:
                        shortfall_segments[-1] = (steps, next_demand, self._quota)  # the last had no step
                    else:
                        shortfall_segments.append((steps, next_demand, self._quota))
                        if len(shortfall_segments) > _SHORTFALL_SEGMENTS or steps > _SHORTFALL_STEPS:
                            self._flush_shortfall()
                demand_at = demand_time[next_demand]
            if release_at == now:
                # Releases, in FIFO order: each process enters the queues in the placement pass
                # that follows, unless it starts there.
                first = next_release
                queued_cpu = self._queued_cpu
                while release_time[next_release] == now:
                    i = release_process[next_release]
                    state[i] = _QUEUED
                    fresh.append(i)
                    queued_cpu += p_cpu[i]
                    next_release += 1
                count = next_release - first
                self._next_release = next_release
                release_at = release_time[next_release]
                self._queued_cpu = queued_cpu
                self._events += count
                self._n_released += count
                self._n_queued += count
                self._dirty = True
            elif self._events == handled:
                continue  # only superseded completions were due
            if self._dirty:
                if self._n_queued:
                    self._schedule()
                else:
                    self._dirty = False  # nothing to place (and so nothing fresh)
            if changed:
                if len(changed) == 1 and not self._all_changed:
                    # The common case: a process started or finished on one machine (the machines whose
                    # running processes changed are among those changed, so at most this one).
                    j = changed.pop()
                    if touched:
                        touched.clear()
                        self._update_rate(j, True)
                    else:
                        self._update_rate(j, False)
                else:
                    self._update_rates()
            elif self._all_changed:
                self._update_rates()
            if on_event is not None:
                on_event(self.observe(queue_rows=0))
        self._integrate(target)
        self._time = target
        if len(shortfall_steps) > _SHORTFALL_STEPS:
            self._flush_shortfall()
        return self.observe(queue_rows=queue_rows)

    def observe(self, *, queue_rows: int = 16) -> SimulationObservation:
        """The cluster at the current time, without advancing."""
        rows: tuple[QueueRow, ...] = ()
        if queue_rows > 0 and self._n_queued:
            processes = self._flow.processes
            rows = tuple(
                QueueRow(
                    processes[i].name,
                    processes[i].cpu,
                    processes[i].memory,
                    cast(float, processes[i].estimate),  # a float since BatchProcess.__post_init__
                    self._time - processes[i].release,
                )
                for i in self._queues[self._order].processes(queue_rows)
            )
        queued_cpu = self._queued_cpu
        return new_observation(
            self._time,
            self._demand_rows[self._next_demand].copy(),
            self._quota.copy(),
            self._budget_array.copy(),
            self._requested_array.copy(),
            self._use.copy(),  # requested × rate per machine, the batch CPU in use
            self._memory_used_array.copy(),
            self._n_queued,
            self._n_running,
            self._n_finished,
            self._n_processes - self._n_released,
            0.0 if queued_cpu < 0.0 else queued_cpu,  # max(queued_cpu, 0.0)
            rows,
        )

    def status(self, name: str) -> ProcessStatus:
        """The state of process ``name`` at the current time.

        Raises:
            KeyError: If the flow has no such process.
        """
        i = self._flow.index_of(name)
        state = self._state[i]
        work = self._p_cpu[i] * self._p_duration[i]
        done = float(self._work_done(np.array([i]))[0])
        machine = self._machine_of[i]
        release = float(self._p_release[i])
        if state == _FINISHED:
            lifecycle = ProcessState.FINISHED
            flow_time = float(self._finish[i]) - release
        elif state == _UNRELEASED:
            lifecycle = ProcessState.UNRELEASED
            flow_time = 0.0
        else:
            lifecycle = ProcessState.RUNNING if state == _RUNNING else ProcessState.QUEUED
            if self.done:
                lifecycle = ProcessState.CENSORED
            flow_time = self._time - release
        return ProcessStatus(
            name=name,
            state=lifecycle,
            machine=self._flow.machines[machine].name if machine >= 0 else None,
            release=release,
            start=None if math.isnan(self._start[i]) else float(self._start[i]),
            finish=None if math.isnan(self._finish[i]) else float(self._finish[i]),
            work_done=done,
            remaining_work=float(work - done),
            flow_time=flow_time,
        )

    def report(self) -> SimulationReport:
        """Totals up to the current time, including the cost terms of the reward."""
        state = np.array(self._state, dtype=np.int8)
        finish = np.array(self._finish)
        released = state != _UNRELEASED
        work = self._p_cpu * self._p_duration
        done = self._work_done(np.flatnonzero(released))
        unfinished = (state == _QUEUED) | (state == _RUNNING)
        end = np.where(np.isnan(finish), self._time, finish)
        flow_time = float((end - self._p_release)[released].sum())
        return SimulationReport(
            time=self._time,
            horizon=self._flow.horizon,
            released=self._n_released,
            finished=self._n_finished,
            running=self._n_running,
            queued=self._n_queued,
            unfinished=int(unfinished.sum()),
            unreleased=len(self._flow.processes) - self._n_released,
            remaining_work=float(work[released].sum() - done.sum()),
            completed_work=float(done.sum()),
            restricted_flow_time=flow_time,
            mean_restricted_flow_time=flow_time / self._n_released if self._n_released else 0.0,
            batch_cpu_used=float(self._flush_use()),
            events=self._events,
            costs=self.costs(),
        )

    def costs(self) -> CostBreakdown:
        """The cost terms so far (the ``costs`` of :meth:`report`, without the other totals)."""
        config = self._config
        quota_change = self._flush_quota_changes()
        shortfall = config.shortfall_weight * self._flush_shortfall()
        unfinished = config.unfinished_weight * self._unfinished
        change = config.quota_change_weight * quota_change
        return CostBreakdown(
            float(self._shortfall),
            float(self._unfinished),
            float(quota_change),
            float(shortfall),
            float(unfinished),
            float(change),
            float(shortfall + unfinished + change),
        )

    # Events ---------------------------------------------------------------------------------

    def _push(self, time: float, priority: int, allocation: Allocation) -> None:
        sequence = self._sequence
        self._allocations[sequence] = allocation
        heappush(self._heap, (time, priority, sequence, 0, 0))
        self._sequence = sequence + 1

    def _set_demand(self, row: int) -> None:
        """Demand sample ``row - 1`` takes effect (``_demand_rows[row]``)."""
        self._events += 1
        self._next_demand = row
        if self._config.borrowing:
            # The budget of most machines changes with their demand: all are recomputed in bulk (on a
            # machine whose budget did not change, rate and free resources come out as they were).
            self._set_budget()
            self._all_changed = True
            self._all_stale = True
            self._dirty = True
        self._new_shortfall_segment(row, self._quota)

    def _apply(self, allocation: Allocation) -> None:
        self._events += 1
        quota = capped_quota(allocation, self._flow.machines, self._cpu)
        if self._time >= self._config.warmup:
            changes = self._quota_changes
            changes.append((self._quota, quota))  # neither array is ever written
            if len(changes) == _QUOTA_CHANGES:
                self._flush_quota_changes()
        self._quota = quota
        order = allocation.queue_order  # a QueueOrder since Allocation.__post_init__
        self._order = order if type(order) is QueueOrder else QueueOrder(order)
        self._fraction = allocation.admission_fraction
        self._new_shortfall_segment(self._next_demand, quota)  # the demand sample in effect, if any
        self._budget_lists = []  # those of the previous quota
        self._set_budget()
        self._all_changed = True
        self._all_stale = True
        self._dirty = True

    def _new_shortfall_segment(self, row: int, quota: np.ndarray) -> None:
        """From now on the online shortfall is that of ``_demand_rows[row]`` above ``quota``."""
        segments = self._shortfall_segments
        steps = len(self._shortfall_steps)
        if segments[-1][0] == steps:
            segments[-1] = (steps, row, quota)  # the last segment had no step
        else:
            segments.append((steps, row, quota))
            if len(segments) > _SHORTFALL_SEGMENTS or steps > _SHORTFALL_STEPS:
                self._flush_shortfall()

    def _flush_shortfall(self) -> float:
        """Add the pending integration steps to the online shortfall, in time order; returns the total."""
        steps = self._shortfall_steps
        segments = self._shortfall_segments
        if steps:
            # Σ max(demand - quota, 0) per segment, one row per segment (row-wise, each row sums as it
            # would alone).
            demand = self._demand_rows[[row for _, row, _ in segments]]
            quota = np.array([quota for _, _, quota in segments])
            rates: list[float] = _add_reduce(np.maximum(demand - quota, 0.0), axis=1).tolist()
            total = self._shortfall
            last = len(segments) - 1
            for k in range(last + 1):
                rate = rates[k]
                end = segments[k + 1][0] if k < last else len(steps)
                for counted in steps[segments[k][0] : end]:
                    total += rate * counted
            self._shortfall = total
            steps.clear()
        _, row, quota = segments[-1]
        segments.clear()
        segments.append((0, row, quota))
        return self._shortfall

    def _flush_quota_changes(self) -> float:
        """Add the pending quota changes to the quota change, in time order; returns the total."""
        changes = self._quota_changes
        if changes:
            # Σ |new - old| per change, one row per change (row-wise, each row sums as it would alone).
            old = np.array([before for before, _ in changes])
            new = np.array([after for _, after in changes])
            total = self._quota_change
            sizes: list[float] = _add_reduce(np.absolute(new - old), axis=1).tolist()
            for size in sizes:
                total += size
            self._quota_change = total
            changes.clear()
        return self._quota_change

    def _complete(self, j: int) -> None:
        """Finish the processes due on machine ``j`` now (at its completion event, not superseded).

        While nothing is queued the machine's best-fit entry is brought up to date here, and when
        nothing else is due at this instant its rate and next completion too (see the end).
        """
        self._events += 1
        now = self._time
        virtual = self._virtual[j]
        elapsed = now - self._virtual_at[j]
        if elapsed > 0:
            virtual += self._rate[j] * elapsed
            self._virtual[j] = virtual
        self._virtual_at[j] = now
        limit = virtual + 1e-9 * (virtual if virtual > 1.0 else 1.0)  # the clock never runs backwards
        running = self._running[j]
        p_cpu = self._p_cpu_list
        p_memory = self._p_memory_list
        state = self._state
        finish = self._finish
        requested = self._requested[j]
        memory_used = self._memory_used[j]
        finished = 0
        while running and (not finished or running[0][0] <= limit):
            _, i = heappop(running)
            state[i] = _FINISHED
            finish[i] = now
            requested -= p_cpu[i]
            memory_used -= p_memory[i]
            finished += 1
        self._n_running -= finished
        self._n_finished += finished
        if not running:
            # Reset exactly so rounding does not accumulate over a long run.
            requested = 0.0
            memory_used = 0.0
        self._requested[j] = requested
        self._requested_array[j] = requested
        self._use[j] = requested * self._rate[j]
        self._use_rate_stale = True
        self._memory_used[j] = memory_used
        self._memory_used_array[j] = memory_used
        if self._n_queued:
            self._changed.add(j)
            self._touched.add(j)
            self._stale.add(j)
            self._memory_stale.add(j)
            self._dirty = True
            return
        # Nothing is queued, so which machines grew matters to no process of the next pass: the
        # machine's entry in the best-fit index is set at once to what that pass's refresh would compute.
        self._free.set(j, self._fraction * self._budget_list[j] - requested, self._batch_memory_list[j] - memory_used)
        heap = self._heap
        if (
            not self._changed
            and not self._all_changed
            and (not heap or heap[0][0] != now)
            and self._release_time[self._next_release] != now
            and self._demand_time[self._next_demand] != now
        ):
            # Nothing else changed or is due at this instant, and no placement pass follows: the rate
            # and next completion are updated here, as the event loop would update them after the instant.
            self._update_rate(j, True)
        else:
            self._changed.add(j)
            self._touched.add(j)
            self._dirty = True

    # Placement and rates --------------------------------------------------------------------

    def _set_budget(self) -> None:
        """Recompute the batch budget per machine; called wherever the quota or (when borrowing) demand changes.

        With borrowing the budget follows each demand sample under one quota, so the budgets of the
        samples due within the next control interval are computed at once (one row each, the same
        element-wise operations), and a sample reads its row; a new quota drops them (:meth:`_apply`).
        """
        if self._config.borrowing:
            row = self._next_demand
            ahead = row - self._budget_rows_first
            if 0 <= ahead < len(self._budget_lists):
                self._budget_array = self._budget_rows[ahead]
                self._budget_list = self._budget_lists[ahead]
                return
            time = self._time
            end = bisect_right(self._demand_time, time + self._config.control_interval, row) + 1
            rows = self._cpu - np.minimum(self._quota, self._demand_rows[row:end])
            self._budget_rows = rows
            self._budget_lists = rows.tolist()
            self._budget_rows_first = row
            self._budget_array = rows[0]
            self._budget_list = self._budget_lists[0]
        else:
            budget = self._cpu - self._quota
            self._budget_array = budget
            self._budget_list = budget.tolist()

    def _refresh_free(self, grew_needed: bool = True) -> list[int]:
        """Bring the free CPU (admitted minus requested) and memory of the stale machines up to date.

        Returns:
            The machines where either grew since the end of the last placement pass, in no order
            (when ``grew_needed``; else the list may be empty whatever grew).
        """
        stale = self._stale
        all_stale = self._all_stale
        if not stale and not all_stale:
            return []
        fraction = self._fraction
        budget = self._budget_list
        requested = self._requested
        batch_memory = self._batch_memory_list
        memory_used = self._memory_used
        free = self._free
        if all_stale or len(stale) > _BULK:
            # The same operations as in the loop below, per element (numpy's float64 arithmetic is IEEE's;
            # 1.0 × a budget is the budget).
            if fraction == 1.0:
                cpu_array = self._budget_array - self._requested_array
            else:
                cpu_array = fraction * self._budget_array - self._requested_array
            new_cpu: list[float] = cpu_array.tolist()
            # Only the machines whose memory in use changed have another free memory now.
            new_memory = free.memory
            if grew_needed:
                old_cpu = free.cpu
                grew = [j for j in (self._every if all_stale else stale) if new_cpu[j] > old_cpu[j]]
                for j in self._memory_stale:
                    memory = batch_memory[j] - memory_used[j]
                    if memory > new_memory[j] and not new_cpu[j] > old_cpu[j]:
                        grew.append(j)
                    new_memory[j] = memory
            else:
                grew = []
                for j in self._memory_stale:
                    new_memory[j] = batch_memory[j] - memory_used[j]
            order = cpu_array.argsort()
            machines: list[int] = order.tolist()
            # The keys in order: compiled, picked from new_cpu (C reads, no array); interpreted, numpy's
            # gather is the faster. The same values.
            keys = [new_cpu[j] for j in machines] if COMPILED else cpu_array[order].tolist()
            free.rebuild(new_cpu, new_memory, machines, keys)
        else:
            grew = []
            free_cpu = free.cpu
            free_memory = free.memory
            for j in stale:
                cpu = fraction * budget[j] - requested[j]
                memory = batch_memory[j] - memory_used[j]
                cpu_before = free_cpu[j]
                memory_before = free_memory[j]
                if cpu > cpu_before or memory > memory_before:
                    grew.append(j)
                if cpu != cpu_before or memory != memory_before:
                    free.set(j, cpu, memory)
        stale.clear()
        self._all_stale = False
        self._memory_stale.clear()
        return grew

    def _schedule(self) -> None:
        """One placement pass: the aged processes first (the aging guard), then the queue in its order.

        Every process still queued after a pass failed to fit at the free resources the pass ended
        with, and fails at any smaller ones. So the next pass need only consider the processes
        released since (fresh), plus the old ones that fit a machine whose free resources grew;
        neither skipping changes what the pass places, only what it costs.
        """
        self._dirty = False
        fresh = self._fresh
        if self._n_queued == 0:
            fresh.clear()
            return
        limit = self._config.aging_limit
        if (
            not self._fifo_queue.ranks
            and len(fresh) <= _LONG_QUEUE
            and (limit is None or self._time - limit < self._time)
        ):
            # Only fresh processes are queued and none is aged: the pass walks them in the queue's
            # order, and only those that do not start enter the queues.
            if self._stale or self._all_stale:
                self._refresh_free(grew_needed=False)
            if len(fresh) == 1:
                # The usual case below saturation: one process released and placed at once.
                i = fresh.pop()
                free = self._free
                cpu = self._p_cpu_list[i]
                # The most free CPU bounds what can start; best fit checks the memory itself.
                if cpu <= free.keys[-1] + _TOL:
                    j = free.best_fit(cpu, self._p_memory_list[i])
                    if j >= 0:
                        self._start_alone(i, j)
                        return
                for queue in self._queues.values():
                    queue.add(i)
                return
            self._place_fresh(fresh)
            fresh.clear()
            return
        grew = self._refresh_free()
        queues = self._queues.values()
        for i in fresh:
            if self._state[i] == _QUEUED:
                for queue in queues:
                    queue.add(i)
        self._place_aged()
        if self._n_queued:
            self._place_queued(fresh, grew)
        fresh.clear()

    def _place_fresh(self, fresh: list[int]) -> None:
        """The placement pass when the queue holds only ``fresh`` processes (at most :data:`_LONG_QUEUE`)."""
        if len(fresh) > 1:
            fresh.sort(key=self._queues[self._order].rank)
        free = self._free
        keys = free.keys
        p_cpu = self._p_cpu_list
        p_memory = self._p_memory_list
        queues = self._queues.values()
        for i in fresh:
            cpu = p_cpu[i]
            # The most free CPU bounds what can start; best fit checks the memory itself.
            if cpu <= keys[-1] + _TOL:
                j = free.best_fit(cpu, p_memory[i])
                if j >= 0:
                    self._start_on(i, j)
                    continue
            for queue in queues:
                queue.add(i)

    def _place_aged(self) -> None:
        """The aging guard: place the aged processes, oldest first, until one could start but does not fit."""
        limit = self._config.aging_limit
        if limit is None:
            return
        p_cpu = self._p_cpu_list
        p_memory = self._p_memory_list
        batch_memory = self._batch_memory_list
        admitted: list[float] | None = None
        for i in self._fifo_queue.processes_before(bisect_right(self._fifo_release, self._time - limit)):
            if admitted is None:
                fraction = self._fraction
                admitted = [fraction * b for b in self._budget_list]
            cpu = p_cpu[i]
            memory = p_memory[i]
            need_cpu = cpu - _TOL
            need_memory = memory - _TOL
            feasible = [a >= need_cpu and b >= need_memory for a, b in zip(admitted, batch_memory, strict=True)]
            if not any(feasible):
                continue  # cannot start under the current budgets even on an empty machine
            if self._place(i):
                continue
            # Reserve the feasible machine closest to fitting it: nothing younger starts there, so it
            # drains until the oldest process fits (other machines keep working).
            self._reserve(self._closest(cpu, memory, feasible))
            break

    def _place_queued(self, fresh: list[int], grew: list[int]) -> None:
        """Walk the queue in its order and start every process that fits somewhere (backfilling).

        Args:
            fresh: The processes released since the last pass (some may have started since).
            grew: The machines whose free CPU or memory grew since the last pass; an older process
                can fit nowhere else.
        """
        free = self._free
        p_cpu = self._p_cpu_list
        p_memory = self._p_memory_list
        queue = self._queues[self._order]
        cpu_bound = free.max_cpu + _TOL
        memory_bound = free.max_memory + _TOL
        if len(queue) <= _LONG_QUEUE:
            # A short queue costs less to walk whole than to sort out.
            candidates = queue.processes()
        elif grew:
            free_cpu = free.cpu
            free_memory = free.memory
            # No older process asks less than these, so a grown machine with less can take none of them.
            least_cpu, least_memory = queue.least(self._p_cpu, self._p_memory)
            least_cpu -= _TOL
            least_memory -= _TOL
            fresh_set = set(fresh)
            # Keep only what could fit the most any grown machine has free (and the fresh ones).
            state = self._state
            candidates = queue.processes_within(
                self._p_cpu,
                self._p_memory,
                max(free_cpu[j] for j in grew),
                max(free_memory[j] for j in grew),
                [i for i in fresh if state[i] == _QUEUED],
            )
            few = len(grew) <= _FEW_GROWN  # else a check per grown machine costs more than a best fit
            older_may_fit = any(free_cpu[j] >= least_cpu and free_memory[j] >= least_memory for j in grew)
            for k, i in enumerate(candidates):
                if not older_may_fit:
                    candidates = [i for i in candidates[k:] if i in fresh_set]
                    break
                if p_cpu[i] > cpu_bound or p_memory[i] > memory_bound:
                    continue
                if few and i not in fresh_set:
                    need_cpu = p_cpu[i] - _TOL
                    need_memory = p_memory[i] - _TOL
                    if not any(free_cpu[j] >= need_cpu and free_memory[j] >= need_memory for j in grew):
                        continue  # it did not fit these machines before, and the others did not grow
                if self._place(i):
                    cpu_bound = free.max_cpu + _TOL
                    memory_bound = free.max_memory + _TOL
                    older_may_fit = any(free_cpu[j] >= least_cpu and free_memory[j] >= least_memory for j in grew)
            else:
                return
        else:
            # Nothing grew: only the processes released since the last pass can start.
            state = self._state
            candidates = sorted((i for i in fresh if state[i] == _QUEUED), key=queue.rank)
        for i in candidates:
            if p_cpu[i] > cpu_bound or p_memory[i] > memory_bound:
                continue
            if self._place(i):
                cpu_bound = free.max_cpu + _TOL
                memory_bound = free.max_memory + _TOL

    def _closest(self, cpu: float, memory: float, feasible: list[bool]) -> int:
        """The feasible machine with the least missing CPU plus memory (as shares), the lowest index on ties."""
        shortage = np.maximum(cpu - np.array(self._free.cpu), 0.0) / self._cpu + np.maximum(
            memory - np.array(self._free.memory), 0.0
        ) / np.maximum(self._batch_memory, _TOL)
        shortage[~np.array(feasible)] = np.inf
        return int(np.argmin(shortage))

    def _reserve(self, j: int) -> None:
        """Hold machine ``j`` back from younger processes for the rest of this placement pass."""
        self._free.set(j, -math.inf, self._free.memory[j])
        self._stale.add(j)

    def _place(self, i: int) -> bool:
        """Start queued process ``i`` on its best-fit machine, if one fits it."""
        j = self._free.best_fit(self._p_cpu_list[i], self._p_memory_list[i])
        if j < 0:
            return False
        for queue in self._queues.values():
            queue.remove(i)
        self._start_on(i, j)
        return True

    def _occupy(self, i: int, j: int, cpu: float, memory: float) -> tuple[float, float, float]:
        """Process ``i`` starts running on machine ``j`` now: its completion target at the machine's
        virtual time, the machine's requests and memory. Returns the machine's rate, requests and memory
        used (the rate unchanged: what follows decides whether it must be updated)."""
        now = self._time
        rate = self._rate[j]
        virtual = self._virtual[j]
        elapsed = now - self._virtual_at[j]
        if elapsed > 0:
            virtual += rate * elapsed
            self._virtual[j] = virtual
        self._virtual_at[j] = now
        target = virtual + self._p_duration_list[i]
        heappush(self._running[j], (target, i))
        self._state[i] = _RUNNING
        self._machine_of[i] = j
        self._start[i] = now
        self._target[i] = target
        requested = self._requested[j] + cpu
        self._requested[j] = requested
        self._requested_array[j] = requested
        self._use[j] = requested * rate
        self._use_rate_stale = True
        memory_used = self._memory_used[j] + memory
        self._memory_used[j] = memory_used
        self._memory_used_array[j] = memory_used
        return rate, requested, memory_used

    def _start_on(self, i: int, j: int) -> None:
        """Start process ``i`` (queued, out of the queues) on machine ``j``."""
        cpu = self._p_cpu_list[i]
        memory = self._p_memory_list[i]
        self._occupy(i, j, cpu, memory)
        # Within the pass the index takes the request off the free resources; the next pass
        # recomputes them from the budget (stale).
        free = self._free
        free.set(j, free.cpu[j] - cpu, free.memory[j] - memory)
        self._stale.add(j)
        self._memory_stale.add(j)
        queued = self._n_queued - 1
        self._n_queued = queued
        self._n_running += 1
        self._queued_cpu = self._queued_cpu - cpu if queued else 0.0
        self._changed.add(j)
        self._touched.add(j)

    def _start_alone(self, i: int, j: int) -> None:
        """Start process ``i`` (queued, in no queue) on machine ``j`` in a pass that places nothing else.

        What :meth:`_start_on` does, with shortcuts that end where it ends. The pass ends here and
        nothing older is queued, so the machine's entry in the best-fit index is set at once to what
        the next pass's refresh would compute from its budget (it is not marked stale; which machines
        grew matters only to older queued processes, and there are none). And when nothing else changed
        at this instant, the machine's rate and next completion are updated here, as the event loop
        would update them after the pass, or not at all where neither can change.
        """
        cpu = self._p_cpu_list[i]
        memory = self._p_memory_list[i]
        rate, requested, memory_used = self._occupy(i, j, cpu, memory)
        running = self._running[j]
        budget = self._budget_list[j]
        self._free.set(j, self._fraction * budget - requested, self._batch_memory_list[j] - memory_used)
        queued = self._n_queued - 1
        self._n_queued = queued
        self._n_running += 1
        self._queued_cpu = self._queued_cpu - cpu if queued else 0.0
        if self._changed or self._all_changed:
            self._changed.add(j)
            self._touched.add(j)
        elif rate != 1.0 or not requested <= (budget if budget >= 0.0 else 0.0) + _TOL or running[0][1] == i:
            self._update_rate(j, True)
        # Else the machine keeps its full rate and the process is not the next to finish there: the
        # completion scheduled for the machine stands (what :meth:`_update_rate` would find).

    def _update_rates(self) -> None:
        """New rates on the machines whose budget or requests changed, new completions where needed."""
        changed = self._changed
        all_changed = self._all_changed
        if not changed and not all_changed:
            return
        if len(changed) == 1 and not all_changed:
            # One machine (a process started or finished there), without the sets; the machines whose
            # running processes changed are among those changed.
            j = changed.pop()
            any_touched = bool(self._touched)
            self._touched.clear()
            self._update_rate(j, any_touched)
            return
        now = self._time
        rate = self._rate
        virtual = self._virtual
        virtual_at = self._virtual_at
        moved: list[int] = []
        # Proportional slow-down: every process on the machine gets the same fraction of its request.
        candidates: Iterable[int] = changed
        if all_changed or len(changed) > _BULK:
            # Over every machine: only one slowed down before or now can have a rate other than 1
            # (one whose budget and requests did not change keeps its rate).
            candidates = self._slowed.union(self._maybe_slowed())
            self._all_changed = False
        budget = self._budget_list
        requested_list = self._requested
        new_rates = []
        for j in candidates:
            available_j = budget[j]
            if not available_j >= 0.0:
                available_j = 0.0
            requested_j = requested_list[j]
            if requested_j <= available_j + _TOL:
                new_j = 1.0
            else:
                new_j = available_j / (requested_j if requested_j > 0 else 1.0)
            if new_j != rate[j]:
                moved.append(j)
                new_rates.append(new_j)
        touched = self._touched
        if moved:
            self._use_rate_stale = True
            rate_array = self._rate_array
            use = self._use
            requested_now = self._requested
            slowed_machines = self._slowed
            for k in range(len(moved)):
                j = moved[k]
                new_j = new_rates[k]
                # Bring the virtual clock up to now at the old rate before the rate changes.
                virtual[j] += rate[j] * (now - virtual_at[j])
                virtual_at[j] = now
                if new_j == 1.0:
                    slowed_machines.discard(j)
                else:
                    slowed_machines.add(j)
                rate[j] = new_j
                rate_array[j] = new_j
                use[j] = requested_now[j] * new_j
            touched.update(moved)
        # Only machines whose rate or whose earliest-finishing process changed need a new completion,
        # pushed in machine order (their sequence numbers order equal times).
        scheduled_rate = self._scheduled_rate
        scheduled_top = self._scheduled_top
        version = self._version
        running_on = self._running
        heap = self._heap
        for j in sorted(touched) if len(touched) > 1 else touched:
            rate_j = rate[j]
            running = running_on[j]
            top = running[0][0] if running else math.inf
            if rate_j == scheduled_rate[j] and top == scheduled_top[j]:
                continue
            scheduled_rate[j] = rate_j
            scheduled_top[j] = top
            version_j = version[j] = version[j] + 1
            if running and rate_j > 0:
                elapsed = now - virtual_at[j]
                if elapsed > 0:
                    virtual[j] += rate_j * elapsed
                virtual_at[j] = now
                left = top - virtual[j]
                if left < 0.0:  # max(left, 0.0)
                    left = 0.0
                heappush(heap, (now + left / rate_j, _COMPLETION, self._sequence, j, version_j))
                self._sequence += 1
        changed.clear()
        touched.clear()

    def _maybe_slowed(self) -> Iterable[int]:
        """Machines that may request more than their budget: every machine whose requests exceed it, maybe more.

        A machine whose requests exceed its budget has negative free CPU (``fraction ≤ 1``), and the
        machines with negative free CPU come first in the best-fit index; the entries of stale machines
        may be out of date, so they are added. If most of the index is stale, it is brought up to date
        first when the next placement pass would do it anyway (without borrowing only an allocation
        changes every budget, and a release usually comes before the next one); else numpy finds the
        machines, and the pass that needs the index brings it up to date: when processes are queued,
        that pass needs to know which machines' free resources grew since the last, and with borrowing
        a demand sample every 15 s changes every budget, often with no release between two (counted,
        fewer instructions than refreshing even when the next release comes first).
        """
        if self._all_stale or len(self._stale) > _BULK:
            if self._n_queued or self._config.borrowing:
                return (self._requested_array > self._budget_array).nonzero()[0].tolist()
            # Nothing is queued, so the next placement pass considers only the processes released by
            # then, whatever grew.
            self._refresh_free(grew_needed=False)
        return [*self._free.below(0.0), *self._stale]

    def _update_rate(self, j: int, touched: bool) -> None:
        """:meth:`_update_rates` for machine ``j`` alone (``touched``: whether its running processes changed)."""
        rate = self._rate
        rate_j = rate[j]
        available = self._budget_list[j]
        if not available >= 0.0:
            available = 0.0
        requested = self._requested[j]
        new_j = 1.0 if requested <= available + _TOL else available / (requested if requested > 0 else 1.0)
        now = self._time
        virtual = self._virtual
        virtual_at = self._virtual_at
        if new_j != rate_j:
            self._use_rate_stale = True
            virtual[j] += rate_j * (now - virtual_at[j])
            virtual_at[j] = now
            if new_j == 1.0:
                self._slowed.discard(j)
            else:
                self._slowed.add(j)
            rate[j] = new_j
            self._rate_array[j] = new_j
            self._use[j] = requested * new_j
            rate_j = new_j
        elif not touched:
            return
        running = self._running[j]
        top = running[0][0] if running else math.inf
        if rate_j == self._scheduled_rate[j] and top == self._scheduled_top[j]:
            return
        self._scheduled_rate[j] = rate_j
        self._scheduled_top[j] = top
        version = self._version
        version_j = version[j] = version[j] + 1
        if running and rate_j > 0:
            elapsed = now - virtual_at[j]
            if elapsed > 0:
                virtual[j] += rate_j * elapsed
            virtual_at[j] = now
            left = top - virtual[j]
            if left < 0.0:  # max(left, 0.0)
                left = 0.0
            heappush(self._heap, (now + left / rate_j, _COMPLETION, self._sequence, j, version_j))
            self._sequence += 1

    def _integrate(self, time: float) -> None:
        """Add the costs and the batch CPU used from the current time to ``time`` (the event loop has it inline)."""
        elapsed = time - self._time
        if elapsed <= 0:
            return
        if self._use_rate_stale:
            if len(self._use_row_first) == _USE_ROWS:
                self._flush_use()
            self._use_rows[len(self._use_row_first)] = self._use
            self._use_row_first.append(len(self._use_steps))
            self._use_rate_stale = False
        if self._use_row_first:
            self._use_steps.append(elapsed)
        else:
            self._batch_used += self._batch_use_rate * elapsed
        counted = time - max(self._time, self._config.warmup)
        if counted > 0:
            self._shortfall_steps.append(counted)
            self._unfinished += (self._n_queued + self._n_running) * counted

    def _flush_use(self) -> float:
        """Add the pending integration steps to the batch CPU used, in time order; returns the total."""
        first = self._use_row_first
        if first:
            # A row-wise reduction sums each row exactly as ``ndarray.sum`` sums it alone.
            sums: list[float] = _add_reduce(self._use_rows[: len(first)], axis=1).tolist()
            steps = self._use_steps
            used = self._batch_used
            last = len(first) - 1
            for k in range(last + 1):
                rate = sums[k]
                end = first[k + 1] if k < last else len(steps)
                for elapsed in steps[first[k] : end]:
                    used += rate * elapsed
            self._batch_used = used
            self._batch_use_rate = sums[-1]
            first.clear()
            steps.clear()
        return self._batch_used

    def _work_done(self, indices: np.ndarray) -> np.ndarray:
        """Core-seconds done by the given processes at the current time."""
        listed = indices.tolist()
        state_of = self._state
        state = np.array([state_of[i] for i in listed], dtype=np.int8)
        cpu = self._p_cpu[indices]
        duration = self._p_duration[indices]
        done = np.where(state == _FINISHED, cpu * duration, 0.0)
        running = state == _RUNNING
        if running.any():
            running_listed = indices[running].tolist()
            machine_of = self._machine_of
            target = self._target
            machines = np.array([machine_of[i] for i in running_listed], dtype=np.int64)
            rate = self._rate_array[machines]
            virtual_at = np.array(self._virtual_at)[machines]
            virtual = np.array(self._virtual)[machines] + rate * (self._time - virtual_at)
            progress = virtual - (np.array([target[i] for i in running_listed]) - duration[running])
            done[running] = cpu[running] * np.clip(progress, 0.0, duration[running])
        return done

    def _check_allocation(self, allocation: Allocation) -> None:
        if not isinstance(allocation, Allocation):
            raise TypeError(f"expected an Allocation, got {allocation!r}")
        count = len(self._cpu_list)
        if len(allocation.online_quota) != count:
            raise ValueError(
                f"the allocation gives {len(allocation.online_quota)} online quota values, "
                f"but the flow has {count} machine(s)"
            )


def _restored_simulator(flow: ProcessFlow, config: SimulatorConfig, state: dict[str, object]) -> ClusterSimulator:
    """A :class:`ClusterSimulator` from the state its ``__reduce__`` gives."""
    simulator = ClusterSimulator(flow, config)
    for name, value in state.items():
        setattr(simulator, name, value)
    return simulator
