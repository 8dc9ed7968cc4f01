"""Property tests on random flows and random allocation sequences (hypothesis)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
from cluster_sim import (
    Allocation,
    BatchProcess,
    ClusterSimulator,
    DemandSample,
    Machine,
    ProcessFlow,
    ProcessState,
    SimulationObservation,
    SimulatorConfig,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

TOL = 1e-7


@dataclass(frozen=True)
class Case:
    flow: ProcessFlow
    config: SimulatorConfig
    allocations: tuple[Allocation, ...]


@st.composite
def cases(draw: st.DrawFn) -> Case:
    count = draw(st.integers(1, 4))
    machines = []
    for j in range(count):
        cpu = draw(st.sampled_from([2.0, 4.0, 8.0, 16.0]))
        memory = draw(st.sampled_from([8.0, 16.0, 64.0]))
        online = draw(st.sampled_from([0.0, 0.25, 0.5])) * memory
        machines.append(Machine(f"m{j}", cpu, memory, online))
    processes = []
    for i in range(draw(st.integers(0, 30))):
        host = machines[draw(st.integers(0, count - 1))]  # the process fits this machine at least
        processes.append(
            BatchProcess(
                f"p{i}",
                release=draw(st.floats(0, 250, allow_nan=False).map(lambda x: round(x, 2))),
                cpu=draw(
                    st.sampled_from([0.25, 0.5, 1.0, 2.0, 3.0, 8.0, 16.0]).filter(lambda c, cap=host.cpu: c <= cap)
                ),
                memory=draw(st.floats(0, host.batch_memory)),
                duration=draw(st.floats(0.5, 120)),
                estimate=draw(st.floats(0, 200)),
            )
        )
    times = sorted(draw(st.sets(st.integers(0, 300), max_size=12)))
    demand = tuple(DemandSample(float(t), tuple(draw(st.floats(0, m.cpu * 1.2)) for m in machines)) for t in times)
    horizon = draw(st.sampled_from([60.0, 150.0, 400.0]))
    config = SimulatorConfig(
        control_interval=draw(st.sampled_from([10.0, 60.0])),
        actuation_delay=draw(st.sampled_from([0.0, 7.5])),
        borrowing=draw(st.booleans()),
        aging_limit=draw(st.sampled_from([None, 0.0, 30.0])),
    )
    allocations = tuple(
        Allocation(
            tuple(draw(st.floats(0, 1.3)) * m.cpu for m in machines),
            draw(st.sampled_from(["fifo", "shortest_estimate", "dominant_share"])),
            draw(st.sampled_from([0.75, 1.0])),
        )
        for _ in range(draw(st.integers(0, 8)))
    )
    return Case(ProcessFlow(tuple(machines), tuple(processes), demand, horizon), config, allocations)


def _run(case: Case) -> tuple[ClusterSimulator, list[SimulationObservation]]:
    simulator = ClusterSimulator(case.flow, case.config)
    seen: list[SimulationObservation] = [simulator.observe()]
    k = 0
    while not simulator.done:
        if k < len(case.allocations):
            simulator.submit(case.allocations[k])
        k += 1
        seen.append(simulator.advance(simulator.time + case.config.control_interval, on_event=seen.append))
    return simulator, seen


PROPERTY_SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPERTY_SETTINGS
@given(cases())
def test_starts_respect_release_and_memory(case: Case) -> None:
    simulator, _ = _run(case)
    flow = case.flow
    statuses = [simulator.status(p.name) for p in flow.processes]
    end = simulator.time
    for process, status in zip(flow.processes, statuses, strict=True):
        if status.start is None:
            continue
        assert status.start >= process.release
        machine = next(m for m in flow.machines if m.name == status.machine)
        # Memory held at the instant it started, by processes started earlier and not yet finished.
        held = sum(
            other.memory
            for other, s in zip(flow.processes, statuses, strict=True)
            if s.machine == machine.name
            and s is not status
            and s.start is not None
            and (s.start, flow.index_of(other.name)) <= (status.start, flow.index_of(process.name))
            and (s.finish if s.finish is not None else end + 1) > status.start
        )
        assert held + process.memory <= machine.batch_memory + TOL


@PROPERTY_SETTINGS
@given(cases())
def test_work_and_capacity_invariants(case: Case) -> None:
    simulator, seen = _run(case)
    flow = case.flow
    cpu = np.array([m.cpu for m in flow.machines])
    batch_memory = np.array([m.batch_memory for m in flow.machines])
    used = 0.0  # core-seconds, integrating the observed CPU in use between event times
    for before, after in itertools.pairwise(seen):
        used += float(before.batch_cpu_in_use.sum()) * (after.time - before.time)
    for observation in seen:
        assert np.all(observation.batch_memory_in_use <= batch_memory + TOL)
        assert np.all(observation.online_quota <= cpu + TOL)
        assert np.all(observation.batch_cpu_in_use <= observation.batch_cpu_requested + TOL)
        if case.config.borrowing:
            assert np.all(
                observation.batch_cpu_in_use <= cpu - np.minimum(observation.online_quota, observation.demand) + TOL
            )
        else:
            assert np.all(observation.batch_cpu_in_use <= cpu - observation.online_quota + TOL)
    report = simulator.report()
    assert abs(used - report.completed_work) <= 1e-6 * max(1.0, report.completed_work)
    for process in flow.processes:
        status = simulator.status(process.name)
        if status.state is ProcessState.FINISHED:
            assert status.work_done == process.cpu * process.duration
            assert status.finish - status.start >= process.duration * (1 - 1e-9)
        else:
            assert status.work_done <= process.cpu * process.duration + TOL
        if status.state is not ProcessState.UNRELEASED and process.release < flow.horizon:
            assert status.state in (ProcessState.FINISHED, ProcessState.CENSORED)
    assert report.finished + report.unfinished + report.unreleased == len(flow.processes)
