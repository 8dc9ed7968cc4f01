"""Memory in the reports: a real cgroup v1 (peak anonymous memory, out-of-memory kills) and the process tree."""

from __future__ import annotations

import os
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from simrun_runtime.memory import MemoryProbe, own_cgroup, process_tree_anon
from simrun_runtime.reports import WorkerEnd

CGROUP_V1 = Path("/sys/fs/cgroup/memory")
SCAN = "simrun_toymodel:Scan"


@pytest.fixture
def cgroup() -> Iterator[Path]:
    """A fresh child memory cgroup (v1); the test is skipped where one cannot be created."""
    path = CGROUP_V1 / f"simrun-test-{uuid.uuid4().hex[:8]}"
    try:
        path.mkdir()
    except OSError as exc:
        pytest.skip(f"cannot create a memory cgroup v1 here: {exc}")
    yield path
    deadline = time.monotonic() + 10
    while True:
        try:
            path.rmdir()
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def in_cgroup(pods: Any, env: dict[str, str], cgroup: Path) -> Any:
    """Runs the worker as the first process of the cgroup, as a container's entry point would be."""
    script = f'echo $$ > {cgroup}/cgroup.procs && exec "{sys.executable}" -m simrun_runtime.worker'
    import subprocess

    return subprocess.run(["sh", "-c", script], env=env, capture_output=True, text=True, timeout=60)


def test_the_report_has_the_peak_anonymous_memory_of_the_pods_cgroup(pods: Any, helpers: Any, cgroup: Path) -> None:
    run = pods.lay_out("cgroup", "scan", SCAN, {"points": 2, "allocate_mb": 160, "hold_s": 1.6})
    done = in_cgroup(pods, pods.env(run, "scan", processes=1, SIMRUN_CGROUP=str(cgroup)), cgroup)
    assert done.returncode == 0, done.stderr
    (report,) = helpers.reports_of(run.task("scan"))
    assert report.memory_source == "cgroup_v1" and report.oom_kills == 0
    assert 160 / 1024 <= report.peak_memory_gb < 0.5
    assert report.per_process_gb == report.peak_memory_gb and report.memory_samples >= 3
    assert report.unit_seconds.count == 2 and report.unit_seconds.min >= 1.6
    assert all(seconds >= 1.6 for seconds in report.seconds_of_units())


def test_a_unit_killed_for_memory_exits_137_and_the_report_counts_the_kill(
    pods: Any, helpers: Any, cgroup: Path
) -> None:
    (cgroup / "memory.limit_in_bytes").write_text(str(120 * 1024 * 1024))
    run = pods.lay_out("oom", "scan", SCAN, {"points": 2, "allocate_mb": 300})
    done = in_cgroup(pods, pods.env(run, "scan", processes=1, SIMRUN_CGROUP=str(cgroup)), cgroup)
    assert done.returncode == 137, done.stderr
    (report,) = helpers.reports_of(run.task("scan"))
    assert report.ended == WorkerEnd.FAILED and report.exit_code == 137 and report.oom_kills and report.oom_kills >= 1
    assert "died" in report.message


def test_without_a_cgroup_the_process_tree_is_measured(pods: Any, helpers: Any) -> None:
    run = pods.lay_out("tree", "scan", SCAN, {"points": 2, "allocate_mb": 120, "hold_s": 1.3})
    done = pods.run(pods.env(run, "scan", processes=2))
    assert done.returncode == 0, done.stderr
    (report,) = helpers.reports_of(run.task("scan"))
    assert report.memory_source == "process_tree" and report.oom_kills is None
    # Both processes hold 120 MiB at once.
    assert 2 * 120 / 1024 <= report.peak_memory_gb < 1.0
    assert report.per_process_gb == pytest.approx(report.peak_memory_gb / 2, abs=1e-5)


def test_probes_fall_back_to_the_process_tree_and_find_their_own_cgroup(tmp_path: Path) -> None:
    assert MemoryProbe.for_pod(str(tmp_path / "no-such-cgroup")).source == "process_tree"
    assert MemoryProbe.for_pod(None).source == "process_tree"
    assert process_tree_anon(os.getpid()) > 0
    proc = tmp_path / "cgroup"
    proc.write_text("4:memory:/kubepods/pod1\n0::/\n")
    (tmp_path / "root" / "memory" / "kubepods" / "pod1").mkdir(parents=True)
    assert own_cgroup(proc, tmp_path / "root") == tmp_path / "root" / "memory" / "kubepods" / "pod1"
    v2 = tmp_path / "cgroup2"
    v2.write_text("0::/kubepods/pod2\n")
    (tmp_path / "root" / "kubepods" / "pod2").mkdir(parents=True)
    (tmp_path / "root" / "kubepods" / "pod2" / "memory.stat").write_text("anon 4096\nfile 10\n")
    (tmp_path / "root" / "kubepods" / "pod2" / "memory.events").write_text("oom 1\noom_kill 2\n")
    found = own_cgroup(v2, tmp_path / "root")
    assert found == tmp_path / "root" / "kubepods" / "pod2"
    probe = MemoryProbe.for_pod(str(found))
    assert probe.source == "cgroup_v2" and probe.sample() == 4096 and probe.oom_kills() == 2
