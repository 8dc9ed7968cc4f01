"""One cluster_sim episode: the process flows of the study, its policies, and the episode loop through ClusterEnv.

Everything here is deterministic: a flow is fixed by its name and seed, a policy's action by the observation
(the learned one by its Q-table), and the simulator has no randomness of its own.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
from cluster_sim import ProcessFlow, synthetic_process_flow
from cluster_sim.alibaba import load_alibaba_v2018
from cluster_sim.envs import ClusterEnv

DATA = Path(__file__).resolve().parent.parent / "data"
"""The model's own copy of the Alibaba cluster-trace-v2018 sample (two machines; see data/README.md)."""

FLOWS = ("synthetic", "alibaba")
ACTIONS = 18
CONSTANT_POLICIES = tuple(f"constant-{online}-{batch}" for online in range(3) for batch in range(6))
HEURISTIC_POLICIES = ("load-headroom", "queue-aware", "cautious")
LEARNED_POLICY = "learned"
ALL_POLICIES = (*CONSTANT_POLICIES, *HEURISTIC_POLICIES, LEARNED_POLICY)

PER_MACHINE = 5
"""Values per machine at the start of ClusterEnv's observation (demand / cores first)."""
SUMMARY = 6
"""Summary values after the machines' (time, queued, running, finished, unreleased, queued CPU)."""


@dataclass(frozen=True)
class FlowSpec:
    """Which flow an episode runs: its name, its seed and its length."""

    name: str
    seed: int
    hours: float


@cache
def _trace(hours: float) -> ProcessFlow:
    return load_alibaba_v2018(
        DATA / "v2018_machine_meta_m1933_m1934.csv",
        machine_usage=DATA / "v2018_machine_usage_m1933_m1934.csv",
        horizon=hours * 3600.0,
    )


def make_flow(spec: FlowSpec) -> ProcessFlow:
    """The synthetic flow of `spec.seed`, or the trace's two machines and their online demand with batch work
    drawn from `spec.seed` (the sample holds no batch tasks), both `spec.hours` long."""
    horizon = spec.hours * 3600.0
    if spec.name == "synthetic":
        return synthetic_process_flow(spec.seed, horizon=horizon)
    if spec.name != "alibaba":
        raise ValueError(f"unknown flow {spec.name!r}: use one of {', '.join(FLOWS)}")
    trace = _trace(spec.hours)
    machine = trace.machines[0]
    batch = synthetic_process_flow(
        spec.seed,
        machines=len(trace.machines),
        horizon=horizon,
        cpu=machine.cpu,
        memory=machine.memory,
        online_memory=machine.online_memory,
        batch_load=0.3,
    )
    return ProcessFlow(
        machines=trace.machines,
        processes=batch.processes,
        demand=trace.demand,
        horizon=horizon,
        provenance=f"{trace.provenance}; batch processes of synthetic_process_flow({spec.seed})",
    )


Policy = Callable[[np.ndarray], int]


def machines_of(observation: np.ndarray, machines: int) -> np.ndarray:
    """The per-machine block of an observation, one row per machine."""
    return observation[: machines * PER_MACHINE].reshape(machines, PER_MACHINE)


def state_of(observation: np.ndarray, machines: int) -> int:
    """The learned policy's state: mean demand level (3 buckets) times queue pressure (3 buckets)."""
    demand = float(machines_of(observation, machines)[:, 0].mean())
    pressure = float(observation[machines * PER_MACHINE + SUMMARY - 1])
    load = 0 if demand < 0.4 else (1 if demand < 0.7 else 2)
    queue = 0 if pressure < 0.02 else (1 if pressure < 0.15 else 2)
    return load * 3 + queue


STATES = 9


def heuristic(name: str, machines: int) -> Policy:
    """The example's hand-written policies, each a joint action (online * 6 + batch) from the observation."""

    def load_headroom(observation: np.ndarray) -> int:
        demand = float(machines_of(observation, machines)[:, 0].mean())
        online = 0 if demand < 0.4 else (1 if demand < 0.7 else 2)
        return online * 6 + 3  # shortest estimate first, 100 % admission

    def queue_aware(observation: np.ndarray) -> int:
        queued = float(observation[machines * PER_MACHINE + 1])
        return 1 * 6 + (5 if queued > 0.05 else 1)  # dominant share first when the queue is long, else FIFO

    def cautious(observation: np.ndarray) -> int:
        peak = float(machines_of(observation, machines)[:, 0].max())
        return (2 if peak > 0.8 else 1) * 6 + 2  # shortest estimate first, 75 % admission

    policies = {"load-headroom": load_headroom, "queue-aware": queue_aware, "cautious": cautious}
    return policies[name]


def policy_of(name: str, machines: int, q_table: Sequence[Sequence[float]] | None = None) -> Policy:
    """A policy by its name in the study; the learned one acts greedily on `q_table`."""
    if name.startswith("constant-"):
        _, online, batch = name.split("-")
        action = int(online) * 6 + int(batch)
        return lambda observation: action
    if name in HEURISTIC_POLICIES:
        return heuristic(name, machines)
    if name == LEARNED_POLICY:
        if q_table is None:
            raise ValueError("the learned policy needs its Q-table")
        table = np.asarray(q_table, dtype=float)
        return lambda observation: int(np.argmax(table[state_of(observation, machines)]))
    raise ValueError(f"unknown policy {name!r}")


def run_episode(flow: ProcessFlow, policy: Policy, seed: int) -> dict[str, Any]:
    """One episode of `policy` on `flow` through ClusterEnv; its report: cost, unfinished processes, online
    shortfall (core-seconds) and restricted flow time (seconds)."""
    env = ClusterEnv(flow)
    observation, _ = env.reset(seed=seed)
    info: dict[str, Any] = {}
    while True:
        observation, _, terminated, truncated, info = env.step(policy(observation))
        if terminated or truncated:
            break
    env.close()
    report = info["report"]
    return {
        "cost": report["cost"]["total"],
        "unfinished": report["unfinished"],
        "online_shortfall": report["cost"]["online_shortfall"],
        "restricted_flow_time": report["restricted_flow_time"],
        "finished": report["finished"],
    }


def train_q_table(
    flows: Sequence[ProcessFlow], seed: int, episodes: int, alpha: float, gamma: float, epsilon: float
) -> list[list[float]]:
    """Tabular Q-learning over the 18 joint actions on the training flows (cycled), epsilon-greedy from
    `seed`: the learned policy of one seed."""
    rng = np.random.default_rng(seed)
    table = np.zeros((STATES, ACTIONS))
    for episode in range(episodes):
        flow = flows[episode % len(flows)]
        machines = len(flow.machines)
        env = ClusterEnv(flow)
        observation, _ = env.reset(seed=seed + episode)
        state = state_of(observation, machines)
        while True:
            action = int(rng.integers(ACTIONS)) if rng.random() < epsilon else int(np.argmax(table[state]))
            observation, reward, terminated, truncated, _ = env.step(action)
            following = state_of(observation, machines)
            target = reward + (0.0 if terminated else gamma * table[following].max())
            table[state, action] += alpha * (target - table[state, action])
            state = following
            if terminated or truncated:
                break
        env.close()
    return table.tolist()
