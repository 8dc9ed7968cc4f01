"""Measuring a pod's anonymous memory (its cgroup, else its process tree) and counting its out-of-memory kills."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

MemorySource = Literal["cgroup_v1", "cgroup_v2", "process_tree"]
CGROUP_ROOT = Path("/sys/fs/cgroup")
GIB = 1024**3


def _stat_values(path: Path) -> dict[str, int]:
    values = {}
    for line in path.read_text().splitlines():
        key, _, value = line.partition(" ")
        if value.strip().lstrip("-").isdigit():
            values[key] = int(value)
    return values


def own_cgroup(proc_cgroup: Path = Path("/proc/self/cgroup"), root: Path = CGROUP_ROOT) -> Path | None:
    """The memory cgroup directory of this process (v1 `memory` controller, else the v2 unified one)."""
    unified = None
    for line in proc_cgroup.read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            candidate = root / "memory" / path.lstrip("/")
            if candidate.is_dir():
                return candidate
        if controllers == "":
            unified = root / path.lstrip("/")
    if unified is not None and (unified / "memory.stat").exists():
        return unified
    return None


@dataclass
class MemoryProbe:
    """Reads the anonymous memory in bytes of a cgroup, or of a process tree where no cgroup can be read."""

    source: MemorySource
    cgroup: Path | None = None
    root_pid: int = 0

    @classmethod
    def for_pod(cls, cgroup: str | None, root_pid: int | None = None) -> MemoryProbe:
        """The probe for `SIMRUN_CGROUP`: a cgroup directory, `self` for the process's own cgroup, or unset for
        the process tree of `root_pid` (this process by default). A cgroup which cannot be read falls back to
        the process tree."""
        pid = os.getpid() if root_pid is None else root_pid
        path: Path | None = None
        if cgroup == "self":
            try:
                path = own_cgroup()
            except OSError:
                path = None
        elif cgroup:
            path = Path(cgroup)
        if path is not None and (path / "memory.stat").is_file():
            v2 = (path / "memory.events").is_file() or (path / "cgroup.controllers").is_file()
            probe = cls("cgroup_v2" if v2 else "cgroup_v1", path, pid)
            try:
                probe.sample()
                return probe
            except (OSError, KeyError):
                pass
        return cls("process_tree", None, pid)

    def sample(self) -> int:
        """Anonymous memory, bytes."""
        if self.source == "cgroup_v1":
            # total_rss already counts transparent huge pages (total_rss_huge is the part of it that is huge),
            # per the kernel's cgroup-v1 memory documentation, so adding both would count them twice.
            return _stat_values(self.cgroup / "memory.stat")["total_rss"]  # type: ignore[operator]
        if self.source == "cgroup_v2":
            return _stat_values(self.cgroup / "memory.stat")["anon"]  # type: ignore[operator]
        return process_tree_anon(self.root_pid)

    def oom_kills(self) -> int | None:
        """Processes of the cgroup killed by the out-of-memory killer, None where the cgroup does not tell."""
        try:
            if self.source == "cgroup_v1":
                return _stat_values(self.cgroup / "memory.oom_control").get("oom_kill")  # type: ignore[operator]
            if self.source == "cgroup_v2":
                return _stat_values(self.cgroup / "memory.events").get("oom_kill")  # type: ignore[operator]
        except OSError:
            return None
        return None


def _children() -> dict[int, list[int]]:
    """Every process's children, from the parent pids in /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # The command name may contain spaces and parentheses; the fields after its last ')' do not.
        fields = stat[stat.rindex(b")") + 2 :].split()
        children.setdefault(int(fields[1]), []).append(int(entry.name))
    return children


def descendants(root_pid: int) -> list[int]:
    """The pids of every descendant of `root_pid` (not itself), from /proc."""
    children = _children()
    found: list[int] = []
    stack = list(children.get(root_pid, ()))
    while stack:
        pid = stack.pop()
        found.append(pid)
        stack.extend(children.get(pid, ()))
    return found


def kill_tree(root_pid: int) -> None:
    """SIGKILLs `root_pid` and every descendant it has now (a unit's solver, a simulator binary): killed alone,
    those would be orphaned and go on computing."""
    for pid in [root_pid, *descendants(root_pid)]:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def process_tree_anon(root_pid: int) -> int:
    """The sum of RssAnon (bytes) of `root_pid` and all its descendants, from /proc."""
    children = _children()
    total = 0
    stack = [root_pid]
    while stack:
        pid = stack.pop()
        stack.extend(children.get(pid, ()))
        try:
            with open(f"/proc/{pid}/status", "rb") as f:
                for line in f:
                    if line.startswith(b"RssAnon:"):
                        total += int(line.split()[1]) * 1024
                        break
        except OSError:
            continue
    return total


class MemorySampler:
    """Samples a probe every `interval_s` in a daemon thread and keeps the largest sample."""

    def __init__(self, probe: MemoryProbe, interval_s: float = 1.0) -> None:
        self.probe = probe
        self.interval_s = interval_s
        self.peak_bytes = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="simrun-memory", daemon=True)

    def start(self) -> MemorySampler:
        self.sample()
        self._thread.start()
        return self

    def sample(self) -> None:
        try:
            value = self.probe.sample()
        except (OSError, KeyError, ValueError):
            return
        self.samples += 1
        self.peak_bytes = max(self.peak_bytes, value)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        self.sample()

    @property
    def peak_gb(self) -> float:
        return self.peak_bytes / GIB
