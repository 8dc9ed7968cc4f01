"""Benchmark of cluster_sim: cost per event as the flow grows, a one-day flow, and env steps per second.

Run from the repository root: ``uv run --frozen python benchmarks/cluster_sim_bench.py`` (``--runs N``).
Every figure is the median of ``--runs`` runs in this process, each run of the simulator alternating
with a run of its baseline so both see the same load. Times are this process's CPU time
(``time.process_time``), so other work on a shared machine does not count; ``--clock wall`` measures
wall time instead. Baselines, measured in the same run:

* µs per event and events/s beside a pure-Python loop that pushes and pops the same number of events
  through ``heapq`` with ``(time, priority, sequence, payload)`` keys and does nothing else;
* environment steps/s beside Gymnasium's ``CartPole-v1`` with a random policy.

The flow grows in time at a constant rate: 100 machines with 2,500 processes over 6 hours, 10,000
over one day, 40,000 over four days. Goals: the µs per event within 1.5× from the smallest flow to
the largest, and at least 150,000 events/s on the one-day flow.

The first line names the build measured: ``compiled`` (the C extensions mypyc built at install) or
``pure`` (the Python source: ``CLUSTER_SIM_PURE=1`` asks for it, to compare the two).
"""

from __future__ import annotations

import argparse
import heapq
import random
import statistics
import time
from collections.abc import Callable

import cluster_sim
import gymnasium as gym
from cluster_sim import ClusterSimulator, ProcessFlow, SimulatorConfig, decode_actions, synthetic_process_flow
from cluster_sim.envs import ClusterEnv, ClusterParallelEnv

CLOCKS = {"cpu": time.process_time, "wall": time.perf_counter}
_clock = CLOCKS["cpu"]


def _median(runs: int, work: Callable[[], object]) -> tuple[float, object]:
    times = []
    result: object = None
    for _ in range(runs):
        start = _clock()
        result = work()
        times.append(_clock() - start)
    return statistics.median(times), result


def _paired_medians(
    runs: int, work: Callable[[], object], baseline: Callable[[], object]
) -> tuple[float, object, float, object]:
    """Median seconds of ``work`` and of ``baseline``, run alternately so that both see the same load."""
    work_times, baseline_times = [], []
    result: object = None
    base_result: object = None
    for _ in range(runs):
        start = _clock()
        result = work()
        work_times.append(_clock() - start)
        start = _clock()
        base_result = baseline()
        baseline_times.append(_clock() - start)
    return statistics.median(work_times), result, statistics.median(baseline_times), base_result


def simulate_flow(flow: ProcessFlow, config: SimulatorConfig) -> ClusterSimulator:
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


SIZES = ((2_500, 6 * 3600.0), (10_000, 86_400.0), (40_000, 4 * 86_400.0))
"""(processes, horizon in seconds) of the growing flows, all on 100 machines."""


def timed_flow(runs: int, flow: ProcessFlow, config: SimulatorConfig) -> tuple[float, float, ClusterSimulator]:
    """Median seconds of simulating ``flow`` and of the heap loop over as many events, run alternately.

    A first, untimed run counts the events (and warms the caches) so the heap loop can alternate
    with the timed runs.
    """
    events = simulate_flow(flow, config).report().events
    wall, simulator, base, _ = _paired_medians(runs, lambda: simulate_flow(flow, config), lambda: heap_baseline(events))
    assert isinstance(simulator, ClusterSimulator)
    return wall, base, simulator


def scaling(runs: int, seed: int) -> None:
    """Print the µs per event of flows of growing length beside the heap loop's, and how each grows."""
    print("| processes | horizon (h) | events | simulator µs/event | heap-loop µs/event | ratio |")
    print("|---|---|---|---|---|---|")
    per_event: list[tuple[float, float]] = []
    for processes, horizon in SIZES:
        flow = synthetic_process_flow(seed=seed, machines=100, processes=processes, horizon=horizon)
        wall, base, simulator = timed_flow(runs, flow, SimulatorConfig())
        events = simulator.report().events
        sim_us, base_us = 1e6 * wall / events, 1e6 * base / events
        per_event.append((sim_us, base_us))
        print(f"| {processes:,} | {horizon / 3600:g} | {events:,} | {sim_us:.2f} | {base_us:.2f} | "
              f"{base_us / sim_us:.3f} |")  # fmt: skip
    (first, first_base), (last, last_base) = per_event[0], per_event[-1]
    print()
    print(f"µs per event from {SIZES[0][0]:,} to {SIZES[-1][0]:,} processes: simulator {last / first:.2f}× "
          f"(goal at most 1.5×), heap loop {last_base / first_base:.2f}×")  # fmt: skip


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
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="cpu", help="what to time (default: cpu)")
    args = parser.parse_args()
    global _clock
    _clock = CLOCKS[args.clock]

    print(f"cluster_sim build: {cluster_sim.BUILD.name} ({cluster_sim.BUILD.detail})")
    print()
    print(f"Cost per event as the flow grows (100 machines, constant policy; {args.clock} time, "
          f"median of {args.runs}):")  # fmt: skip
    print()
    scaling(args.runs, args.seed)
    print()

    build_s, flow = _median(
        args.runs,
        lambda: synthetic_process_flow(seed=args.seed, machines=100, processes=10_000, horizon=86_400.0),
    )
    assert isinstance(flow, ProcessFlow)
    print(f"one-day flow: {len(flow.machines)} machines, {len(flow.processes)} batch processes, "
          f"{len(flow.demand)} demand samples; built in {build_s:.2f} s (median of {args.runs})")  # fmt: skip
    print()
    print(f"| run | {args.clock} time (s) | events | events/s | heap-loop events/s | ratio |")
    print("|---|---|---|---|---|---|")
    outcomes = []
    for label, config in (("no borrowing", SimulatorConfig()), ("borrowing", SimulatorConfig(borrowing=True))):
        wall, baseline, simulator = timed_flow(args.runs, flow, config)
        report = simulator.report()
        rate, base_rate = report.events / wall, report.events / baseline
        print(f"| {label} | {wall:.2f} | {report.events:,} | {rate:,.0f} | {base_rate:,.0f} | {rate / base_rate:.3f} |")
        outcomes.append(
            f"{label}: finished {report.finished:,}, unfinished {report.unfinished}, cost {report.costs.total:,.0f}"
        )
    print()
    print("; ".join(outcomes) + " (goal: at least 150,000 events/s)")

    print()
    print("| environment (random policy) | steps/s | CartPole-v1 steps/s | ratio |")
    print("|---|---|---|---|")
    env_flow = synthetic_process_flow(seed=args.seed)
    cart = lambda: episode_steps(lambda: gym.make("CartPole-v1"), args.seed)  # noqa: E731
    gym_s, gym_steps, cart_s, cart_steps = _paired_medians(
        args.runs, lambda: episode_steps(lambda: ClusterEnv(env_flow), args.seed), cart
    )
    gym_rate, cart_rate = gym_steps / gym_s, cart_steps / cart_s  # type: ignore[operator]
    print(f"| ClusterEnv, synthetic_process_flow(seed={args.seed}) | {gym_rate:,.0f} | {cart_rate:,.0f} | "
          f"{gym_rate / cart_rate:.3f} |")  # fmt: skip
    pz_env = ClusterParallelEnv(env_flow)
    pz_s, pz_steps, cart_s, cart_steps = _paired_medians(args.runs, lambda: parallel_steps(pz_env, args.seed), cart)
    pz_rate, cart_rate = pz_steps / pz_s, cart_steps / cart_s  # type: ignore[operator]
    print(f"| ClusterParallelEnv, same flow | {pz_rate:,.0f} | {cart_rate:,.0f} | {pz_rate / cart_rate:.3f} |")


if __name__ == "__main__":
    main()
