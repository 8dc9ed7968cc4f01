"""Worker reports (`tasks/<task>/workers/`) and the progress log (`tasks/<task>/progress.jsonl`).

A report is the record of one pod incarnation, from which the learner makes its observations: the key
(task type, model, cost value), the largest anonymous memory of the pod, its processes, its out-of-memory
kills and the seconds of each unit it completed. It is written when the pod starts (ended `running`), again
while it runs, and last when it ends; a report still `running` after its pod is gone was killed (SIGKILL).
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from simrun_runtime.files import write_json_atomic
from simrun_runtime.layout import TaskLayout

REPORT_SCHEMA = 1


class WorkerEnd(StrEnum):
    """How a pod incarnation ended."""

    RUNNING = "running"
    DONE = "done"
    STOPPED = "stopped"
    FAILED = "failed"


class UnitSeconds(BaseModel):
    """A unit this pod computed and marked done, with the wall seconds it took in its process."""

    unit: int
    seconds: float


class WorkerReport(BaseModel):
    """The report of one pod incarnation: `workers/<worker>-<started epoch ms>.json`."""

    schema_version: int = REPORT_SCHEMA
    run_id: str
    task_id: str
    worker: str = Field(description="`w0` the coordinator, `w1`… extra workers, `exec` an unsplit task, `merge`.")
    role: Literal["coordinator", "extra", "exec", "merge"]
    started_ms: int = Field(description="Start, Unix epoch milliseconds; names the incarnation.")
    task_type: str
    cost_value: str | None = Field(default=None, description="The value of the type's cost_setting, as a string.")
    model: str | None = Field(default=None, description="The name of the model's snapshot (part of the learner's key).")
    processes: int = Field(description="Worker processes of the pod (SIMRUN_PROCESSES).")
    memory_source: Literal["cgroup_v1", "cgroup_v2", "process_tree"]
    peak_memory_gb: float = Field(
        description="The largest sample of the pod's anonymous memory, GiB, sampled every second."
    )
    per_process_gb: float = Field(description="peak_memory_gb / processes, GiB.")
    memory_samples: int = 0
    oom_kills: int | None = Field(
        default=None, description="Out-of-memory kills counted by the cgroup during this incarnation; None unknown."
    )
    units: list[UnitSeconds] = Field(default_factory=list)
    merged: bool = Field(default=False, description="This incarnation merged the task (coordinator, simrun-merge).")
    ended: WorkerEnd = WorkerEnd.RUNNING
    exit_code: int | None = None
    message: str = ""
    started_at: datetime
    ended_at: datetime | None = None
    traceparent: str | None = Field(default=None, description="The pod's TRACEPARENT: its span's parent in the trace.")

    def path(self, task: TaskLayout) -> Path:
        return report_path(task, self.worker, self.started_ms)

    def write(self, task: TaskLayout) -> None:
        """Writes the report atomically (it replaces the earlier version of the same incarnation)."""
        write_json_atomic(self.path(task), self.model_dump(mode="json"))


def report_path(task: TaskLayout, worker: str, started_ms: int) -> Path:
    return task.workers / f"{worker}-{started_ms}.json"


def load_reports(task: TaskLayout) -> list[WorkerReport]:
    """Every report of the task, oldest incarnation first."""
    if not task.workers.is_dir():
        return []
    reports = [
        WorkerReport.model_validate_json(path.read_text())
        for path in task.workers.glob("*.json")
        if not path.name.startswith(".")
    ]
    return sorted(reports, key=lambda r: (r.started_ms, r.worker))


class ProgressLine(BaseModel):
    """One line of `progress.jsonl`: a unit marked done."""

    unit: int
    worker: str
    seconds: float | None = Field(description="Wall seconds of the unit; None if an earlier incarnation computed it.")
    time: float = Field(description="When it was marked done, Unix epoch seconds.")


class ProgressLog:
    """Appends to `progress.jsonl`, one `O_APPEND` write per line so lines of several pods never interleave."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def append(self, unit: int, worker: str, seconds: float | None, at: float) -> None:
        rounded = None if seconds is None else round(seconds, 6)
        line = json.dumps({"unit": unit, "worker": worker, "seconds": rounded, "time": round(at, 3)})
        os.write(self._fd, (line + "\n").encode())

    def close(self) -> None:
        os.close(self._fd)


class ProgressReader:
    """Follows a `progress.jsonl` from where it last read: the distinct units done so far, each line read once."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0
        self._units: set[int] = set()

    def units_done(self) -> int:
        """Distinct units in the file now (a unit computed twice has two lines)."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return len(self._units)
        complete = data.rfind(b"\n") + 1  # a line still being written is read next time
        for line in data[:complete].splitlines():
            if line.strip():
                self._units.add(ProgressLine.model_validate_json(line).unit)
        self._offset += complete
        return len(self._units)


def read_progress(path: Path) -> list[ProgressLine]:
    if not path.exists():
        return []
    return [ProgressLine.model_validate_json(line) for line in path.read_text().splitlines() if line.strip()]


def utcnow() -> datetime:
    return datetime.now(UTC)
