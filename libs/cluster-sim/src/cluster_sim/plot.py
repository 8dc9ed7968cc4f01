"""Plot one episode under a constant policy: online demand, quota and batch CPU in use over time.

Run ``python -m cluster_sim.plot --seed 7 --out episode.png`` (needs the ``plot`` extra).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from cluster_sim.allocation import decode_actions
from cluster_sim.models import SimulationObservation
from cluster_sim.processes import synthetic_process_flow
from cluster_sim.simulator import ClusterSimulator, SimulatorConfig

__all__ = ["main", "plot_episode", "run_episode"]


def run_episode(
    seed: int, online_action: int, batch_action: int, config: SimulatorConfig
) -> tuple[ClusterSimulator, list[SimulationObservation]]:
    """Run ``synthetic_process_flow(seed=seed)`` under constant actions, keeping every event's observation."""
    flow = synthetic_process_flow(seed=seed)
    simulator = ClusterSimulator(flow, config)
    observations = [simulator.advance(config.warmup, queue_rows=0)]
    while not simulator.done:
        demand = observations[-1].demand
        simulator.submit(decode_actions(online_action, batch_action, demand, flow.machines))
        observations.append(
            simulator.advance(simulator.time + config.control_interval, queue_rows=0, on_event=observations.append)
        )
    return simulator, observations


def plot_episode(seed: int, online_action: int, batch_action: int, config: SimulatorConfig, out: Path) -> Path:
    """Save a two-panel PNG of one episode and return its path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    simulator, observations = run_episode(seed, online_action, batch_action, config)
    hours = np.array([o.time for o in observations]) / 3600.0
    demand = np.array([o.demand.sum() for o in observations])
    quota = np.array([o.online_quota.sum() for o in observations])
    batch = np.array([o.batch_cpu_in_use.sum() for o in observations])
    queued = np.array([o.queued for o in observations])
    running = np.array([o.running for o in observations])
    capacity = sum(m.cpu for m in simulator.flow.machines)
    report = simulator.report()

    figure, (top, bottom) = plt.subplots(
        2, 1, figsize=(11, 6.5), sharex=True, gridspec_kw={"height_ratios": [2.2, 1]}, layout="constrained"
    )
    top.axhline(capacity, color="black", linewidth=1, linestyle=":", label=f"capacity ({capacity:g} cores)")
    top.fill_between(
        hours, quota, quota + batch, step="post", color="tab:green", alpha=0.35, label="batch CPU in use (above quota)"
    )
    top.plot(hours, quota, drawstyle="steps-post", color="tab:orange", linewidth=1.2, label="online quota")
    top.plot(hours, demand, drawstyle="steps-post", color="tab:blue", linewidth=0.8, label="online demand")
    top.set_ylabel("cores (cluster total)")
    top.set_ylim(0, capacity * 1.2)
    top.legend(loc="upper left", ncols=4, fontsize=9, frameon=False)
    bottom.plot(hours, queued, drawstyle="steps-post", color="tab:red", linewidth=1, label="queued")
    bottom.plot(hours, running, drawstyle="steps-post", color="tab:purple", linewidth=1, label="running")
    bottom.set_ylabel("batch processes")
    bottom.set_xlabel("time (hours)")
    bottom.legend(loc="upper left", ncols=2, fontsize=9, frameon=False)
    figure.suptitle(
        f"synthetic_process_flow(seed={seed}), online action {online_action}, batch action {batch_action}"
        f"{', borrowing' if config.borrowing else ''}\ncost {report.costs.total:.0f} "
        f"(shortfall {report.costs.shortfall_cost:.0f}, unfinished {report.costs.unfinished_cost:.0f}, "
        f"quota change {report.costs.quota_change_cost:.0f}), {report.unfinished} unfinished at the horizon",
        fontsize=10,
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=120)
    plt.close(figure)
    return out


def main(argv: Sequence[str] | None = None) -> None:
    """The command line: ``python -m cluster_sim.plot --seed 7 --out episode.png``."""
    parser = argparse.ArgumentParser(prog="python -m cluster_sim.plot", description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=7, help="seed of synthetic_process_flow")
    parser.add_argument("--online", type=int, default=1, choices=range(3), help="constant online action")
    parser.add_argument("--batch", type=int, default=3, choices=range(6), help="constant batch action")
    parser.add_argument("--borrowing", action="store_true", help="let batch work borrow idle online quota")
    parser.add_argument("--out", type=Path, default=Path("episode.png"), help="PNG to write")
    args = parser.parse_args(argv)
    path = plot_episode(args.seed, args.online, args.batch, SimulatorConfig(borrowing=args.borrowing), args.out)
    print(path)


if __name__ == "__main__":
    main()
