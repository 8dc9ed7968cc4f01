"""The local executor: the run tracker's pods as process groups on this machine, with Kueue's rules."""

from simrun_tracker.local.config import LocalExecutorConfig, LocalNodeConfig, default_nodes
from simrun_tracker.local.executor import LocalExecutor

__all__ = ["LocalExecutor", "LocalExecutorConfig", "LocalNodeConfig", "default_nodes"]
