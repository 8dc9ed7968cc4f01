"""The nodes of the local executor: this machine as one node by default, or the nodes of the server config."""

from __future__ import annotations

import math
import os
import socket
from pathlib import Path

from simrun_core.config import NodeConfig
from simrun_planner import Node

HEADROOM_GB = 1.0
"""GiB of the machine's memory left to the system and the services when the whole machine is one node."""


def machine_memory_gb(meminfo: Path = Path("/proc/meminfo")) -> float:
    """This machine's MemTotal, GiB."""
    for line in meminfo.read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) / 1024**2
    raise OSError(f"{meminfo} has no MemTotal")


def default_nodes() -> list[Node]:
    """One node named after the host with this machine's cores and its memory less a GiB of headroom, rounded down."""
    memory_gb = max(float(math.floor(machine_memory_gb() - HEADROOM_GB)), 0.5)
    return [Node(name=socket.gethostname() or "local", cores=os.cpu_count() or 1, memory_gb=memory_gb)]


def configured_nodes(nodes: list[NodeConfig] | None) -> list[Node] | None:
    """The nodes of a server config, or None for the default (this machine as one node)."""
    return [Node(name=n.name, cores=n.cores, memory_gb=n.memory_gb, gpus=n.gpus) for n in nodes or []] or None
