"""Tests of the local executor's memory plumbing: cgroup files of v1 and v2, and the watchdog's samples."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from simrun_tracker.local.memory import CgroupPool, PodCgroup, anon_memory_by_group, open_cgroups


def fake_v2(tmp_path: Path, executor_id: str) -> Path:
    """A directory shaped like a cgroup v2 mount whose executor parent already shows its memory files."""
    root = tmp_path / "cgroup"
    (root / "simrun" / executor_id).mkdir(parents=True)
    (root / "cgroup.controllers").write_text("cpu io memory pids\n")
    (root / "simrun" / executor_id / "memory.max").write_text("max\n")
    return root


def test_v2_enables_the_memory_controller_down_to_the_executor(tmp_path: Path) -> None:
    pool = CgroupPool(fake_v2(tmp_path, "e1"), "e1")
    assert pool.version == 2
    for directory in (pool.root, pool.root / "simrun", pool.parent):
        assert (directory / "cgroup.subtree_control").read_text() == "+memory"


def test_v2_pod_cgroup_has_the_limit_no_swap_and_kills_as_a_group(tmp_path: Path, monkeypatch) -> None:
    pool = CgroupPool(fake_v2(tmp_path, "e1"), "e1")
    made: list[Path] = []
    original_mkdir = Path.mkdir

    def mkdir_with_kernel_files(self: Path, *args, **kwargs) -> None:
        original_mkdir(self, *args, **kwargs)
        if self.parent == pool.parent:
            made.append(self)
            for name in ("memory.swap.max", "memory.oom.group", "cgroup.procs"):
                (self / name).write_text("")

    monkeypatch.setattr(Path, "mkdir", mkdir_with_kernel_files)
    cgroup = pool.create("r1.t.w0.1", 3 * 1024**3)
    assert made == [cgroup.path]
    assert (cgroup.path / "memory.max").read_text() == str(3 * 1024**3)
    assert (cgroup.path / "memory.swap.max").read_text() == "0"
    assert (cgroup.path / "memory.oom.group").read_text() == "1"
    assert cgroup.oom_kills() is None
    (cgroup.path / "memory.events").write_text("low 0\nhigh 0\nmax 12\noom 1\noom_kill 1\noom_group_kill 1\n")
    assert cgroup.oom_kills() == 1
    assert cgroup.killed_for_memory(sigkilled=False)


def test_v1_evidence_falls_back_to_the_failcnt_of_a_sigkilled_pod(tmp_path: Path) -> None:
    cgroup = PodCgroup(tmp_path, 1)
    (tmp_path / "memory.failcnt").write_text("3\n")
    assert cgroup.killed_for_memory(sigkilled=True)
    assert not cgroup.killed_for_memory(sigkilled=False)
    (tmp_path / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 0\n")
    assert not cgroup.killed_for_memory(sigkilled=True)


def test_no_cgroups_where_the_root_cannot_hold_them(tmp_path: Path) -> None:
    assert open_cgroups(None, "e1") is None
    # A plain directory has no memory controller: the executor falls back to the watchdog.
    assert open_cgroups(tmp_path, "e1") is None


def test_the_watchdog_sums_the_anonymous_memory_of_a_process_group() -> None:
    script = (
        "import os, sys, time\n"
        "data = bytearray(64 * 1024 * 1024)\n"
        "for i in range(0, len(data), 4096): data[i] = 1\n"
        "if os.fork() == 0:\n"
        "    more = bytearray(32 * 1024 * 1024)\n"
        "    for i in range(0, len(more), 4096): more[i] = 1\n"
        "print('ready', flush=True)\n"
        "time.sleep(30)\n"
    )
    group = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, start_new_session=True)
    try:
        assert group.stdout is not None
        assert group.stdout.readline() == b"ready\n"
        assert group.stdout.readline() == b"ready\n"
        anon = anon_memory_by_group([group.pid, 999_999_999])
        # Parent 64 MiB, child its copy of the 64 MiB (copy-on-write pages count for each) and 32 MiB more.
        assert 150 * 1024**2 < anon[group.pid] < 260 * 1024**2
        assert anon[999_999_999] == 0
    finally:
        os.killpg(group.pid, 9)
        group.wait()
        assert group.stdout is not None
        group.stdout.close()
