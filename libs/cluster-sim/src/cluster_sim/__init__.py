"""A discrete-event cluster simulator: process flows, allocations and the event-driven physics."""

from cluster_sim.allocation import (
    BATCH_ACTIONS,
    ONLINE_ACTIONS,
    Allocation,
    BatchAction,
    OnlineAction,
    QueueOrder,
    decode_actions,
    decode_batch_action,
    decode_online_action,
)
from cluster_sim.models import (
    CostBreakdown,
    ProcessState,
    ProcessStatus,
    QueueRow,
    SimulationObservation,
    SimulationReport,
)
from cluster_sim.processes import (
    BatchProcess,
    DemandSample,
    Machine,
    ProcessFlow,
    synthetic_process_flow,
)
from cluster_sim.simulator import ClusterSimulator, SimulatorConfig

__all__ = [
    "BATCH_ACTIONS",
    "ONLINE_ACTIONS",
    "Allocation",
    "BatchAction",
    "BatchProcess",
    "ClusterSimulator",
    "CostBreakdown",
    "DemandSample",
    "Machine",
    "OnlineAction",
    "ProcessFlow",
    "ProcessState",
    "ProcessStatus",
    "QueueOrder",
    "QueueRow",
    "SimulationObservation",
    "SimulationReport",
    "SimulatorConfig",
    "decode_actions",
    "decode_batch_action",
    "decode_online_action",
    "synthetic_process_flow",
]
