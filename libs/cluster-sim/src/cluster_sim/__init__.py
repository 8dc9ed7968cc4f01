"""A discrete-event cluster simulator: process flows, allocations and the event-driven physics.

:data:`BUILD` says which build of the hot modules runs: compiled by mypyc when installed, or the
pure-Python source (where nothing was compiled, or the source changed since; see ``_build``).
"""

from cluster_sim._build import SELECTED as _SELECTED  # first: it chooses the build before the imports below
from cluster_sim._build import Build, confirm
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

BUILD: Build = confirm(_SELECTED, __name__)
"""The build of the simulator in use: ``BUILD.compiled`` (bool), ``BUILD.name`` and ``BUILD.detail``."""

__all__ = [
    "BATCH_ACTIONS",
    "BUILD",
    "ONLINE_ACTIONS",
    "Allocation",
    "BatchAction",
    "BatchProcess",
    "Build",
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
