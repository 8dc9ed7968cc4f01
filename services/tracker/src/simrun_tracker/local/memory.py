"""Memory limits of local pods: a memory cgroup per pod (v1 or v2) where the machine allows, else a watchdog."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from simrun_runtime.memory import MemoryProbe

logger = logging.getLogger(__name__)

GIB = 1024**3
LIMIT_REACHED_SLACK = 1 << 20
"""Bytes below its limit at which a v1 cgroup counts as having reached it: a charge that fails is not counted."""
CGROUP_MOUNT = Path("/sys/fs/cgroup")


def detect_cgroup_root() -> Path | None:
    """The memory cgroup hierarchy of this machine: v2's unified mount with the memory controller, else v1's."""
    controllers = CGROUP_MOUNT / "cgroup.controllers"
    with contextlib.suppress(OSError):
        if "memory" in controllers.read_text().split():
            return CGROUP_MOUNT
    if (CGROUP_MOUNT / "memory" / "memory.limit_in_bytes").exists():
        return CGROUP_MOUNT / "memory"
    return None


@dataclass
class PodCgroup:
    """The memory cgroup of one attempt of a pod."""

    path: Path
    version: int
    nested: bool = False
    """Its processes are in cgroups below it (a container's, made by the container runtime under it)."""

    @property
    def procs_file(self) -> Path:
        return self.path / "cgroup.procs"

    def pids(self) -> list[int]:
        try:
            return [int(line) for line in self.procs_file.read_text().split()]
        except (OSError, ValueError):
            return []

    def oom_kills(self) -> int | None:
        """Processes the kernel's OOM killer killed in this cgroup; None where the kernel does not count them."""
        name = "memory.oom_control" if self.version == 1 else "memory.events"
        try:
            text = (self.path / name).read_text()
        except OSError:
            return None
        match = re.search(r"^oom_kill (\d+)$", text, re.MULTILINE)
        return int(match.group(1)) if match else None

    def killed_for_memory(self, sigkilled: bool) -> bool:
        """The kernel killed a process of the cgroup for memory.

        Args:
            sigkilled: the pod ended by SIGKILL; where the kernel counts no OOM kills (v1 before 4.13), that and
                the cgroup having hit its limit (`memory.failcnt`) are the evidence.
        """
        kills = self.oom_kills()
        if kills:
            return True
        if not sigkilled or self.version != 1 or (kills is not None and not self.nested):
            return False
        # Where v1 counts the kill in the child cgroup the container runtime removed with the container, the pod's
        # own cgroup saw its limit reached: it alone holds the limit of everything below it.
        return (
            self._counted("memory.failcnt") > 0
            or self._counted("memory.max_usage_in_bytes")
            >= (self._counted("memory.limit_in_bytes") - LIMIT_REACHED_SLACK)
            > 0
        )

    def _counted(self, name: str) -> int:
        try:
            return int((self.path / name).read_text())
        except (OSError, ValueError):
            return 0

    def anon_bytes(self) -> int | None:
        """The cgroup's anonymous memory now, bytes, read as the pod's runtime reads it (`MemoryProbe`); None
        where it cannot be read. Page cache and tmpfs are not in it."""
        try:
            return MemoryProbe("cgroup_v1" if self.version == 1 else "cgroup_v2", self.path).sample()
        except (OSError, KeyError):
            return None

    def peak_bytes(self) -> int | None:
        """The largest memory use of the cgroup, bytes, where the kernel records it."""
        name = "memory.max_usage_in_bytes" if self.version == 1 else "memory.peak"
        try:
            return int((self.path / name).read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def remove(self, timeout_s: float = 5.0) -> None:
        """Kills what is left in the cgroup and in cgroups below it, and removes them."""
        deadline = time.monotonic() + timeout_s
        with contextlib.suppress(OSError):
            for child in self.path.iterdir():
                if child.is_dir():
                    PodCgroup(child, self.version).remove(max(deadline - time.monotonic(), 0.1))
        while True:
            for pid in self.pids():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError as exc:
                if time.monotonic() > deadline:
                    logger.warning("cannot remove the cgroup %s: %s", self.path, exc)
                    return
                time.sleep(0.02)


class CgroupPool:
    """The executor's parent cgroup (`<root>/simrun/<executor_id>`) and the pod cgroups below it."""

    def __init__(self, root: Path, executor_id: str) -> None:
        self.root = root
        self.version = 2 if (root / "cgroup.controllers").exists() else 1
        self.parent = root / "simrun" / executor_id
        self.parent.mkdir(parents=True, exist_ok=True)
        self._remove_stale()
        if self.version == 2:
            # cgroup v2 hands a controller down only where every ancestor enables it for its children.
            for directory in (root, root / "simrun", self.parent):
                (directory / "cgroup.subtree_control").write_text("+memory")
        limit_file = "memory.limit_in_bytes" if self.version == 1 else "memory.max"
        if not (self.parent / limit_file).exists():
            raise OSError(f"{self.parent} has no {limit_file}: the memory controller is not available there")

    def _remove_stale(self) -> None:
        """Removes the cgroups of executors whose process has died (a server that crashed), with their pods."""
        for other in (self.root / "simrun").iterdir():
            match = re.fullmatch(r"(\d+)-[0-9a-f]+", other.name)
            if other == self.parent or not match or not other.is_dir() or _alive(int(match.group(1))):
                continue
            logger.warning("removing the cgroups of a dead executor, and the pods left in them: %s", other)
            for child in other.iterdir():
                if child.is_dir():
                    PodCgroup(child, self.version).remove()
            with contextlib.suppress(OSError):
                other.rmdir()

    def create(self, name: str, limit_bytes: int, nested: bool = False) -> PodCgroup:
        """A new cgroup for one attempt of a pod, with `limit_bytes` as its hard memory limit and no swap;
        `nested`: a container runtime puts the pod's processes in cgroups below it."""
        path = self.parent / name
        path.mkdir()
        cgroup = PodCgroup(path, self.version, nested)
        try:
            if self.version == 1:
                (path / "memory.limit_in_bytes").write_text(str(limit_bytes))
                if (path / "memory.memsw.limit_in_bytes").exists():
                    (path / "memory.memsw.limit_in_bytes").write_text(str(limit_bytes))
            else:
                (path / "memory.max").write_text(str(limit_bytes))
                if (path / "memory.swap.max").exists():
                    (path / "memory.swap.max").write_text("0")
                # As the kubelet does on cgroup v2: an OOM kill takes the whole pod, not one process of it.
                if (path / "memory.oom.group").exists():
                    (path / "memory.oom.group").write_text("1")
        except OSError:
            cgroup.remove()
            raise
        return cgroup

    def close(self) -> None:
        """Removes the executor's cgroups (killing anything left in them) and `simrun/` once no executor uses it."""
        if self.parent.exists():
            for child in self.parent.iterdir():
                if child.is_dir():
                    PodCgroup(child, self.version).remove()
            with contextlib.suppress(OSError):
                self.parent.rmdir()
        with contextlib.suppress(OSError):
            self.parent.parent.rmdir()


def open_cgroups(root: Path | None, executor_id: str) -> CgroupPool | None:
    """The executor's cgroups under `root`, or None (the watchdog then enforces limits) where they cannot be made."""
    if root is None:
        return None
    try:
        return CgroupPool(root, executor_id)
    except OSError as exc:
        logger.warning("no memory cgroups under %s (%s): limits are enforced by the watchdog", root, exc)
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def anon_memory_by_group(pgids: Iterable[int], proc: Path = Path("/proc")) -> dict[int, int]:
    """The anonymous memory (sum of RssAnon, bytes) of the processes of each process group in `pgids`."""
    wanted = set(pgids)
    totals = dict.fromkeys(wanted, 0)
    if not wanted:
        return totals
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            # The command name may hold spaces and parentheses; the fields after its last ')' do not.
            pgid = int(stat[stat.rindex(")") + 2 :].split()[2])
            if pgid not in wanted:
                continue
            status = (entry / "status").read_text()
        except (OSError, ValueError, IndexError):
            continue
        match = re.search(r"^RssAnon:\s+(\d+) kB$", status, re.MULTILINE)
        if match:
            totals[pgid] += int(match.group(1)) * 1024
    return totals
