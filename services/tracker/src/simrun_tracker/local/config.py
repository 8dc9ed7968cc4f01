"""The nodes of the local executor: this machine as one node by default, or split into several by a config."""

from __future__ import annotations

import math
import os
import socket
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
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


class LocalNodeConfig(BaseModel):
    """One node of the local executor: a share of this machine."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$", description="The node's name.")
    cores: int = Field(ge=1, description="Cores, whole.")
    memory_gb: float = Field(gt=0, description="Memory, GiB.")
    gpus: int = Field(default=0, ge=0, description="GPUs.")

    def node(self) -> Node:
        return Node(name=self.name, cores=self.cores, memory_gb=self.memory_gb, gpus=self.gpus)


class LocalExecutorConfig(BaseModel):
    """The local executor's part of the server config.

    ```yaml
    nodes:                      # omitted or empty: this machine as one node
      - {name: node-a, cores: 2, memory_gb: 4}
      - {name: node-b, cores: 2, memory_gb: 4}
    cgroup_root: auto           # auto, a memory cgroup mount, or null for the watchdog only
    ```
    """

    model_config = ConfigDict(extra="forbid")

    nodes: list[LocalNodeConfig] = Field(default_factory=list, description="The nodes; empty for this machine.")
    cgroup_root: Literal["auto"] | Path | None = Field(
        default="auto", description="Where pod memory cgroups go: auto-detected, a mount, or null (watchdog only)."
    )
    poll_s: float = Field(default=0.1, gt=0, description="Seconds between two passes of the scheduler.")

    @field_validator("nodes")
    @classmethod
    def _unique_names(cls, nodes: list[LocalNodeConfig]) -> list[LocalNodeConfig]:
        names = [n.name for n in nodes]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"node names must be unique: {', '.join(duplicates)}")
        return nodes

    def node_list(self) -> list[Node] | None:
        """The configured nodes, or None for the default (this machine)."""
        return [n.node() for n in self.nodes] or None
