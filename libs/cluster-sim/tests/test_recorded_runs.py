"""Runs pinned bit for bit: the simulator must give exactly the figures it gave when these were recorded.

The digests were recorded with the simulator as it was before its queue, placement and rate
bookkeeping became incremental (commit 4dfa125); changing only the cost of an event must leave them
as they are. The cases of the 100-machine flow, of the second overloaded flow and of the plain
borrowing and warm-up configurations were recorded with the simulator of commit a4ebb54, before the
shortcuts taken while nothing is queued (issue 16): at 100 machines below saturation most events take
them. A deliberate change of the physics changes them: then record them again with
``python libs/cluster-sim/tests/test_recorded_runs.py`` and say why in the commit.
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Callable

import numpy as np
import pytest
from cluster_sim import (
    Allocation,
    ClusterSimulator,
    ProcessFlow,
    SimulationObservation,
    SimulatorConfig,
    decode_actions,
    synthetic_process_flow,
)

Policy = Callable[[int, SimulationObservation, ProcessFlow], Allocation]


def _constant(step: int, observation: SimulationObservation, flow: ProcessFlow) -> Allocation:
    return decode_actions(1, 3, observation.demand, flow.machines)


def _varied(step: int, observation: SimulationObservation, flow: ProcessFlow) -> Allocation:
    # Every queue order, both admissions and all three margins, changing at irregular steps.
    return decode_actions(step % 3, (step * 7 + step // 5) % 6, observation.demand, flow.machines)


def _observed(observation: SimulationObservation) -> tuple[object, ...]:
    arrays = (
        observation.demand,
        observation.online_quota,
        observation.batch_budget,
        observation.batch_cpu_requested,
        observation.batch_cpu_in_use,
        observation.batch_memory_in_use,
    )
    return (
        observation.time,
        tuple(np.asarray(a, dtype=float).tobytes() for a in arrays),
        observation.queued,
        observation.running,
        observation.finished,
        observation.unreleased,
        float(observation.queued_cpu),
        observation.queue,
    )


def run_digest(simulator: type[ClusterSimulator], flow: ProcessFlow, config: SimulatorConfig, policy: Policy) -> str:
    """SHA-256 of everything a user can read from one run: each step's and event's observation, every
    process's final status and the final report."""
    sim = simulator(flow, config)
    seen: list[tuple[object, ...]] = []
    observation = sim.advance(0, queue_rows=8)
    step = 0
    while not sim.done:
        sim.submit(policy(step, observation, flow))
        observation = sim.advance(
            sim.time + config.control_interval, queue_rows=8, on_event=lambda o: seen.append(_observed(o))
        )
        seen.append(_observed(observation))
        step += 1
    record = (seen, [sim.status(p.name) for p in flow.processes], sim.report())
    return hashlib.sha256(repr(record).encode()).hexdigest()


FLOWS = {
    "seed7-8m": lambda: synthetic_process_flow(seed=7, horizon=3 * 3600.0),
    "seed3-20m": lambda: synthetic_process_flow(seed=3, machines=20, processes=1500, horizon=4 * 3600.0),
    # More work than the cluster can do: a long queue, the aging guard reserving machines.
    "seed11-overloaded": lambda: synthetic_process_flow(seed=11, machines=6, horizon=3 * 3600.0, batch_load=1.6),
    # The benchmark's smallest flow: 100 machines, rarely anything queued.
    "seed5-100m-6h": lambda: synthetic_process_flow(seed=5, machines=100, processes=2500, horizon=6 * 3600.0),
    "seed2-overloaded": lambda: synthetic_process_flow(seed=2, machines=10, horizon=2 * 3600.0, batch_load=1.3),
}
CONFIGS = {
    "default": SimulatorConfig(),
    "borrowing-delay": SimulatorConfig(borrowing=True, actuation_delay=7.5),
    "no-aging": SimulatorConfig(aging_limit=None, control_interval=45.0),
    "aging-0-borrowing": SimulatorConfig(aging_limit=0.0, borrowing=True),
    "aging-600": SimulatorConfig(aging_limit=600.0),
    "borrowing": SimulatorConfig(borrowing=True),
    "warmup-borrowing": SimulatorConfig(borrowing=True, warmup=600.0, aging_limit=300.0),
}
POLICIES: dict[str, Policy] = {"constant": _constant, "varied": _varied}

RECORDED = {
    "seed7-8m/default/constant": "973b81a2405dec32a6ec0d77ac0656e249616b4b66a9fb9e927d3719a3287eba",
    "seed7-8m/default/varied": "3fe3e4d4b7d74f36436bfcf573a7b32b9b68b09ea5d552119012a950d98358d3",
    "seed7-8m/borrowing-delay/constant": "35eb37d1d3ad21eba3e93886b7406846b37c81d8ec01560fc8ba969a171f1b2c",
    "seed7-8m/borrowing-delay/varied": "bcef703fa6e9cda5d52828e8d0cf5208d74d18dd42bdb6c331e55948c300466a",
    "seed7-8m/no-aging/varied": "402fd20693958f5dc68e28cde154704dd8931883e2c5e20cbca37acb96d386ce",
    "seed7-8m/aging-0-borrowing/constant": "ead68d516243bda6d411a2d5c5b830449b71dab4f799012b76a8d0ff156b697f",
    "seed7-8m/aging-0-borrowing/varied": "a5eabb762fc377ddc7c89a49034beb6b457cc33247d10aa338610d22d4ad2a59",
    "seed3-20m/default/constant": "765ac300e3190cae9a0e06a3f6059f7b654c072f8dc16347865707068a969ce6",
    "seed3-20m/borrowing-delay/varied": "285a5ab2fff5f0576d2bc500d8c2a95fcef99b2fdceda156ea99ce6cad8aca4c",
    "seed3-20m/no-aging/varied": "2b1d8fea8ee2446bf345a18ca5788dee4839fb3e9ba72eed329faaa78f0ef331",
    "seed11-overloaded/default/varied": "14d97ddde795ecc448d37122255e143e0b146846ac52ab889ab4b9bbf13c4693",
    "seed11-overloaded/borrowing-delay/varied": "78dcae87244ef86d650fa8b04c0d81effcad6f0ef1c33a9e98c969ac6df4836d",
    "seed11-overloaded/no-aging/constant": "b028e82e07e85dd7298bdfbba6c97d2e08c7dd4716b36e31927210a8bce536a3",
    "seed11-overloaded/aging-600/constant": "4493012d0c8638c26f88736fc812c59a0fa9f849ab874a03532c08c58e84f231",
    "seed11-overloaded/aging-600/varied": "9a62eebe4f8c09cf98f42192b9476d3ea818773f3466c51577ab9101978ae4b7",
    "seed5-100m-6h/default/constant": "8dd0123cd326b9b2d35cafdf4bb4268657bced90f7733a2db71b4a2b0f9ccb69",
    "seed5-100m-6h/default/varied": "6ce20a1befab5da9f6dd430871710baf088829c2cd5ac5dd42fbc08d4d1ea461",
    "seed5-100m-6h/borrowing/constant": "249f6d03dbc760fda153999cd7f34a5dc39a861c57af39b8e9da9c39baecbf78",
    "seed5-100m-6h/borrowing-delay/varied": "0088efcd36bb384fcf4a34b065b80797255383e489eef2fd868e2ee1aa4dafb9",
    "seed5-100m-6h/warmup-borrowing/varied": "82e51fa5519c97657323c31cd270730d1916f4ddfa0698c167794e37846da9d8",
    "seed2-overloaded/borrowing/varied": "83a77ec0ffe20e00357ff94c1d15d9d2f2265f6833e62c365d609b7359ac541f",
    "seed2-overloaded/aging-0-borrowing/constant": "285e400a614de6cc2a4641a45612f8819b514e7899a173035c67f34519b1882f",
}


@pytest.mark.parametrize("case", sorted(RECORDED))
def test_run_is_bit_for_bit_as_recorded(case: str) -> None:
    flow_name, config_name, policy_name = case.split("/")
    flow = FLOWS[flow_name]()
    digest = run_digest(ClusterSimulator, flow, CONFIGS[config_name], POLICIES[policy_name])
    assert digest == RECORDED[case]


if __name__ == "__main__":
    # Record: print every case's digest with the simulator importable as ``cluster_sim`` (or the
    # module given as the first argument, a path to another simulator.py to compare against).
    simulator = ClusterSimulator
    if len(sys.argv) > 1:
        import importlib.util

        spec = importlib.util.spec_from_file_location("reference_simulator", sys.argv[1])
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules["reference_simulator"] = module
        spec.loader.exec_module(module)
        simulator = module.ClusterSimulator
    for flow_name, make in FLOWS.items():
        flow = make()
        for config_name, config in CONFIGS.items():
            for policy_name, policy in POLICIES.items():
                case = f"{flow_name}/{config_name}/{policy_name}"
                if len(sys.argv) > 2 and case not in sys.argv[2:]:
                    continue
                print(f'    "{case}": "{run_digest(simulator, flow, config, policy)}",', flush=True)
