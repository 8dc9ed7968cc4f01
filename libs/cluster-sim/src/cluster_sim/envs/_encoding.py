"""Observation vectors and the joint action code shared by the Gymnasium and PettingZoo adapters."""

from __future__ import annotations

import numpy as np
from gymnasium import spaces

from cluster_sim.allocation import BATCH_ACTIONS, ONLINE_ACTIONS
from cluster_sim.models import SimulationObservation
from cluster_sim.processes import ProcessFlow

__all__ = [
    "BATCH_ACTION_COUNT",
    "JOINT_ACTION_COUNT",
    "MACHINE_FEATURES",
    "ONLINE_ACTION_COUNT",
    "QUEUE_FEATURES",
    "SUMMARY_FEATURES",
    "ObservationEncoder",
    "join_actions",
    "split_action",
]

ONLINE_ACTION_COUNT = len(ONLINE_ACTIONS)
BATCH_ACTION_COUNT = len(BATCH_ACTIONS)
JOINT_ACTION_COUNT = ONLINE_ACTION_COUNT * BATCH_ACTION_COUNT

MACHINE_FEATURES = (
    "demand / cpu (clipped at 2)",
    "online_quota / cpu",
    "batch_cpu_in_use / cpu",
    "batch_cpu_requested / cpu",
    "batch_memory_in_use / batch memory",
)
"""Per-machine features, machine by machine."""

SUMMARY_FEATURES = (
    "time / horizon",
    "queued / processes",
    "running / processes",
    "finished / processes",
    "unreleased / processes",
    "q / (1 + q) with q = queued_cpu / cluster cpu",
)
"""Cluster-wide features, after the machine rows."""

QUEUE_FEATURES = (
    "present (1 for a queued process, 0 for padding)",
    "cpu / largest machine cpu",
    "memory / largest batch memory",
    "estimate / horizon (clipped at 1)",
    "waited / horizon",
)
"""Per-row features of the first queued processes in the current queue order, last."""


def join_actions(online_action: int, batch_action: int) -> int:
    """The joint action ``online_action * 6 + batch_action``."""
    return int(online_action) * BATCH_ACTION_COUNT + int(batch_action)


def split_action(joint_action: int) -> tuple[int, int]:
    """``(online_action, batch_action) = divmod(joint_action, 6)``.

    Raises:
        ValueError: If ``joint_action`` is not in ``range(18)``.
    """
    joint = int(joint_action)
    if not 0 <= joint < JOINT_ACTION_COUNT:
        raise ValueError(f"joint action must be in 0..{JOINT_ACTION_COUNT - 1}, got {joint_action}")
    online, batch = divmod(joint, BATCH_ACTION_COUNT)
    return online, batch


class ObservationEncoder:
    """Turns a :class:`SimulationObservation` into one flat ``float32`` vector.

    Layout: ``len(machines) × MACHINE_FEATURES``, then ``SUMMARY_FEATURES``, then
    ``queue_rows × QUEUE_FEATURES``. The online agent's view is the prefix without the queue rows.
    """

    def __init__(self, flow: ProcessFlow, queue_rows: int) -> None:
        if queue_rows < 0:
            raise ValueError(f"queue_rows must be >= 0, got {queue_rows}")
        self.machine_count = len(flow.machines)
        self.queue_rows = queue_rows
        self._bind(flow)
        self.online_size = self.machine_count * len(MACHINE_FEATURES) + len(SUMMARY_FEATURES)
        self.size = self.online_size + queue_rows * len(QUEUE_FEATURES)
        high = np.ones(self.size, dtype=np.float32)
        high[0 : self.machine_count * len(MACHINE_FEATURES) : len(MACHINE_FEATURES)] = 2.0
        self._high = high
        self.space = spaces.Box(np.zeros_like(high), high, dtype=np.float32)
        self.online_space = spaces.Box(
            np.zeros(self.online_size, dtype=np.float32), high[: self.online_size].copy(), dtype=np.float32
        )

    def bind(self, flow: ProcessFlow) -> None:
        """Use the scales of ``flow``, which must have as many machines as the first.

        Raises:
            ValueError: If the machine count differs (the spaces would change).
        """
        if len(flow.machines) != self.machine_count:
            raise ValueError(
                f"every flow of one environment needs {self.machine_count} machines, got {len(flow.machines)}"
            )
        self._bind(flow)

    def _bind(self, flow: ProcessFlow) -> None:
        self._cpu = np.array([m.cpu for m in flow.machines])
        batch_memory = np.array([m.batch_memory for m in flow.machines])
        self._batch_memory = np.where(batch_memory > 0, batch_memory, 1.0)
        self._processes = max(len(flow.processes), 1)
        self._cluster_cpu = float(self._cpu.sum())
        self._largest_cpu = float(self._cpu.max())
        self._largest_memory = float(batch_memory.max()) if batch_memory.max() > 0 else 1.0
        self._horizon = flow.horizon

    def encode(self, observation: SimulationObservation) -> np.ndarray:
        """A new observation vector."""
        cpu = self._cpu
        machines = np.stack(
            [
                observation.demand / cpu,
                observation.online_quota / cpu,
                observation.batch_cpu_in_use / cpu,
                observation.batch_cpu_requested / cpu,
                observation.batch_memory_in_use / self._batch_memory,
            ],
            axis=1,
        )
        n = self._processes
        queued_cpu = observation.queued_cpu / self._cluster_cpu
        summary = np.array(
            [
                observation.time / self._horizon,
                observation.queued / n,
                observation.running / n,
                observation.finished / n,
                observation.unreleased / n,
                queued_cpu / (1.0 + queued_cpu),
            ]
        )
        queue = np.zeros((self.queue_rows, len(QUEUE_FEATURES)))
        for r, row in enumerate(observation.queue[: self.queue_rows]):
            queue[r] = (
                1.0,
                row.cpu / self._largest_cpu,
                row.memory / self._largest_memory,
                row.estimate / self._horizon,
                row.waited / self._horizon,
            )
        vector = np.concatenate([machines.ravel(), summary, queue.ravel()]).astype(np.float32)
        # Sums of cores and memory can round a hair outside [0, 1]; demand may exceed capacity.
        return np.clip(vector, 0.0, self._high, out=vector)

    def online_view(self, vector: np.ndarray) -> np.ndarray:
        """The online agent's observation: a copy of ``vector`` without the queue rows."""
        return vector[: self.online_size].copy()
