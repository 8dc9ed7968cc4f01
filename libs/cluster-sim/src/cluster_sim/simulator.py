"""The event-driven physics: queueing, placement, CPU sharing, memory, time and cost accounting."""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from cluster_sim.allocation import Allocation, QueueOrder
from cluster_sim.models import (
    CostBreakdown,
    ProcessState,
    ProcessStatus,
    QueueRow,
    SimulationObservation,
    SimulationReport,
)
from cluster_sim.processes import ProcessFlow

__all__ = ["ClusterSimulator", "SimulatorConfig"]

# Event priorities: at equal times, completions free resources first, then a delayed allocation
# takes effect, then demand changes, then releases; one placement pass follows all of them.
_COMPLETION = 0
_ALLOCATION = 1
_DEMAND = 2
_RELEASE = 3

_UNRELEASED = 0
_QUEUED = 1
_RUNNING = 2
_FINISHED = 3

# Absolute slack for comparisons of sums of cores and memory, which accumulate rounding.
_TOL = 1e-9


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


class ClusterSimulator:
    """Discrete-event simulator of one :class:`ProcessFlow` under submitted allocations.

    The simulator jumps between exact event times (releases, demand samples, delayed allocations,
    completions and the time asked for by :meth:`advance`). Events live in one heap keyed by
    ``(time, priority, sequence)`` so equal times resolve the same way on every run. Each machine
    keeps a virtual clock of "full-speed seconds": every process on a machine progresses at the
    same fraction of its CPU request, so a process finishes when its machine's virtual clock has
    advanced by its duration, and a rate change reschedules one event per machine.

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
        machines = flow.machines
        processes = flow.processes
        m_count = len(machines)
        n = len(processes)
        self._cpu = np.array([m.cpu for m in machines], dtype=float)  # cores
        self._batch_memory = np.array([m.batch_memory for m in machines], dtype=float)
        self._p_release = np.array([p.release for p in processes], dtype=float)  # s
        self._p_cpu = np.array([p.cpu for p in processes], dtype=float)  # cores
        self._p_memory = np.array([p.memory for p in processes], dtype=float)
        self._p_duration = np.array([p.duration for p in processes], dtype=float)  # s
        self._p_estimate = np.array([p.estimate for p in processes], dtype=float)  # s
        index = np.arange(n)
        total_memory = float(self._batch_memory.sum())
        share = np.maximum(
            self._p_cpu / float(self._cpu.sum()),
            self._p_memory / total_memory if total_memory > 0 else 0.0,
        )
        self._orders = {
            QueueOrder.FIFO: np.lexsort((index, self._p_release)),
            QueueOrder.SHORTEST_ESTIMATE: np.lexsort((index, self._p_release, self._p_estimate)),
            QueueOrder.DOMINANT_SHARE: np.lexsort((index, self._p_release, share)),
        }
        self._fifo = self._orders[QueueOrder.FIFO]
        self._fifo_release = self._p_release[self._fifo]
        self._fifo_pointer = 0

        self._state = np.zeros(n, dtype=np.int8)
        self._queued = np.zeros(n, dtype=bool)
        self._machine_of = np.full(n, -1, dtype=np.int64)
        self._start = np.full(n, np.nan)
        self._finish = np.full(n, np.nan)
        self._target = np.zeros(n)  # the machine's virtual clock value at which the process is done

        self._demand_samples = np.array([s.cpu for s in flow.demand], dtype=float).reshape(len(flow.demand), m_count)
        self._demand = np.zeros(m_count)  # cores
        self._quota = np.zeros(m_count)  # cores
        self._requested = np.zeros(m_count)  # cores requested by running processes
        self._memory_used = np.zeros(m_count)
        self._virtual = np.zeros(m_count)  # full-speed seconds elapsed on the machine
        self._virtual_at = np.zeros(m_count)  # time at which _virtual was last brought up to date
        self._rate = np.ones(m_count)  # fraction of its request each running process gets
        self._version = np.zeros(m_count, dtype=np.int64)
        self._scheduled: list[tuple[float, float | None] | None] = [None] * m_count
        self._running: list[list[tuple[float, int]]] = [[] for _ in range(m_count)]
        self._changed: set[int] = set()  # machines whose batch budget or requested CPU changed
        self._touched: set[int] = set()  # machines whose set of running processes changed
        self._dirty = False

        self._order = QueueOrder.FIFO
        self._fraction = 1.0
        self._time = 0.0
        self._n_released = 0
        self._n_queued = 0
        self._n_running = 0
        self._n_finished = 0
        self._queued_cpu = 0.0
        self._shortfall_rate = 0.0  # cores
        self._batch_use_rate = 0.0  # cores
        self._shortfall = 0.0  # core-seconds after the warm-up
        self._unfinished = 0.0  # process-seconds after the warm-up
        self._quota_change = 0.0  # cores after the warm-up
        self._batch_used = 0.0  # core-seconds
        self._events = 0

        heap: list[tuple[float, int, int, object]] = []
        for i in self._fifo.tolist():
            heap.append((float(self._p_release[i]), _RELEASE, len(heap), i))
        for k, sample in enumerate(flow.demand):
            heap.append((sample.time, _DEMAND, len(heap), k))
        heapq.heapify(heap)
        self._heap = heap
        self._sequence = len(heap)

        if initial_allocation is None:
            first = flow.demand[0].cpu if flow.demand and flow.demand[0].time == 0 else (0.0,) * m_count
            initial_allocation = Allocation(tuple(min(d, c) for d, c in zip(first, self._cpu, strict=True)))
        self._check_allocation(initial_allocation)
        self._quota = np.minimum(np.array(initial_allocation.online_quota, dtype=float), self._cpu)
        self._order = QueueOrder(initial_allocation.queue_order)
        self._fraction = initial_allocation.admission_fraction
        self._shortfall_rate = float(np.maximum(self._demand - self._quota, 0.0).sum())

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
        while heap and heap[0][0] <= target:
            now = heap[0][0]
            self._integrate(now)
            self._time = now
            handled = self._events
            while heap and heap[0][0] == now:
                _, kind, _, payload = heapq.heappop(heap)
                if kind == _COMPLETION:
                    self._complete(*payload)  # type: ignore[misc]
                elif kind == _ALLOCATION:
                    self._apply(payload)  # type: ignore[arg-type]
                elif kind == _DEMAND:
                    self._set_demand(payload)  # type: ignore[arg-type]
                else:
                    self._release(payload)  # type: ignore[arg-type]
            if self._events == handled:
                continue  # only superseded completions were due
            if self._dirty:
                self._schedule()
            self._update_rates()
            if on_event is not None:
                on_event(self.observe(queue_rows=0))
        self._integrate(target)
        self._time = target
        return self.observe(queue_rows=queue_rows)

    def observe(self, *, queue_rows: int = 16) -> SimulationObservation:
        """The cluster at the current time, without advancing."""
        rows: tuple[QueueRow, ...] = ()
        if queue_rows > 0 and self._n_queued:
            order = self._orders[self._order]
            waiting = order[self._queued[order]][:queue_rows]
            processes = self._flow.processes
            rows = tuple(
                QueueRow(
                    processes[i].name,
                    processes[i].cpu,
                    processes[i].memory,
                    processes[i].estimate,
                    self._time - processes[i].release,
                )
                for i in waiting.tolist()
            )
        return SimulationObservation(
            time=self._time,
            demand=self._demand.copy(),
            online_quota=self._quota.copy(),
            batch_budget=self._budget(),
            batch_cpu_requested=self._requested.copy(),
            batch_cpu_in_use=self._requested * self._rate,
            batch_memory_in_use=self._memory_used.copy(),
            queued=self._n_queued,
            running=self._n_running,
            finished=self._n_finished,
            unreleased=len(self._flow.processes) - self._n_released,
            queued_cpu=max(self._queued_cpu, 0.0),
            queue=rows,
        )

    def status(self, name: str) -> ProcessStatus:
        """The state of process ``name`` at the current time.

        Raises:
            KeyError: If the flow has no such process.
        """
        i = self._flow.index_of(name)
        state = int(self._state[i])
        work = self._p_cpu[i] * self._p_duration[i]
        done = float(self._work_done(np.array([i]))[0])
        machine = int(self._machine_of[i])
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
        released = self._state != _UNRELEASED
        work = self._p_cpu * self._p_duration
        done = self._work_done(np.flatnonzero(released))
        unfinished = (self._state == _QUEUED) | (self._state == _RUNNING)
        end = np.where(np.isnan(self._finish), self._time, self._finish)
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
            batch_cpu_used=float(self._batch_used),
            events=self._events,
            costs=self.costs(),
        )

    def costs(self) -> CostBreakdown:
        """The cost terms so far (the ``costs`` of :meth:`report`, without the other totals)."""
        config = self._config
        shortfall = config.shortfall_weight * self._shortfall
        unfinished = config.unfinished_weight * self._unfinished
        change = config.quota_change_weight * self._quota_change
        return CostBreakdown(
            float(self._shortfall),
            float(self._unfinished),
            float(self._quota_change),
            float(shortfall),
            float(unfinished),
            float(change),
            float(shortfall + unfinished + change),
        )

    # Events ---------------------------------------------------------------------------------

    def _push(self, time: float, priority: int, payload: object) -> None:
        heapq.heappush(self._heap, (time, priority, self._sequence, payload))
        self._sequence += 1

    def _release(self, i: int) -> None:
        self._events += 1
        self._state[i] = _QUEUED
        self._queued[i] = True
        self._n_released += 1
        self._n_queued += 1
        self._queued_cpu += self._p_cpu[i]
        self._dirty = True

    def _set_demand(self, k: int) -> None:
        self._events += 1
        demand = self._demand_samples[k]
        if self._config.borrowing:
            self._changed.update(np.flatnonzero(demand != self._demand).tolist())
            self._dirty = True
        self._demand = demand.copy()
        self._shortfall_rate = float(np.maximum(self._demand - self._quota, 0.0).sum())

    def _apply(self, allocation: Allocation) -> None:
        self._events += 1
        quota = np.minimum(np.array(allocation.online_quota, dtype=float), self._cpu)
        if self._time >= self._config.warmup:
            self._quota_change += float(np.abs(quota - self._quota).sum())
        self._quota = quota
        self._order = QueueOrder(allocation.queue_order)
        self._fraction = allocation.admission_fraction
        self._shortfall_rate = float(np.maximum(self._demand - self._quota, 0.0).sum())
        self._changed.update(range(len(self._cpu)))
        self._dirty = True

    def _complete(self, j: int, version: int) -> None:
        if version != self._version[j]:
            return  # superseded: the machine's rate or next completion changed since it was scheduled
        self._events += 1
        self._catch_up(j)
        virtual = self._virtual[j]
        slack = 1e-9 * max(1.0, abs(virtual))
        running = self._running[j]
        first = True
        while running and (first or running[0][0] <= virtual + slack):
            first = False
            _, i = heapq.heappop(running)
            self._state[i] = _FINISHED
            self._finish[i] = self._time
            self._requested[j] -= self._p_cpu[i]
            self._memory_used[j] -= self._p_memory[i]
            self._n_running -= 1
            self._n_finished += 1
        if not running:
            # Reset exactly so rounding does not accumulate over a long run.
            self._requested[j] = 0.0
            self._memory_used[j] = 0.0
        self._changed.add(j)
        self._touched.add(j)
        self._dirty = True

    # Placement and rates --------------------------------------------------------------------

    def _budget(self) -> np.ndarray:
        if self._config.borrowing:
            return self._cpu - np.minimum(self._quota, self._demand)
        return self._cpu - self._quota

    def _schedule(self) -> None:
        self._dirty = False
        if self._n_queued == 0:
            return
        budget = self._budget()
        admitted = self._fraction * budget
        free_cpu = admitted - self._requested
        free_memory = self._batch_memory - self._memory_used
        p_cpu = self._p_cpu
        p_memory = self._p_memory
        limit = self._config.aging_limit
        if limit is not None:
            fifo = self._fifo
            pointer = self._fifo_pointer
            while pointer < len(fifo) and self._state[fifo[pointer]] >= _RUNNING:
                pointer += 1
            self._fifo_pointer = pointer
            end = int(np.searchsorted(self._fifo_release, self._time - limit, side="right"))
            if end > pointer:
                aged = fifo[pointer:end]
                for i in aged[self._queued[aged]].tolist():
                    feasible = (admitted >= p_cpu[i] - _TOL) & (self._batch_memory >= p_memory[i] - _TOL)
                    if not feasible.any():
                        continue  # cannot start under the current budgets even on an empty machine
                    if self._place(i, free_cpu, free_memory):
                        continue
                    # Reserve the feasible machine closest to fitting it: nothing younger starts there,
                    # so it drains until the oldest process fits (other machines keep working).
                    shortage = np.maximum(p_cpu[i] - free_cpu, 0.0) / self._cpu + np.maximum(
                        p_memory[i] - free_memory, 0.0
                    ) / np.maximum(self._batch_memory, _TOL)
                    shortage[~feasible] = np.inf
                    free_cpu[int(np.argmin(shortage))] = -np.inf
                    break
        order = self._orders[self._order]
        max_cpu = free_cpu.max()
        max_memory = free_memory.max()
        candidates = order[
            self._queued[order] & (p_cpu[order] <= max_cpu + _TOL) & (p_memory[order] <= max_memory + _TOL)
        ]
        for i in candidates.tolist():
            if p_cpu[i] > max_cpu + _TOL or p_memory[i] > max_memory + _TOL:
                continue
            if self._place(i, free_cpu, free_memory):
                max_cpu = free_cpu.max()
                max_memory = free_memory.max()

    def _place(self, i: int, free_cpu: np.ndarray, free_memory: np.ndarray) -> bool:
        cpu = self._p_cpu[i]
        memory = self._p_memory[i]
        fits = np.flatnonzero((free_cpu >= cpu - _TOL) & (free_memory >= memory - _TOL))
        if fits.size == 0:
            return False
        if fits.size == 1:
            j = int(fits[0])
        else:
            # Best fit: least CPU left over, then least memory left over, then the lowest index
            # (lexsort is stable); rounding keeps float noise from breaking genuine ties.
            cpu_left = np.round(free_cpu[fits] - cpu, 9)
            memory_left = np.round(free_memory[fits] - memory, 9)
            j = int(fits[np.lexsort((memory_left, cpu_left))[0]])
        self._catch_up(j)
        target = self._virtual[j] + self._p_duration[i]
        heapq.heappush(self._running[j], (target, i))
        self._state[i] = _RUNNING
        self._queued[i] = False
        self._machine_of[i] = j
        self._start[i] = self._time
        self._target[i] = target
        self._requested[j] += cpu
        self._memory_used[j] += memory
        free_cpu[j] -= cpu
        free_memory[j] -= memory
        self._n_queued -= 1
        self._n_running += 1
        self._queued_cpu = self._queued_cpu - cpu if self._n_queued else 0.0
        self._changed.add(j)
        self._touched.add(j)
        return True

    def _catch_up(self, j: int) -> None:
        elapsed = self._time - self._virtual_at[j]
        if elapsed > 0:
            self._virtual[j] += self._rate[j] * elapsed
        self._virtual_at[j] = self._time

    def _update_rates(self) -> None:
        if not self._changed:
            return
        changed = np.fromiter(self._changed, dtype=np.int64, count=len(self._changed))
        available = np.maximum(self._budget()[changed], 0.0)
        requested = self._requested[changed]
        # Proportional slow-down: every process on the machine gets the same fraction of its request.
        rate = np.where(requested <= available + _TOL, 1.0, available / np.where(requested > 0, requested, 1.0))
        old = self._rate[changed]
        moved = changed[rate != old]
        if moved.size:
            # Bring the virtual clocks up to now at the old rates before the rates change.
            self._virtual[moved] += self._rate[moved] * (self._time - self._virtual_at[moved])
            self._virtual_at[moved] = self._time
            self._rate[changed] = rate
        # Only machines whose rate or whose earliest-finishing process changed need a new completion.
        for j in sorted(self._touched.union(moved.tolist())):
            rate_j = float(self._rate[j])
            running = self._running[j]
            top = running[0][0] if running else None
            key = (rate_j, top)
            if key == self._scheduled[j]:
                continue
            self._scheduled[j] = key
            self._version[j] += 1
            if top is not None and rate_j > 0:
                self._catch_up(j)
                finish = float(self._time + max(float(top - self._virtual[j]), 0.0) / rate_j)
                self._push(finish, _COMPLETION, (j, int(self._version[j])))
        self._changed.clear()
        self._touched.clear()
        self._batch_use_rate = float((self._requested * self._rate).sum())

    def _integrate(self, time: float) -> None:
        elapsed = time - self._time
        if elapsed <= 0:
            return
        self._batch_used += self._batch_use_rate * elapsed
        counted = time - max(self._time, self._config.warmup)
        if counted > 0:
            self._shortfall += self._shortfall_rate * counted
            self._unfinished += (self._n_queued + self._n_running) * counted

    def _work_done(self, indices: np.ndarray) -> np.ndarray:
        """Core-seconds done by the given processes at the current time."""
        state = self._state[indices]
        cpu = self._p_cpu[indices]
        duration = self._p_duration[indices]
        done = np.where(state == _FINISHED, cpu * duration, 0.0)
        running = state == _RUNNING
        if running.any():
            machines = self._machine_of[indices[running]]
            virtual = self._virtual[machines] + self._rate[machines] * (self._time - self._virtual_at[machines])
            progress = virtual - (self._target[indices[running]] - duration[running])
            done[running] = cpu[running] * np.clip(progress, 0.0, duration[running])
        return done

    def _check_allocation(self, allocation: Allocation) -> None:
        if not isinstance(allocation, Allocation):
            raise TypeError(f"expected an Allocation, got {allocation!r}")
        count = len(self._cpu)
        if len(allocation.online_quota) != count:
            raise ValueError(
                f"the allocation gives {len(allocation.online_quota)} online quota values, "
                f"but the flow has {count} machine(s)"
            )
