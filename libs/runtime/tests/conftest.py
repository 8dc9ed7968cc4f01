"""Fixtures of the runtime's tests: the toy model, run directories laid out by hand, pods as real processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from simrun_runtime.layout import RunLayout, TaskLayout
from simrun_runtime.reports import WorkerReport, load_reports, read_progress
from simrun_runtime.rundir import lay_out_run

MODEL_ROOT = Path(__file__).parent / "model"
SCAN = "simrun_toymodel:Scan"


@dataclass
class Pods:
    """Lays out runs in a store under tmp_path and starts pods (`simrun-worker` etc.) as process groups."""

    store: Path

    model_root: Path = MODEL_ROOT

    def lay_out(
        self, run_id: str, task_id: str, type: str, settings: dict[str, Any], inputs: dict[str, str] | None = None
    ) -> RunLayout:
        return lay_out_run(self.store, run_id, task_id, type, settings, self.model_root, inputs)

    def env(
        self,
        run: RunLayout,
        task_id: str,
        worker: str | None = "w0",
        processes: int = 1,
        merge: bool = True,
        grace_s: float = 5,
        **extra: str,
    ) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SIMRUN_")}
        env.update(
            SIMRUN_RUN_DIR=str(run.root),
            SIMRUN_TASK=task_id,
            SIMRUN_PROCESSES=str(processes),
            SIMRUN_MERGE="1" if merge else "0",
            SIMRUN_GRACE_S=str(grace_s),
            SIMRUN_PROVENANCE=str(run.task(task_id).provenance),
        )
        if worker is not None:
            env["SIMRUN_WORKER"] = worker
        env.update(extra)
        return env

    def start(self, env: dict[str, str], module: str = "worker", args: tuple[str, ...] = ()) -> subprocess.Popen[str]:
        """A pod: its own process group, as a container would be."""
        return subprocess.Popen(
            [sys.executable, "-m", f"simrun_runtime.{module}", *args],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )

    def run(
        self, env: dict[str, str], module: str = "worker", args: tuple[str, ...] = (), timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", f"simrun_runtime.{module}", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )


@pytest.fixture
def pods(tmp_path: Path) -> Iterator[Pods]:
    started: list[subprocess.Popen[str]] = []
    pods = Pods(tmp_path / "store")
    original = pods.start

    def tracked(*args: Any, **kwargs: Any) -> subprocess.Popen[str]:
        process = original(*args, **kwargs)
        started.append(process)
        return process

    pods.start = tracked  # type: ignore[method-assign]
    yield pods
    for process in started:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        process.communicate()


def wait_for(condition: Callable[[], Any], timeout: float = 20, message: str = "condition") -> Any:
    """Polls `condition` until it returns something true."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {message}")


def finish(process: subprocess.Popen[str], timeout: float = 60) -> tuple[int, str, str]:
    out, err = process.communicate(timeout=timeout)
    return process.returncode, out, err


def reports_of(task: TaskLayout, worker: str | None = None) -> list[WorkerReport]:
    return [r for r in load_reports(task) if worker is None or r.worker == worker]


def merged_output(task: TaskLayout) -> dict[str, bytes]:
    """The merged output compared across runs: every file of the ports and summary.json (not the marker)."""
    files = {}
    for path in sorted(task.out.rglob("*")):
        if path.is_file() and path.name != ".merged":
            files[str(path.relative_to(task.out))] = path.read_bytes()
    return files


def progress_units(task: TaskLayout) -> list[int]:
    """Every unit of every line of progress.jsonl (a line names one unit or a range)."""
    return [index for line in read_progress(task.progress) for index in line.units()]


@pytest.fixture
def helpers() -> Any:
    """The module-level helpers, for test modules (which cannot import conftest under importlib mode)."""
    return SimpleNamespace(
        MODEL_ROOT=MODEL_ROOT,
        SCAN=SCAN,
        wait_for=wait_for,
        finish=finish,
        reports_of=reports_of,
        merged_output=merged_output,
        progress_units=progress_units,
    )
