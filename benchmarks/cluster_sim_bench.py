"""Benchmark of cluster_sim: a one-day flow on 100 machines with 10,000 batch processes, and env steps per second.

Run from the repository root: ``uv run --frozen python benchmarks/cluster_sim_bench.py`` (``--runs N``).
Every figure is the median of ``--runs`` runs in this process. Baselines, measured in the same run:

* events/s beside a pure-Python loop that pushes and pops the same number of events through
  ``heapq`` with ``(time, priority, sequence, payload)`` keys and does nothing else;
* environment steps/s beside Gymnasium's ``CartPole-v1`` with a random policy.
"""

from __future__ import annotations

import argparse
import heapq
import random
import statistics
import time
from collections.abc import Callable

import gymnasium as gym
from cluster_sim import ClusterSimulator, ProcessFlow, SimulatorConfig, decode_actions, synthetic_process_flow
from cluster_sim.envs import ClusterEnv, ClusterParallelEnv


def _median(runs: int, work: Callable[[], object]) -> tuple[float, object]:
    times = []
    result: object = None
    for _ in range(runs):
        start = time.perf_counter()
        result = work()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def simulate_day(flow: ProcessFlow, config: SimulatorConfig) -> ClusterSimulator:
    """Run the whole flow with a constant policy (online action 1, batch action 3) every control interval."""
    simulator = ClusterSimulator(flow, config)
    observation = simulator.advance(0, queue_rows=0)
    while not simulator.done:
        simulator.submit(decode_actions(1, 3, observation.demand, flow.machines))
        observation = simulator.advance(simulator.time + config.control_interval, queue_rows=0)
    return simulator


def heap_baseline(events: int) -> int:
    """Push and pop ``events`` heap entries keyed like the simulator's, with an empty handler."""
    rng = random.Random(0)
    heap = [(rng.uniform(0, 86_400.0), rng.randrange(4), k, k) for k in range(events)]
    heapq.heapify(heap)
    handled = 0
    while heap:
        _, _, _, payload = heapq.heappop(heap)
        handled += payload >= 0
    return handled


def episode_steps(make: Callable[[], gym.Env], seed: int) -> int:
    env = make()
    env.reset(seed=seed)
    env.action_space.seed(seed)
    steps = 0
    while True:
        *_, terminated, truncated, _ = env.step(env.action_space.sample())
        steps += 1
        if terminated or truncated:
            env.reset()
            if steps >= 2000:
                return steps


def parallel_steps(env: ClusterParallelEnv, seed: int) -> int:
    env.reset(seed=seed)
    steps = 0
    for agent in env.possible_agents:
        env.action_space(agent).seed(seed)
    while env.agents:
        env.step({agent: env.action_space(agent).sample() for agent in env.agents})
        steps += 1
    return steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()

    build_s, flow = _median(
        args.runs,
        lambda: synthetic_process_flow(seed=args.seed, machines=100, processes=10_000, horizon=86_400.0),
    )
    assert isinstance(flow, ProcessFlow)
    print(f"one-day flow: {len(flow.machines)} machines, {len(flow.processes)} batch processes, "
          f"{len(flow.demand)} demand samples; built in {build_s:.2f} s (median of {args.runs})")  # fmt: skip
    print()
    print("| run | wall time (s) | events | events/s | heap-loop events/s | ratio |")
    print("|---|---|---|---|---|---|")
    outcomes = []
    for label, config in (("no borrowing", SimulatorConfig()), ("borrowing", SimulatorConfig(borrowing=True))):
        wall, simulator = _median(args.runs, lambda config=config: simulate_day(flow, config))
        assert isinstance(simulator, ClusterSimulator)
        report = simulator.report()
        baseline, _ = _median(args.runs, lambda events=report.events: heap_baseline(events))
        rate, base_rate = report.events / wall, report.events / baseline
        print(f"| {label} | {wall:.2f} | {report.events:,} | {rate:,.0f} | {base_rate:,.0f} | {rate / base_rate:.3f} |")
        outcomes.append(
            f"{label}: finished {report.finished:,}, unfinished {report.unfinished}, cost {report.costs.total:,.0f}"
        )
    print()
    print("; ".join(outcomes))

    print()
    print("| environment (random policy) | steps/s | CartPole-v1 steps/s | ratio |")
    print("|---|---|---|---|")
    cart_s, cart_steps = _median(args.runs, lambda: episode_steps(lambda: gym.make("CartPole-v1"), args.seed))
    cart_rate = cart_steps / cart_s  # type: ignore[operator]
    env_flow = synthetic_process_flow(seed=args.seed)
    gym_s, gym_steps = _median(args.runs, lambda: episode_steps(lambda: ClusterEnv(env_flow), args.seed))
    gym_rate = gym_steps / gym_s  # type: ignore[operator]
    print(f"| ClusterEnv, synthetic_process_flow(seed={args.seed}) | {gym_rate:,.0f} | {cart_rate:,.0f} | "
          f"{gym_rate / cart_rate:.3f} |")  # fmt: skip
    pz_env = ClusterParallelEnv(env_flow)
    pz_s, pz_steps = _median(args.runs, lambda: parallel_steps(pz_env, args.seed))
    pz_rate = pz_steps / pz_s  # type: ignore[operator]
    print(f"| ClusterParallelEnv, same flow | {pz_rate:,.0f} | {cart_rate:,.0f} | {pz_rate / cart_rate:.3f} |")


if __name__ == "__main__":
    main()
