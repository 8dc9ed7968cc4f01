"""Allocations and the discrete online and batch action tables that decode into them."""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from cluster_sim.processes import Machine

__all__ = [
    "BATCH_ACTIONS",
    "ONLINE_ACTIONS",
    "Allocation",
    "BatchAction",
    "OnlineAction",
    "QueueOrder",
    "decode_actions",
    "decode_batch_action",
    "decode_online_action",
]


class QueueOrder(enum.StrEnum):
    """The order in which queued batch processes are considered for placement."""

    FIFO = "fifo"
    """Earliest release first."""
    SHORTEST_ESTIMATE = "shortest_estimate"
    """Smallest duration estimate first."""
    DOMINANT_SHARE = "dominant_share"
    """Smallest dominant resource share first: ``max(cpu / cluster cpu, memory / cluster batch memory)``."""


@dataclass(frozen=True, slots=True)
class Allocation:
    """One decision: online CPU quota per machine and the batch queue's rules.

    Attributes:
        online_quota: CPU reserved for online work per machine, cores, in the flow's machine order.
            The simulator caps each value at the machine's capacity.
        queue_order: A :class:`QueueOrder` or its value (``"fifo"``, ``"shortest_estimate"``,
            ``"dominant_share"``).
        admission_fraction: A process is placed on a machine only if the CPU requests of the
            processes running there plus its own stay within this fraction of the machine's
            batch CPU budget; in (0, 1].
    """

    online_quota: tuple[float, ...]
    queue_order: QueueOrder | str = QueueOrder.FIFO
    admission_fraction: float = 1.0

    def __post_init__(self) -> None:
        quota = tuple(map(float, self.online_quota))
        if not all(map(math.isfinite, quota)) or (quota and min(quota) < 0):
            for j, q in enumerate(quota):
                if not math.isfinite(q) or q < 0:
                    raise ValueError(f"online_quota[{j}] must be a finite number >= 0, got {q}")
        object.__setattr__(self, "online_quota", quota)
        try:
            object.__setattr__(self, "queue_order", QueueOrder(self.queue_order))
        except ValueError:
            choices = ", ".join(repr(o.value) for o in QueueOrder)
            raise ValueError(f"queue_order must be one of {choices}, got {self.queue_order!r}") from None
        fraction = float(self.admission_fraction)
        if not 0 < fraction <= 1:
            raise ValueError(f"admission_fraction must lie in (0, 1], got {fraction}")
        object.__setattr__(self, "admission_fraction", fraction)


@dataclass(frozen=True, slots=True)
class OnlineAction:
    """An online action: quota = current demand + ``margin`` × machine capacity, capped at capacity."""

    margin: float


@dataclass(frozen=True, slots=True)
class BatchAction:
    """A batch action: a queue order and a CPU admission fraction."""

    queue_order: QueueOrder
    admission_fraction: float


ONLINE_ACTIONS: tuple[OnlineAction, ...] = (OnlineAction(0.0), OnlineAction(0.1), OnlineAction(0.2))
"""The online action table: index → quota margin."""

BATCH_ACTIONS: tuple[BatchAction, ...] = (
    BatchAction(QueueOrder.FIFO, 0.75),
    BatchAction(QueueOrder.FIFO, 1.0),
    BatchAction(QueueOrder.SHORTEST_ESTIMATE, 0.75),
    BatchAction(QueueOrder.SHORTEST_ESTIMATE, 1.0),
    BatchAction(QueueOrder.DOMINANT_SHARE, 0.75),
    BatchAction(QueueOrder.DOMINANT_SHARE, 1.0),
)
"""The batch action table: index → (queue order, CPU admission)."""


def decode_online_action(
    action: int, demand: Sequence[float] | np.ndarray, machines: Sequence[Machine]
) -> tuple[float, ...]:
    """The online quota of ``action`` given the current demand per machine, cores.

    Raises:
        ValueError: If ``action`` is not in ``range(len(ONLINE_ACTIONS))``.
    """
    index = int(action)
    if not 0 <= index < len(ONLINE_ACTIONS):
        raise ValueError(f"online action must be in 0..{len(ONLINE_ACTIONS) - 1}, got {action}")
    return tuple(_online_quota(index, demand, machines).tolist())


def _online_quota(index: int, demand: Sequence[float] | np.ndarray, machines: Sequence[Machine]) -> np.ndarray:
    """The online quota of the (checked) action ``index``, as an array."""
    if len(demand) != len(machines):
        raise ValueError(f"demand gives {len(demand)} values for {len(machines)} machine(s)")
    # min(demand + margin × cores, cores) per machine, as whole-array float operations.
    cpu, margins = _cores(machines)
    return np.minimum(np.asarray(demand, dtype=float) + margins[index], cpu)


_last_quota: tuple[tuple[float, ...], np.ndarray, Sequence[Machine]] | None = None

# The slots' setters of an Allocation, in field order: what ``object.__setattr__`` calls, without its lookup.
_set_allocation = tuple(
    getattr(Allocation, name).__set__ for name in ("online_quota", "queue_order", "admission_fraction")
)


def capped_quota(allocation: Allocation, machines: Sequence[Machine], cpu: np.ndarray) -> np.ndarray:
    """``allocation.online_quota`` capped at ``cpu`` (the cores of ``machines``), as an array not to be written.

    :func:`decode_actions` keeps the array of its last result, already capped at the cores of the
    machines it was given: for those machines the array is the answer as it is, without another
    conversion or cap.
    """
    last = _last_quota
    if last is not None and last[0] is allocation.online_quota and last[2] is machines:
        return last[1]
    return np.minimum(np.array(allocation.online_quota, dtype=float), cpu)


_last_cores: tuple[Sequence[Machine], tuple[np.ndarray, list[np.ndarray]]] | None = None


def _cores(machines: Sequence[Machine]) -> tuple[np.ndarray, list[np.ndarray]]:
    """The machines' cores and each online action's margin × cores, as read-only arrays.

    Kept for the last sequence asked (one per episode).
    """
    global _last_cores
    last = _last_cores
    if last is not None and last[0] is machines and isinstance(machines, tuple):
        return last[1]
    cpu = np.array([m.cpu for m in machines], dtype=float)
    margins = [action.margin * cpu for action in ONLINE_ACTIONS]
    for array in (cpu, *margins):
        array.flags.writeable = False
    _last_cores = (machines, (cpu, margins))
    return cpu, margins


def decode_batch_action(action: int) -> BatchAction:
    """The queue order and CPU admission of batch ``action``.

    Raises:
        ValueError: If ``action`` is not in ``range(len(BATCH_ACTIONS))``.
    """
    index = int(action)
    if not 0 <= index < len(BATCH_ACTIONS):
        raise ValueError(f"batch action must be in 0..{len(BATCH_ACTIONS) - 1}, got {action}")
    return BATCH_ACTIONS[index]


def decode_actions(
    online_action: int,
    batch_action: int,
    demand: Sequence[float] | np.ndarray,
    machines: Sequence[Machine],
) -> Allocation:
    """One allocation from an online and a batch action, given the current demand per machine."""
    global _last_quota
    batch = decode_batch_action(batch_action)
    index = int(online_action)
    if not 0 <= index < len(ONLINE_ACTIONS):
        raise ValueError(f"online action must be in 0..{len(ONLINE_ACTIONS) - 1}, got {online_action}")
    quota = _online_quota(index, demand, machines)
    if not (quota.size and float(np.minimum.reduce(quota)) >= 0.0):
        # Empty, negative or NaN (the cap at the cores leaves no infinity): the checks say what is wrong.
        return Allocation(tuple(quota.tolist()), batch.queue_order, batch.admission_fraction)
    # Every value is a finite float >= 0 and the batch action is a valid table entry: what
    # ``Allocation.__post_init__`` checks and converts holds already.
    allocation = object.__new__(Allocation)
    online_quota = tuple(quota.tolist())
    set_quota, set_order, set_fraction = _set_allocation
    set_quota(allocation, online_quota)
    set_order(allocation, batch.queue_order)
    set_fraction(allocation, batch.admission_fraction)
    _last_quota = (online_quota, quota, machines)  # the array is ours alone: nothing writes to it
    return allocation
