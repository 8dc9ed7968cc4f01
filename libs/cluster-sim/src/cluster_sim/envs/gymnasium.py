"""The centralized Gymnasium adapter: one Discrete(18) joint action over the simulator."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from cluster_sim.allocation import decode_actions
from cluster_sim.envs._encoding import JOINT_ACTION_COUNT, ObservationEncoder, split_action
from cluster_sim.models import CostBreakdown, SimulationObservation
from cluster_sim.processes import ProcessFlow, synthetic_process_flow
from cluster_sim.simulator import ClusterSimulator, SimulatorConfig

__all__ = ["ENV_ID", "ClusterEnv", "FlowSource", "default_flow"]

ENV_ID = "cluster_sim/Cluster-v0"
"""The id under which :class:`ClusterEnv` is registered with ``gymnasium.make``."""

FlowSource = ProcessFlow | Callable[[np.random.Generator], ProcessFlow]
"""A fixed flow, or a function that draws one from the environment's generator at each reset."""


def default_flow(rng: np.random.Generator) -> ProcessFlow:
    """``synthetic_process_flow`` with its defaults, drawn from ``rng``."""
    return synthetic_process_flow(rng=rng)


class ClusterEnv(gym.Env[np.ndarray, np.int64]):
    """A cluster shared by online services and batch processes, controlled by one agent.

    ## Description

    The agent sets, every ``control_interval`` seconds (60 by default), how much CPU each machine
    reserves for online services and how the batch queue is ordered and admitted. Between
    decisions a :class:`~cluster_sim.ClusterSimulator` runs the flow's events exactly: releases,
    online demand samples, delayed allocations and completions. The adapter only encodes
    observations and decodes actions; all physics is the simulator's.

    ## Action Space

    ``Discrete(18)``: ``joint = online * 6 + batch`` and ``online, batch = divmod(joint, 6)``.

    | online | online quota per machine |
    |---|---|
    | 0 | current demand |
    | 1 | current demand + 10 % of capacity |
    | 2 | current demand + 20 % of capacity |

    (capped at capacity)

    | batch | queue order | CPU admission |
    |---|---|---|
    | 0 | FIFO | 75 % |
    | 1 | FIFO | 100 % |
    | 2 | shortest estimate first | 75 % |
    | 3 | shortest estimate first | 100 % |
    | 4 | smallest dominant resource share first | 75 % |
    | 5 | smallest dominant resource share first | 100 % |

    ## Observation Space

    ``Box(0, high, (5 * machines + 6 + 5 * queue_rows,), float32)``: per machine the online demand
    (over the machine's cores, clipped at 2, the only feature whose ``high`` is 2), online quota,
    batch CPU in use and requested (over the machine's cores) and batch memory in use (over its
    batch memory); then the time over the horizon, the queued, running, finished and unreleased
    processes over the process count, and ``q / (1 + q)`` for ``q`` = queued CPU over the cluster's
    cores; then for the first ``queue_rows`` queued processes in the current order a presence
    flag, CPU, memory, estimate and waiting time, scaled to [0, 1] (see
    ``cluster_sim.envs._encoding``).

    ## Rewards

    Minus the cost added during the step: ``shortfall_weight`` × online CPU shortfall (core-seconds
    of demand above quota) + ``unfinished_weight`` × unfinished batch processes (process-seconds)
    + ``quota_change_weight`` × quota change (cores). ``info["cost"]`` gives each term.

    ## Starting State

    Time 0 of the flow under the simulator's initial allocation (quota = demand at time 0, FIFO,
    100 % admission), advanced through ``SimulatorConfig.warmup`` seconds. With a flow factory, the
    flow is drawn from the environment's generator, so ``reset(seed=...)`` fixes it.

    ## Episode End

    The episode is truncated when the simulation reaches the flow's horizon; unfinished processes
    are censored and the last ``info["report"]`` counts them. It never terminates.

    ## Arguments

    * ``flow``: a :class:`~cluster_sim.ProcessFlow`, or a function ``Generator -> ProcessFlow``
      (every flow it returns must have the same number of machines); by default a new
      ``synthetic_process_flow`` at every reset. Registered as ``cluster_sim/Cluster-v0``.
    * ``config``: a :class:`~cluster_sim.SimulatorConfig` (control interval, actuation delay,
      warm-up, borrowing, aging limit, cost weights).
    * ``queue_rows``: queued processes listed in the observation (8 by default).
    * ``render_mode``: only None is supported.
    """

    metadata: dict[str, Any] = {"render_modes": []}  # noqa: RUF012 - Gymnasium's convention

    def __init__(
        self,
        flow: FlowSource = default_flow,
        config: SimulatorConfig | None = None,
        *,
        queue_rows: int = 8,
        render_mode: str | None = None,
    ) -> None:
        if render_mode is not None:
            raise ValueError(f"render_mode {render_mode!r} is not supported; use None")
        self.render_mode = render_mode
        self._source = flow
        self._config = config if config is not None else SimulatorConfig()
        first = flow if isinstance(flow, ProcessFlow) else flow(np.random.default_rng(0))
        self._encoder = ObservationEncoder(first, queue_rows)
        self._flow = first
        self.action_space = spaces.Discrete(JOINT_ACTION_COUNT)
        self.observation_space = self._encoder.space
        self._simulator: ClusterSimulator | None = None
        self._observation: SimulationObservation | None = None
        self._costs = CostBreakdown()

    @property
    def simulator(self) -> ClusterSimulator:
        """The simulator of the current episode.

        Raises:
            RuntimeError: Before the first reset.
        """
        if self._simulator is None:
            raise RuntimeError("call reset() before using the environment")
        return self._simulator

    @property
    def encoder(self) -> ObservationEncoder:
        """The observation encoder (its ``online_size`` splits the online agent's view)."""
        return self._encoder

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """Start an episode; see the class docstring's Starting State."""
        super().reset(seed=seed)
        if not isinstance(self._source, ProcessFlow):
            self._flow = self._source(self.np_random)
            self._encoder.bind(self._flow)
        self._simulator = ClusterSimulator(self._flow, self._config)
        self._observation = self._simulator.advance(self._config.warmup, queue_rows=self._encoder.queue_rows)
        self._costs = self._simulator.costs()
        return self._encoder.encode(self._observation), {"time": self._observation.time}

    def step(self, action: int | np.integer) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        """Apply the joint action for one control interval.

        Raises:
            RuntimeError: Before reset or after the episode was truncated.
            ValueError: If the action is not in ``range(18)``.
        """
        simulator = self.simulator
        if simulator.done or self._observation is None:
            raise RuntimeError("the episode is over; call reset()")
        online, batch = split_action(int(action))
        simulator.submit(decode_actions(online, batch, self._observation.demand, self._flow.machines))
        self._observation = simulator.advance(
            simulator.time + self._config.control_interval, queue_rows=self._encoder.queue_rows
        )
        costs = simulator.costs()
        step_cost = costs - self._costs
        self._costs = costs
        truncated = simulator.done
        info: dict[str, Any] = {
            "time": self._observation.time,
            "online_action": online,
            "batch_action": batch,
            "cost": step_cost.as_dict(),
        }
        if truncated:
            report = simulator.report()
            info["report"] = {
                "finished": report.finished,
                "unfinished": report.unfinished,
                "remaining_work": report.remaining_work,
                "restricted_flow_time": report.restricted_flow_time,
                "mean_restricted_flow_time": report.mean_restricted_flow_time,
                "cost": report.costs.as_dict(),
            }
        return self._encoder.encode(self._observation), -step_cost.total, False, truncated, info

    def state(self) -> np.ndarray:
        """The full encoded observation at the current time (a new array)."""
        if self._observation is None:
            raise RuntimeError("call reset() before using the environment")
        return self._encoder.encode(self._observation)


if ENV_ID not in gym.registry:
    gym.register(id=ENV_ID, entry_point="cluster_sim.envs.gymnasium:ClusterEnv")
