"""The two-agent PettingZoo Parallel adapter: separate online and batch actions, one shared reward."""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import spaces
from pettingzoo import ParallelEnv

from cluster_sim.envs._encoding import BATCH_ACTION_COUNT, ONLINE_ACTION_COUNT, join_actions
from cluster_sim.envs.gymnasium import ClusterEnv, FlowSource, default_flow
from cluster_sim.simulator import SimulatorConfig

__all__ = ["ClusterParallelEnv"]

ONLINE = "online"
BATCH = "batch"


class ClusterParallelEnv(ParallelEnv[str, np.ndarray, np.int64]):
    """The cluster of :class:`~cluster_sim.envs.ClusterEnv` with one agent per decision.

    ## Description

    Two agents act simultaneously every control interval: ``online`` sets the online CPU quota,
    ``batch`` sets the queue order and CPU admission. Their actions are joined as
    ``online * 6 + batch`` and run by the Gymnasium adapter, so both APIs execute the same
    :class:`~cluster_sim.ClusterSimulator`.

    ## Action Space

    ``online``: ``Discrete(3)`` (quota = current demand + 0, 10 or 20 % of capacity, capped at
    capacity). ``batch``: ``Discrete(6)`` (FIFO, shortest estimate first, smallest dominant share
    first, each with 75 % or 100 % CPU admission).

    ## Observation Space

    ``batch`` sees the complete encoded observation of :class:`ClusterEnv`. ``online`` sees the
    machine and summary features only, not the per-process queue rows. :meth:`state` returns the
    unmasked global observation (the ``batch`` one), in :attr:`state_space`.

    ## Rewards

    Both agents receive the same reward: minus the cost added during the step (online CPU
    shortfall, unfinished batch processes, quota change), as in :class:`ClusterEnv`.

    ## Starting State

    As :class:`ClusterEnv`: time 0 under the initial allocation, advanced through the warm-up.

    ## Episode End

    Both agents are truncated together at the flow's horizon; ``agents`` is then empty.

    ## Arguments

    Those of :class:`ClusterEnv`: ``flow``, ``config``, ``queue_rows``, ``render_mode`` (None only).
    """

    metadata: dict[str, Any] = {"name": "cluster_sim_v0", "render_modes": [], "is_parallelizable": True}  # noqa: RUF012

    def __init__(
        self,
        flow: FlowSource = default_flow,
        config: SimulatorConfig | None = None,
        *,
        queue_rows: int = 8,
        render_mode: str | None = None,
    ) -> None:
        self._env = ClusterEnv(flow, config, queue_rows=queue_rows, render_mode=render_mode)
        self.render_mode = render_mode
        self.possible_agents = [ONLINE, BATCH]
        self.agents: list[str] = []
        encoder = self._env.encoder
        self._observation_spaces = {ONLINE: encoder.online_space, BATCH: encoder.space}
        self._action_spaces = {ONLINE: spaces.Discrete(ONLINE_ACTION_COUNT), BATCH: spaces.Discrete(BATCH_ACTION_COUNT)}
        self.state_space = encoder.space
        self._state: np.ndarray | None = None

    def observation_space(self, agent: str) -> spaces.Space[Any]:
        """The agent's observation space (the same object on every call)."""
        return self._observation_spaces[agent]

    def action_space(self, agent: str) -> spaces.Space[Any]:
        """The agent's action space (the same object on every call)."""
        return self._action_spaces[agent]

    @property
    def env(self) -> ClusterEnv:
        """The underlying Gymnasium environment."""
        return self._env

    def reset(
        self, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, np.ndarray], dict[str, dict[str, Any]]]:
        """Start an episode with both agents live."""
        vector, info = self._env.reset(seed=seed, options=options)
        self.agents = list(self.possible_agents)
        self._state = vector
        return self._split(vector), {agent: dict(info) for agent in self.agents}

    def step(
        self, actions: dict[str, int | np.integer]
    ) -> tuple[
        dict[str, np.ndarray],
        dict[str, float],
        dict[str, bool],
        dict[str, bool],
        dict[str, dict[str, Any]],
    ]:
        """Apply both agents' actions for one control interval.

        Raises:
            ValueError: If an action of a live agent is missing.
        """
        if not self.agents:
            raise RuntimeError("the episode is over; call reset()")
        missing = [agent for agent in self.agents if agent not in actions]
        if missing:
            raise ValueError(f"every live agent must act; missing: {', '.join(missing)}")
        vector, reward, terminated, truncated, info = self._env.step(
            join_actions(int(actions[ONLINE]), int(actions[BATCH]))
        )
        self._state = vector
        agents = self.agents
        observations = self._split(vector)
        rewards = dict.fromkeys(agents, float(reward))
        terminations = dict.fromkeys(agents, terminated)
        truncations = dict.fromkeys(agents, truncated)
        infos = {agent: _copy_info(info) for agent in agents}
        if terminated or truncated:
            self.agents = []
        return observations, rewards, terminations, truncations, infos

    def state(self) -> np.ndarray:
        """The unmasked global observation (a new array)."""
        if self._state is None:
            raise RuntimeError("call reset() before using the environment")
        return self._state.copy()

    def render(self) -> None:
        """Rendering is not supported."""
        return None

    def close(self) -> None:
        """Release the underlying environment."""
        self._env.close()

    def _split(self, vector: np.ndarray) -> dict[str, np.ndarray]:
        return {ONLINE: self._env.encoder.online_view(vector), BATCH: vector.copy()}


def _copy_info(info: dict[str, Any]) -> dict[str, Any]:
    return {key: dict(value) if isinstance(value, dict) else value for key, value in info.items()}
