"""Worker reports (`tasks/<task>/workers/`) and the progress log (`tasks/<task>/progress.jsonl`).

A report is the record of one pod incarnation, from which the learner makes its observations: the key
(task type, model, cost value), the largest anonymous memory of the pod, its processes, its out-of-memory
kills and the seconds of the units it completed, as a summary of constant size (count, sum, extremes, a fixed
logarithmic histogram, and every unit's seconds while there are at most 64). It is written when the pod starts
(ended `running`), again every 10 s from a thread of its own without fsync, and last when it ends (with fsync); a
report still `running` after its pod is gone was killed (SIGKILL).
"""

from __future__ import annotations

import json
import math
import os
import stat
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from simrun_runtime.files import write_json_atomic
from simrun_runtime.layout import TaskLayout, UnsafePath, open_beneath, read_beneath
from simrun_runtime.ledger import IntervalSet, UnitRange

REPORT_SCHEMA = 2
# The histogram of unit seconds: bin b holds seconds in [2^(b/16), 2^((b+1)/16)), so a bin is 4.4% wide and its
# geometric middle is within 2.2% of every value in it; seconds below a microsecond count as one.
BINS_PER_OCTAVE = 16
MIN_SECONDS = 1e-6
# Every unit's seconds are kept exactly while a report has at most this many units.
EXACT_UNITS = 64


def seconds_bin(seconds: float) -> int:
    return math.floor(math.log2(max(seconds, MIN_SECONDS)) * BINS_PER_OCTAVE)


def bin_seconds(index: int) -> float:
    """The geometric middle of a bin of the histogram."""
    return 2.0 ** ((index + 0.5) / BINS_PER_OCTAVE)


@dataclass
class SecondsSketch:
    """Unit seconds accumulated at a constant cost per unit and a bounded size, mergeable across processes."""

    count: int = 0
    total: float = 0.0
    low: float = math.inf
    high: float = 0.0
    bins: dict[int, int] = dataclass_field(default_factory=dict)
    exact: list[float] | None = dataclass_field(default_factory=list)

    def add(self, seconds: float) -> None:
        self.count += 1
        self.total += seconds
        self.low = min(self.low, seconds)
        self.high = max(self.high, seconds)
        b = seconds_bin(seconds)
        self.bins[b] = self.bins.get(b, 0) + 1
        if self.exact is not None:
            self.exact.append(round(seconds, 6))
            if len(self.exact) > EXACT_UNITS:
                self.exact = None

    @classmethod
    def of(cls, seconds: list[float]) -> SecondsSketch:
        """The sketch of a list of seconds (one loop, no call per value beyond the logarithm)."""
        bins: dict[int, int] = {}
        log2, floor = math.log2, math.floor
        for value in seconds:
            b = floor(log2(value if value > MIN_SECONDS else MIN_SECONDS) * BINS_PER_OCTAVE)
            bins[b] = bins.get(b, 0) + 1
        exact = [round(value, 6) for value in seconds] if len(seconds) <= EXACT_UNITS else None
        if not seconds:
            return cls()
        return cls(len(seconds), sum(seconds), min(seconds), max(seconds), bins, exact)

    def merge(self, other: SecondsSketch) -> None:
        if not other.count:
            return
        self.count += other.count
        self.total += other.total
        self.low = min(self.low, other.low)
        self.high = max(self.high, other.high)
        for b, n in other.bins.items():
            self.bins[b] = self.bins.get(b, 0) + n
        if self.exact is not None and other.exact is not None and len(self.exact) + len(other.exact) <= EXACT_UNITS:
            self.exact.extend(other.exact)
        else:
            self.exact = None

    def summary(self) -> UnitSecondsSummary:
        return UnitSecondsSummary(
            count=self.count,
            sum=round(self.total, 6),
            min=round(self.low, 6) if self.count else None,
            max=round(self.high, 6) if self.count else None,
            bins=dict(sorted(self.bins.items())),
            exact=list(self.exact) if self.exact is not None else None,
        )


class UnitSecondsSummary(BaseModel):
    """The seconds of the units a pod computed, of constant size however many units it computed."""

    count: int = Field(default=0, description="Units computed (not counting units whose result was in place).")
    sum: float = Field(default=0.0, description="Their wall seconds, summed.")
    min: float | None = None
    max: float | None = None
    bins: dict[int, int] = Field(
        default_factory=dict,
        description="Histogram: bin b counts units of [2^(b/16), 2^((b+1)/16)) seconds (below 1 µs counts as 1 µs).",
    )
    exact: list[float] | None = Field(
        default_factory=list, description="Every unit's seconds while there are at most 64, else null."
    )

    def values(self) -> list[float]:
        """One value per unit: the exact seconds where kept, else each bin's geometric middle as often as it
        counts (within 2.2% of the unit's seconds), so a median over them is the median of the units to 2.2%."""
        if self.exact is not None:
            return list(self.exact)
        return [bin_seconds(b) for b, n in sorted(self.bins.items()) for _ in range(n)]


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
    units: list[UnitSeconds] = Field(
        default_factory=list, description="Schema 1: every unit and its seconds; empty in schema 2 reports."
    )
    unit_seconds: UnitSecondsSummary | None = Field(
        default=None, description="Schema 2: the summary of the seconds of the units this incarnation computed."
    )
    merged: bool = Field(default=False, description="This incarnation merged the task (coordinator, simrun-merge).")
    ended: WorkerEnd = WorkerEnd.RUNNING
    exit_code: int | None = None
    message: str = ""
    started_at: datetime
    ended_at: datetime | None = None
    traceparent: str | None = Field(default=None, description="The pod's TRACEPARENT: its span's parent in the trace.")

    def path(self, task: TaskLayout) -> Path:
        return report_path(task, self.worker, self.started_ms)

    def write(self, task: TaskLayout, fsync: bool = True) -> None:
        """Writes the report atomically (it replaces the earlier version of the same incarnation)."""
        write_json_atomic(self.path(task), self.model_dump(mode="json"), durable=fsync)

    def seconds_of_units(self) -> list[float]:
        """One value of seconds per unit computed, from either schema (see `UnitSecondsSummary.values`)."""
        if self.unit_seconds is not None:
            return self.unit_seconds.values()
        return [unit.seconds for unit in self.units]


def report_path(task: TaskLayout, worker: str, started_ms: int) -> Path:
    return task.workers / f"{worker}-{started_ms}.json"


REPORT_BYTES = 4 << 20
"""The most of a worker report the server reads (schema 2 is of constant size, a few KiB)."""


def load_reports(task: TaskLayout) -> list[WorkerReport]:
    """Every report of the task, oldest incarnation first; a link or what is not a regular file is no report.

    Raises:
        ValueError: a report that is not one (the task writes the folder).
    """
    if not task.workers.is_dir():
        return []
    reports = []
    for path in task.workers.glob("*.json"):
        if path.name.startswith("."):
            continue
        try:
            data = read_beneath(task.workers, path.name, limit=REPORT_BYTES)
        except (FileNotFoundError, UnsafePath):
            continue
        reports.append(WorkerReport.model_validate_json(data))
    return sorted(reports, key=lambda r: (r.started_ms, r.worker))


class ProgressLine(BaseModel):
    """One line of `progress.jsonl`: a claim marked done, one unit (`unit`) or several (`first` … `last`)."""

    unit: int | None = None
    first: int | None = None
    last: int | None = None
    worker: str
    seconds: float | None = Field(
        description="Wall seconds of its units, summed; None if an earlier incarnation had computed them all."
    )
    time: float = Field(description="When it was marked done, Unix epoch seconds.")

    @property
    def span(self) -> UnitRange:
        if self.unit is not None:
            return UnitRange.one(self.unit)
        if self.first is None or self.last is None:
            raise ValueError("a progress line names `unit` or `first` and `last`")
        return UnitRange(self.first, self.last)

    def units(self) -> range:
        return self.span.indices()


class ProgressLog:
    """Appends to `progress.jsonl`, one `O_APPEND` write per claim so lines of several pods never interleave."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def append(self, unit: int | UnitRange, worker: str, seconds: float | None, at: float) -> None:
        """One line: `{"unit", …}` for one unit (the format before ranges), `{"first", "last", …}` for several."""
        rounded = None if seconds is None else round(seconds, 6)
        if isinstance(unit, int) or unit.size == 1:
            where: dict[str, int] = {"unit": unit if isinstance(unit, int) else unit.first}
        else:
            where = {"first": unit.first, "last": unit.last}
        line = json.dumps(where | {"worker": worker, "seconds": rounded, "time": round(at, 3)})
        os.write(self._fd, (line + "\n").encode())

    def close(self) -> None:
        os.close(self._fd)


class ProgressReader:
    """Follows a `progress.jsonl` from where it last read: the distinct units done so far, each line read once.

    The file is in the task's folder, which the task writes: the server reads it for every GetRun and watch, so it
    opens it without following a link and only as a regular file (a FIFO, /dev/zero or another run's file behind a
    link is no progress), reads at most `READ_BYTES` a call in pieces of `PIECE_BYTES`, and skips what is not a
    progress line (a line longer than a piece, text that is not one).
    """

    PIECE_BYTES = 1 << 20
    READ_BYTES = 64 << 20

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0
        self._units = IntervalSet()
        self._skipping = False

    def units_done(self) -> int:
        """Distinct units in the file now (a unit computed twice is on two lines).

        A regular file no longer than what was read is not opened again (the server asks several times a second
        of every watched run): the file only grows, a line at a time.
        """
        try:
            seen = os.lstat(self.path)
        except FileNotFoundError:
            return self._units.total
        if stat.S_ISREG(seen.st_mode) and seen.st_size <= self._offset:
            return self._units.total
        try:
            fd = open_beneath(self.path.parent, self.path.name)
        except (FileNotFoundError, UnsafePath):
            return self._units.total
        with os.fdopen(fd, "rb") as f:
            f.seek(self._offset)
            for _ in range(self.READ_BYTES // self.PIECE_BYTES):
                data = f.read(self.PIECE_BYTES)
                if not self._take(data) or len(data) < self.PIECE_BYTES:
                    break
        return self._units.total

    def _take(self, data: bytes) -> bool:
        """Counts the complete lines of `data`, read at the offset; False when the rest must wait for more."""
        consumed = 0
        if self._skipping:
            end = data.find(b"\n")
            if end < 0:
                self._offset += len(data)
                return bool(data)
            consumed, self._skipping = end + 1, False
        complete = data.rfind(b"\n") + 1  # a line still being written is read next time
        if complete > consumed:
            for line in data[consumed:complete].splitlines():
                if line.strip():
                    try:
                        unit = ProgressLine.model_validate_json(line).span
                    except ValueError:
                        continue  # not a line the runtime wrote
                    self._units.add(unit.first, unit.last)
            consumed = complete
        elif consumed == 0 and len(data) == self.PIECE_BYTES:
            self._offset += len(data)  # one line longer than a piece: no progress line is; skip to its end
            self._skipping = True
            return True
        self._offset += consumed
        return consumed > 0


def read_progress(path: Path) -> list[ProgressLine]:
    if not path.exists():
        return []
    return [ProgressLine.model_validate_json(line) for line in path.read_text().splitlines() if line.strip()]


def utcnow() -> datetime:
    return datetime.now(UTC)
