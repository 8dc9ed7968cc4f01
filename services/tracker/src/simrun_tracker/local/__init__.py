"""The local executor: the run tracker's pods as process groups on this machine, with Kueue's rules."""

from simrun_tracker.local.config import configured_nodes, default_nodes
from simrun_tracker.local.executor import LocalExecutor

__all__ = ["LocalExecutor", "configured_nodes", "default_nodes"]
