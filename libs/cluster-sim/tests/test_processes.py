"""Tests of the process flow: validation messages, immutability and the synthetic generator."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from cluster_sim import BatchProcess, DemandSample, Machine, ProcessFlow, synthetic_process_flow


def _machine(name: str = "m0", cpu: float = 8, memory: float = 32, online_memory: float = 8) -> Machine:
    return Machine(name, cpu=cpu, memory=memory, online_memory=online_memory)


def _process(name: str = "p", release: float = 0, cpu: float = 1, memory: float = 1) -> BatchProcess:
    return BatchProcess(name, release=release, cpu=cpu, memory=memory, duration=10, estimate=10)


def test_flow_is_immutable() -> None:
    flow = ProcessFlow(machines=[_machine()], processes=[_process()], horizon=10)
    assert isinstance(flow.machines, tuple) and isinstance(flow.processes, tuple)
    with pytest.raises(dataclasses.FrozenInstanceError):
        flow.horizon = 20  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        flow.processes[0].cpu = 2  # type: ignore[misc]


def test_estimate_defaults_to_duration_and_work_is_cpu_times_duration() -> None:
    process = BatchProcess("p", release=0, cpu=2.5, memory=1, duration=40)
    assert process.estimate == 40
    assert process.work == 100


def test_process_larger_than_every_machine_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"process 'huge'.*larger than every machine"):
        ProcessFlow(machines=[_machine(cpu=8)], processes=[_process("huge", cpu=9)], horizon=10)
    # Memory counts only what online work leaves: 32 - 8 = 24.
    with pytest.raises(ValueError, match=r"process 'fat'.*larger than every machine"):
        ProcessFlow(machines=[_machine()], processes=[_process("fat", memory=25)], horizon=10)
    # CPU fits one machine and memory the other, but no single machine fits both.
    with pytest.raises(ValueError, match="process 'split'"):
        ProcessFlow(
            machines=[_machine("a", cpu=16, memory=8, online_memory=0), _machine("b", cpu=4, memory=64)],
            processes=[_process("split", cpu=12, memory=30)],
            horizon=10,
        )


def test_demand_sample_for_a_missing_machine_is_refused() -> None:
    with pytest.raises(ValueError, match=r"demand sample 1 \(t=5.0\).*machine index 1 does not exist"):
        ProcessFlow(
            machines=[_machine()],
            demand=[DemandSample(0, cpu=(1,)), DemandSample(5, cpu=(1, 2))],
            horizon=10,
        )
    with pytest.raises(ValueError, match="machine 'b' has no value"):
        ProcessFlow(machines=[_machine("a"), _machine("b")], demand=[DemandSample(0, cpu=(1,))], horizon=10)


def test_negative_times_are_refused() -> None:
    with pytest.raises(ValueError, match=r"process 'early': release must not be negative"):
        ProcessFlow(machines=[_machine()], processes=[_process("early", release=-1)], horizon=10)
    with pytest.raises(ValueError, match=r"demand sample 0 \(t=-2.0\): time must not be negative"):
        ProcessFlow(machines=[_machine()], demand=[DemandSample(-2, cpu=(1,))], horizon=10)
    with pytest.raises(ValueError, match="horizon must be positive"):
        ProcessFlow(machines=[_machine()], horizon=-5)


def test_samples_out_of_order_are_refused() -> None:
    with pytest.raises(ValueError, match=r"demand sample 2 \(t=10.0\) is out of order.*sample 1 \(t=20.0\)"):
        ProcessFlow(
            machines=[_machine()],
            demand=[DemandSample(0, cpu=(1,)), DemandSample(20, cpu=(1,)), DemandSample(10, cpu=(1,))],
            horizon=30,
        )
    with pytest.raises(ValueError, match="out of order"):
        ProcessFlow(machines=[_machine()], demand=[DemandSample(5, cpu=(1,)), DemandSample(5, cpu=(2,))], horizon=30)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: ProcessFlow(machines=[_machine(), _machine()], horizon=1), "machine 'm0' appears twice"),
        (
            lambda: ProcessFlow(machines=[_machine()], processes=[_process(), _process()], horizon=1),
            "'p' appears twice",
        ),
        (lambda: ProcessFlow(machines=[], horizon=1), "at least one machine"),
        (lambda: _machine(cpu=0), "machine 'm0': cpu must be positive"),
        (lambda: _machine(online_memory=40), "machine 'm0': online_memory"),
        (lambda: BatchProcess("z", release=0, cpu=1, memory=1, duration=float("nan")), "process 'z': duration"),
        (
            lambda: ProcessFlow(machines=[_machine()], demand=[DemandSample(0, cpu=(-1,))], horizon=1),
            "demand of machine 'm0' is negative",
        ),
        (
            lambda: ProcessFlow(
                machines=[_machine()], processes=[BatchProcess("d", release=0, cpu=1, memory=1, duration=0)], horizon=1
            ),
            "process 'd': duration must be positive",
        ),
    ],
)
def test_other_invalid_flows_name_the_offending_item(build, message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=message):
        build()


def test_lookup_by_name() -> None:
    flow = ProcessFlow(machines=[_machine()], processes=[_process("a"), _process("b")], horizon=10)
    assert flow.process("b").name == "b"
    with pytest.raises(KeyError, match="no process named 'c'"):
        flow.process("c")


def test_synthetic_flow_is_reproducible_and_valid() -> None:
    first = synthetic_process_flow(seed=3, machines=4, horizon=3600)
    again = synthetic_process_flow(seed=3, machines=4, horizon=3600)
    other = synthetic_process_flow(seed=4, machines=4, horizon=3600)
    assert first == again
    assert first != other
    assert len(first.machines) == 4 and len(first.processes) > 0
    releases = np.array([p.release for p in first.processes])
    assert releases.min() >= 0 and releases.max() < first.horizon
    demand = np.array([s.cpu for s in first.demand])
    assert demand.min() >= 0 and demand.max() <= 32
    assert [s.time for s in first.demand] == sorted(s.time for s in first.demand)
    assert "seed=3" in first.provenance


def test_synthetic_flow_takes_an_injected_generator() -> None:
    a = synthetic_process_flow(machines=2, horizon=600, rng=np.random.default_rng(11))
    b = synthetic_process_flow(machines=2, horizon=600, rng=np.random.default_rng(11))
    assert a.processes == b.processes and a.demand == b.demand
    assert len(synthetic_process_flow(seed=1, machines=3, processes=50, horizon=600).processes) == 50
