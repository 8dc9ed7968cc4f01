"""Tests of the allocation and the online and batch action tables."""

from __future__ import annotations

import numpy as np
import pytest
from cluster_sim import (
    BATCH_ACTIONS,
    ONLINE_ACTIONS,
    Allocation,
    Machine,
    QueueOrder,
    decode_actions,
    decode_batch_action,
    decode_online_action,
)
from cluster_sim.allocation import capped_quota

MACHINES = (Machine("a", cpu=10, memory=10), Machine("b", cpu=20, memory=10))


def test_online_actions_add_a_share_of_capacity_to_current_demand() -> None:
    demand = (2.0, 19.0)
    assert decode_online_action(0, demand, MACHINES) == (2.0, 19.0)
    assert decode_online_action(1, demand, MACHINES) == (3.0, 20.0)  # 19 + 2 capped at 20
    assert decode_online_action(2, demand, MACHINES) == (4.0, 20.0)
    assert [a.margin for a in ONLINE_ACTIONS] == [0.0, 0.1, 0.2]


def test_batch_action_table() -> None:
    table = [(decode_batch_action(k).queue_order, decode_batch_action(k).admission_fraction) for k in range(6)]
    assert table == [
        (QueueOrder.FIFO, 0.75),
        (QueueOrder.FIFO, 1.0),
        (QueueOrder.SHORTEST_ESTIMATE, 0.75),
        (QueueOrder.SHORTEST_ESTIMATE, 1.0),
        (QueueOrder.DOMINANT_SHARE, 0.75),
        (QueueOrder.DOMINANT_SHARE, 1.0),
    ]
    assert len(BATCH_ACTIONS) == 6


def test_decode_actions_builds_one_allocation() -> None:
    allocation = decode_actions(2, 3, (1.0, 1.0), MACHINES)
    assert allocation == Allocation((3.0, 5.0), "shortest_estimate", 1.0)


@pytest.mark.parametrize("action", [-1, 3])
def test_online_action_out_of_range(action: int) -> None:
    with pytest.raises(ValueError, match=r"online action must be in 0\.\.2"):
        decode_online_action(action, (0, 0), MACHINES)


def test_batch_action_out_of_range() -> None:
    with pytest.raises(ValueError, match=r"batch action must be in 0\.\.5"):
        decode_batch_action(6)


def test_allocation_validation() -> None:
    assert Allocation((1,), "fifo").queue_order is QueueOrder.FIFO
    with pytest.raises(ValueError, match="queue_order must be one of"):
        Allocation((1,), "lifo")
    with pytest.raises(ValueError, match=r"admission_fraction must lie in \(0, 1\]"):
        Allocation((1,), "fifo", 1.5)
    with pytest.raises(ValueError, match=r"online_quota\[0\]"):
        Allocation((-1,), "fifo")


def test_capped_quota_is_the_quota_capped_at_the_cores() -> None:
    cpu = np.array([10.0, 20.0])
    decoded = decode_actions(2, 1, [9.5, 3.0], MACHINES)
    # decode_actions' own array, already capped at these machines' cores.
    assert capped_quota(decoded, MACHINES, cpu) is capped_quota(decoded, MACHINES, cpu)
    assert capped_quota(decoded, MACHINES, cpu).tolist() == [10.0, 7.0]
    # Any other allocation, or another machine list, is converted and capped afresh.
    other_machines = (Machine("a", cpu=10, memory=10), Machine("b", cpu=5, memory=10))
    assert capped_quota(decoded, other_machines, np.array([10.0, 5.0])).tolist() == [10.0, 5.0]
    assert capped_quota(Allocation((12.0, 1.5)), MACHINES, cpu).tolist() == [10.0, 1.5]
