"""Hand-computed scenarios for the simulator's physics, event times, reports and cost terms."""

from __future__ import annotations

import copy
import pickle
import subprocess
import sys

import numpy as np
import pytest
from cluster_sim import (
    Allocation,
    BatchProcess,
    ClusterSimulator,
    DemandSample,
    Machine,
    ProcessFlow,
    ProcessState,
    SimulatorConfig,
    decode_actions,
    synthetic_process_flow,
)


def _flow(machines, processes=(), demand=(), horizon=1000.0) -> ProcessFlow:  # type: ignore[no-untyped-def]
    return ProcessFlow(machines=tuple(machines), processes=tuple(processes), demand=tuple(demand), horizon=horizon)


def _p(name: str, release: float = 0, cpu: float = 1, memory: float = 1, duration: float = 10, estimate=None):  # type: ignore[no-untyped-def]
    return BatchProcess(name, release=release, cpu=cpu, memory=memory, duration=duration, estimate=estimate)


def _sim(flow: ProcessFlow, quota=None, order="fifo", fraction=1.0, **config) -> ClusterSimulator:  # type: ignore[no-untyped-def]
    quota = quota if quota is not None else (0.0,) * len(flow.machines)
    return ClusterSimulator(flow, SimulatorConfig(**config), initial_allocation=Allocation(quota, order, fraction))


def test_readme_example_exact_times_and_costs() -> None:
    flow = ProcessFlow(
        machines=(Machine("machine-0", cpu=8, memory=32, online_memory=8),),
        processes=(
            BatchProcess("process-a", release=0, cpu=4, memory=8, duration=10, estimate=12),
            BatchProcess("process-b", release=15, cpu=2, memory=4, duration=20, estimate=20),
        ),
        demand=(DemandSample(0, cpu=(2,)), DemandSample(30, cpu=(5,))),
        horizon=120,
        provenance="example",
    )
    simulator = ClusterSimulator(flow, SimulatorConfig(actuation_delay=0, warmup=0, borrowing=True))
    simulator.submit(Allocation(online_quota=(3,), queue_order="fifo", admission_fraction=1.0))
    observation = simulator.advance(60)
    a, b = simulator.status("process-a"), simulator.status("process-b")
    assert (a.state, a.start, a.finish, a.work_done) == (ProcessState.FINISHED, 0.0, 10.0, 40.0)
    assert (b.state, b.start, b.finish, b.work_done) == (ProcessState.FINISHED, 15.0, 35.0, 40.0)
    assert observation.online_quota.tolist() == [3.0] and observation.demand.tolist() == [5.0]
    # Borrowing: budget = 8 - min(quota 3, demand 5) = 5.
    assert observation.batch_budget.tolist() == [5.0]
    report = simulator.report()
    assert report.costs.online_shortfall == pytest.approx(2 * 30)  # demand 5 > quota 3 from t=30 to 60
    assert report.costs.unfinished_processes == pytest.approx(10 + 20)
    assert report.costs.quota_change == pytest.approx(1.0)  # initial quota = demand at 0 = 2, then 3
    config = simulator.config
    assert report.costs.total == pytest.approx(
        config.shortfall_weight * 60 + config.unfinished_weight * 30 + config.quota_change_weight * 1
    )
    assert report.restricted_flow_time == pytest.approx(30) and report.completed_work == pytest.approx(80)


def test_proportional_slowdown_when_the_budget_drops() -> None:
    flow = _flow([Machine("m", cpu=8, memory=100)], [_p("a", cpu=4, duration=100), _p("b", cpu=4, duration=100)])
    simulator = _sim(flow)
    simulator.advance(50)
    simulator.submit(Allocation((4.0,), "fifo"))  # batch budget 8 -> 4 while 8 cores are requested
    observation = simulator.advance(50)
    assert observation.batch_cpu_in_use.tolist() == [4.0]
    assert simulator.status("a").work_done == pytest.approx(200)
    simulator.advance(1000)
    for name in "ab":
        status = simulator.status(name)
        # 50 full-speed seconds remain at half speed: 100 more seconds; the required work is unchanged.
        assert status.finish == pytest.approx(150)
        assert status.work_done == pytest.approx(400)


def test_borrowing_shrinks_at_once_when_online_demand_rises() -> None:
    machines = [Machine("m", cpu=8, memory=100)]
    demand = [DemandSample(0, cpu=(0,)), DemandSample(10, cpu=(4,))]
    flow = _flow(machines, [_p("a", cpu=8, duration=20)], demand)
    borrowing = _sim(flow, quota=(4,), borrowing=True)
    assert borrowing.advance(5).batch_cpu_in_use.tolist() == [8.0]
    assert borrowing.advance(10).batch_cpu_in_use.tolist() == [4.0]
    borrowing.advance(100)
    assert borrowing.status("a").finish == pytest.approx(30)  # 10 s at 8 cores, then 10 s of work at half speed
    without = _sim(flow, quota=(4,), borrowing=False)
    without.advance(100)
    assert without.status("a").state is ProcessState.QUEUED  # budget 8 - 4 = 4 < 8 cores


def test_admission_fraction_limits_placement() -> None:
    flow = _flow([Machine("m", cpu=8, memory=100)], [_p("big", cpu=7), _p("small", cpu=6)])
    strict = _sim(flow, fraction=0.75)
    strict.advance(1)
    assert strict.status("big").state is ProcessState.QUEUED  # 7 > 0.75 * 8
    assert strict.status("small").state is ProcessState.RUNNING  # 6 <= 6
    full = _sim(flow, fraction=1.0)
    full.advance(1)
    assert full.status("big").state is ProcessState.RUNNING
    assert full.status("small").state is ProcessState.QUEUED


@pytest.mark.parametrize(
    ("order", "expected"),
    [
        ("fifo", ["x", "y", "z"]),
        ("shortest_estimate", ["x", "z", "y"]),
        ("dominant_share", ["y", "z", "x"]),
    ],
)
def test_queue_orders(order: str, expected: list[str]) -> None:
    # Memory lets one process run at a time. At t=1 x and y wait; z arrives at 1.5 and competes at 11.
    # Dominant shares: x max(1/8, 7/8), y max(1/8, 5/8), z max(6/8, 6/8).
    processes = [
        _p("blocker", release=0, cpu=1, memory=8, duration=1),
        _p("x", release=1, cpu=1, memory=7, duration=10, estimate=15),
        _p("y", release=1, cpu=1, memory=5, duration=10, estimate=20),
        _p("z", release=1.5, cpu=6, memory=6, duration=10, estimate=10),
    ]
    flow = _flow([Machine("m", cpu=8, memory=8)], processes)
    simulator = _sim(flow, order=order, aging_limit=None)
    simulator.advance(1000)
    starts = {name: simulator.status(name).start for name in "xyz"}
    assert sorted(starts, key=lambda name: starts[name]) == expected


def test_best_fit_placement_by_cpu_then_memory_then_index() -> None:
    machines = [
        Machine("roomy", cpu=16, memory=64),
        Machine("tight-a", cpu=4, memory=64),
        Machine("tight-b", cpu=4, memory=16),
        Machine("tight-c", cpu=4, memory=16),
    ]
    flow = _flow(machines, [_p("p", cpu=4, memory=8), _p("q", cpu=4, memory=8)])
    simulator = _sim(flow)
    simulator.advance(1)
    # Both tight machines leave 0 cores; tight-b and tight-c leave less memory; tight-b has the lower index.
    assert simulator.status("p").machine == "tight-b"
    assert simulator.status("q").machine == "tight-c"


def test_memory_is_held_until_completion() -> None:
    flow = _flow(
        [Machine("m", cpu=8, memory=10, online_memory=2)], [_p("a", cpu=1, memory=6), _p("b", cpu=1, memory=6)]
    )
    simulator = _sim(flow)
    observation = simulator.advance(5)
    assert observation.batch_memory_in_use.tolist() == [6.0]
    assert simulator.status("b").state is ProcessState.QUEUED  # 6 + 6 > 10 - 2 although CPU is free
    simulator.advance(100)
    assert simulator.status("b").start == pytest.approx(10)  # starts the instant a completes


def test_aging_guard_stops_younger_processes_overtaking_the_oldest() -> None:
    # Shortest-estimate-first keeps choosing the stream of short processes over the long one.
    stream = [_p(f"s{k:03d}", release=float(k), cpu=2, duration=1.5, estimate=1) for k in range(400)]
    long = _p("long", release=0.5, cpu=4, duration=10, estimate=1000)
    flow = _flow([Machine("m", cpu=4, memory=100)], [_p("first", cpu=2, duration=1), long, *stream])
    starved = _sim(flow, order="shortest_estimate", aging_limit=None)
    starved.advance(1000)
    assert starved.status("long").start > 399  # only once the stream dries up
    guarded = _sim(flow, order="shortest_estimate", aging_limit=60)
    guarded.advance(1000)
    start = guarded.status("long").start
    assert start is not None and 60.5 <= start <= 60.5 + 1.5


def test_aging_reservation_holds_one_machine_only() -> None:
    # "long" fits only the 4-core machine; the 2-core machine keeps serving the stream meanwhile.
    stream = [_p(f"s{k:03d}", release=float(k), cpu=2, duration=1.5, estimate=1) for k in range(200)]
    long = _p("long", release=0.5, cpu=4, duration=10, estimate=1000)
    machines = [Machine("big", cpu=4, memory=100), Machine("small", cpu=2, memory=100)]
    flow = _flow(machines, [_p("first", cpu=2, duration=1), long, *stream])
    starved = _sim(flow, order="shortest_estimate", aging_limit=None)
    starved.advance(1000)
    assert starved.status("long").start == 200.5
    simulator = _sim(flow, order="shortest_estimate", aging_limit=60)
    simulator.advance(1000)
    # Aged at 60.5, "long" reserves "big", which drains by 61.5; s061 (released at 61) is not held
    # back but starts at once on "small".
    assert (simulator.status("long").start, simulator.status("long").machine) == (61.5, "big")
    assert (simulator.status("s061").start, simulator.status("s061").machine) == (61.0, "small")


def test_horizon_truncates_and_censors() -> None:
    flow = _flow(
        [Machine("m", cpu=4, memory=100)],
        [
            _p("done", cpu=2, duration=10),
            _p("running", cpu=2, duration=100),
            _p("queued", cpu=4, release=5),
            _p("late", release=500),
        ],
        horizon=50,
    )
    simulator = _sim(flow)
    observation = simulator.advance(10_000)
    assert observation.time == 50 and simulator.done
    assert simulator.status("done").state is ProcessState.FINISHED
    running, queued = simulator.status("running"), simulator.status("queued")
    assert running.state is ProcessState.CENSORED and queued.state is ProcessState.CENSORED
    assert running.work_done == pytest.approx(100) and running.remaining_work == pytest.approx(100)
    assert simulator.status("late").state is ProcessState.UNRELEASED
    report = simulator.report()
    assert (report.finished, report.unfinished, report.unreleased) == (1, 2, 1)
    assert report.remaining_work == pytest.approx(100 + 40)  # running 200 - 100 done; queued 4 × 10
    assert report.restricted_flow_time == pytest.approx(10 + 50 + 45)


def test_actuation_delay_and_quota_cap() -> None:
    flow = _flow([Machine("m", cpu=8, memory=100)], demand=[DemandSample(0, cpu=(6,))])
    simulator = ClusterSimulator(flow, SimulatorConfig(actuation_delay=5))
    assert simulator.advance(0).online_quota.tolist() == [6.0]  # initial quota = demand at time 0
    assert simulator.submit(Allocation((20.0,), "fifo")) == 5
    assert simulator.advance(4.999).online_quota.tolist() == [6.0]
    assert simulator.advance(5).online_quota.tolist() == [8.0]  # capped at capacity
    assert simulator.report().costs.quota_change == pytest.approx(2.0)


def test_warmup_is_not_counted() -> None:
    flow = _flow([Machine("m", cpu=8, memory=100)], demand=[DemandSample(0, cpu=(6,))], horizon=100)
    simulator = ClusterSimulator(flow, SimulatorConfig(warmup=30), initial_allocation=Allocation((4.0,), "fifo"))
    simulator.advance(100)
    assert simulator.report().costs.online_shortfall == pytest.approx(2 * 70)


def test_events_happen_at_exact_times() -> None:
    flow = _flow(
        [Machine("m", cpu=4, memory=100)],
        [_p("a", release=3.25, cpu=4, duration=7.5), _p("b", release=4, cpu=1, duration=2)],
        demand=[DemandSample(0, cpu=(0,)), DemandSample(12.5, cpu=(1,))],
    )
    simulator = ClusterSimulator(flow, SimulatorConfig(actuation_delay=1.5))
    times: list[float] = []
    simulator.advance(2, on_event=lambda o: times.append(o.time))
    simulator.submit(Allocation((2.0,), "fifo"))
    simulator.advance(60, on_event=lambda o: times.append(o.time))
    # demand at 0, a released 3.25, allocation 3.5 (quota 2: a slows to half), b released 4 (no room),
    # a: 0.25 s at full speed then 7.25 s of work at half speed -> 18; b then runs 18..20. The
    # superseded completion of a at 10.75 is not an event.
    assert times == [0, 3.25, 3.5, 4, 12.5, 18, 20]
    assert all(type(t) is float for t in times)
    assert simulator.status("a").finish == 18
    assert simulator.status("b").start == 18 and simulator.status("b").finish == 20


def test_same_flow_and_allocations_give_the_same_run() -> None:
    flow = synthetic_process_flow(seed=5, machines=4, horizon=3600)

    def run() -> tuple[object, list[object]]:
        simulator = ClusterSimulator(flow, SimulatorConfig(borrowing=True))
        for k in range(60):
            demand = simulator.observe().demand
            simulator.submit(
                Allocation(tuple(np.minimum(demand + 3.2 * (k % 3), 32)), ("fifo", "dominant_share")[k % 2])
            )
            simulator.advance((k + 1) * 60)
        return simulator.report(), [simulator.status(p.name) for p in flow.processes]

    assert run() == run()


def test_misuse_is_refused() -> None:
    flow = _flow([Machine("m", cpu=4, memory=100)], [_p("a")])
    simulator = ClusterSimulator(flow)
    simulator.advance(10)
    with pytest.raises(ValueError, match="already at t=10"):
        simulator.advance(5)
    with pytest.raises(ValueError, match="2 online quota values, but the flow has 1 machine"):
        simulator.submit(Allocation((1.0, 1.0), "fifo"))
    with pytest.raises(KeyError, match="'nope'"):
        simulator.status("nope")


def test_core_does_not_import_the_adapters() -> None:
    code = (
        "import sys, cluster_sim, cluster_sim.alibaba; "
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('gymnasium', 'pettingzoo')); "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    ("blocked", "code"),
    [
        (
            ("gymnasium", "pettingzoo", "matplotlib"),
            "import cluster_sim, cluster_sim.alibaba, cluster_sim.plot, cluster_sim.envs",
        ),
        (("pettingzoo",), "from cluster_sim.envs import ClusterEnv; ClusterEnv"),
    ],
)
def test_optional_extras_are_optional(blocked: tuple[str, ...], code: str) -> None:
    # A None entry in sys.modules makes any import of that package fail, as if it were not installed.
    prelude = "import sys; " + "; ".join(f"sys.modules[{name!r}] = None" for name in blocked) + "; "
    result = subprocess.run([sys.executable, "-c", prelude + code], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    missing = subprocess.run(
        [sys.executable, "-c", prelude + "from cluster_sim.envs import ClusterParallelEnv"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert missing.returncode != 0 and "pettingzoo" in missing.stderr


def test_a_copy_mid_run_continues_as_the_original() -> None:
    # The per-machine arrays have numpy views; a copy must make its own views of its own arrays.
    flow = synthetic_process_flow(seed=5, machines=6, processes=300, horizon=2 * 3600.0)
    config = SimulatorConfig(borrowing=True)
    original = ClusterSimulator(flow, config)
    observation = original.advance(0)
    for _ in range(40):
        original.submit(decode_actions(1, 3, observation.demand, flow.machines))
        observation = original.advance(original.time + config.control_interval)
    copies = [copy.deepcopy(original), pickle.loads(pickle.dumps(original))]
    for simulator in [original, *copies]:
        observation = simulator.observe()
        while not simulator.done:
            simulator.submit(decode_actions(2, 5, observation.demand, flow.machines))
            observation = simulator.advance(simulator.time + config.control_interval)
    expected = original.report()
    assert expected.finished > 0
    for simulator in copies:
        assert simulator.report() == expected
        np.testing.assert_array_equal(simulator.observe().batch_cpu_in_use, original.observe().batch_cpu_in_use)


def test_the_observation_built_by_its_slots_is_the_dataclass() -> None:
    from dataclasses import FrozenInstanceError, fields

    from cluster_sim.models import SimulationObservation, new_observation

    arrays = [np.full(2, float(k)) for k in range(6)]
    values = (12.5, *arrays, 3, 4, 5, 6, 7.25, ())
    built, constructed = new_observation(*values), SimulationObservation(*values)
    assert [getattr(built, f.name) for f in fields(built)] == [getattr(constructed, f.name) for f in fields(built)]
    assert all(getattr(built, f.name) is value for f, value in zip(fields(built), values, strict=True))
    with pytest.raises(FrozenInstanceError):
        built.time = 0.0  # type: ignore[misc]
