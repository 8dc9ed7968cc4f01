"""Reinforcement-learning adapters: a Gymnasium env and a PettingZoo parallel env, imported lazily."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cluster_sim.envs.gymnasium import ClusterEnv
    from cluster_sim.envs.pettingzoo import ClusterParallelEnv

__all__ = ["ClusterEnv", "ClusterParallelEnv"]


def __getattr__(name: str) -> Any:
    # Lazy so that the Gymnasium adapter works without the pettingzoo extra installed.
    if name == "ClusterEnv":
        from cluster_sim.envs.gymnasium import ClusterEnv

        return ClusterEnv
    if name == "ClusterParallelEnv":
        from cluster_sim.envs.pettingzoo import ClusterParallelEnv

        return ClusterParallelEnv
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
