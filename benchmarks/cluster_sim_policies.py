"""Constant-policy table for cluster_sim: every (online, batch) action pair held for a whole episode.

Run from the repository root: ``uv run --frozen python benchmarks/cluster_sim_policies.py [--seeds 0 1 2 3 4]``.
Each row is the mean over ``synthetic_process_flow(seed=s)`` for the given seeds, run through
``ClusterEnv`` with the default ``SimulatorConfig`` (or ``--borrowing``). It prints a Markdown table.
"""

from __future__ import annotations

import argparse
import statistics

from cluster_sim import BATCH_ACTIONS, ONLINE_ACTIONS, SimulatorConfig, synthetic_process_flow
from cluster_sim.envs import ClusterEnv

ORDER_NAMES = {"fifo": "FIFO", "shortest_estimate": "shortest estimate", "dominant_share": "dominant share"}


def episode(seed: int, online: int, batch: int, config: SimulatorConfig) -> dict[str, float]:
    """Total cost, unfinished processes at the horizon and online shortfall of one constant-policy episode."""
    env = ClusterEnv(synthetic_process_flow(seed=seed), config)
    env.reset(seed=seed)
    total = 0.0
    while True:
        _, reward, _, truncated, info = env.step(online * len(BATCH_ACTIONS) + batch)
        total -= reward
        if truncated:
            report = info["report"]
            return {
                "cost": total,
                "unfinished": report["unfinished"],
                "shortfall": report["cost"]["online_shortfall"],
                "flow_time": report["mean_restricted_flow_time"],
            }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--borrowing", action="store_true")
    args = parser.parse_args()
    config = SimulatorConfig(borrowing=args.borrowing)
    print(f"seeds {args.seeds}, borrowing {args.borrowing}; means over seeds")
    print()
    print("| online | batch | quota margin | queue order | admission | mean cost | unfinished at horizon | "
          "online shortfall (core-s) | mean restricted flow time (s) |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for online, online_action in enumerate(ONLINE_ACTIONS):
        for batch, batch_action in enumerate(BATCH_ACTIONS):
            runs = [episode(seed, online, batch, config) for seed in args.seeds]
            mean = {key: statistics.fmean(run[key] for run in runs) for key in runs[0]}
            print(
                f"| {online} | {batch} | +{online_action.margin:.0%} | {ORDER_NAMES[batch_action.queue_order]} | "
                f"{batch_action.admission_fraction:.0%} | {mean['cost']:,.0f} | {mean['unfinished']:.1f} | "
                f"{mean['shortfall']:,.0f} | {mean['flow_time']:,.0f} |"
            )


if __name__ == "__main__":
    main()
