"""A toy model for the runtime's tests: a split scan doing real numerical work per unit, and unsplit types."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field
from simrun_runtime import (
    ExecContext,
    MergeContext,
    ResourceHint,
    SplitTaskType,
    TaskSettings,
    UnitContext,
    UnsplitTaskType,
)


def hold_memory(megabytes: int, seconds: float) -> None:
    """Allocates and touches `megabytes` of anonymous memory and holds it for `seconds`."""
    block = bytearray(megabytes * 1024 * 1024)
    for offset in range(0, len(block), 4096):
        block[offset] = 1
    time.sleep(seconds)
    del block


class ScanSettings(TaskSettings):
    points: int = Field(default=16, ge=1, description="Units: one per point of the scan.")
    seed: float = 0.0
    steps: int = Field(default=4000, ge=1, description="Iterations of the logistic map per unit.")
    sleep_s: float = Field(default=0.0, description="Extra wall time per unit, so tests can stop pods mid-unit.")
    allocate_mb: int = 0
    hold_s: float = 0.0
    fail_unit: int | None = None
    hang_unit: int | None = Field(default=None, description="This unit hangs (the first time only with hang_once).")
    hang_once: str | None = Field(default=None, description="A file created by the first attempt at hang_unit.")
    hang_child: str | None = Field(default=None, description="hang_unit hangs in a `sleep` child; its pid goes here.")
    crash_unit: int | None = Field(default=None, description="This unit kills its process (once with crash_once).")
    crash_once: str | None = Field(default=None, description="A file created by the first attempt at crash_unit.")
    crash_how: str = Field(default="segv", description="`segv` (SIGSEGV), `abort` (SIGABRT) or `exit` (os._exit(3)).")
    say: bool = Field(default=False, description="Each unit prints a line to stdout and one to stderr.")
    signals_to: str | None = Field(default=None, description="Unit 0 writes how its subprocesses see SIGTERM, SIGINT.")
    merge_fails: str | None = Field(default=None, description="`raise` or `list`: the merge raises, returns a list.")


class Scan(SplitTaskType):
    """A scan of the logistic map's parameter r: each unit iterates the map for one r."""

    Settings = ScanSettings
    outputs = ("table",)
    resources = ResourceHint(base_memory_gb=0.25, per_worker_gb=0.1)
    cost_setting = "points"

    def count_units(self, settings: ScanSettings) -> int:
        return settings.points

    def compute_unit(self, settings: ScanSettings, index: int, unit: UnitContext) -> None:
        if settings.fail_unit == index:
            raise RuntimeError(f"unit {index} fails on purpose")
        if settings.say:
            print(f"hello from {index}")
            print(f"working on {index}", end="", file=sys.stderr)
            print("...", file=sys.stderr)
            subprocess.run([sys.executable, "-c", f"print('from a subprocess of {index}')"], check=True)
        if settings.crash_unit == index and (settings.crash_once is None or not Path(settings.crash_once).exists()):
            if settings.crash_once is not None:
                Path(settings.crash_once).touch()
            if settings.crash_how == "exit":
                os._exit(3)
            os.kill(os.getpid(), signal.SIGABRT if settings.crash_how == "abort" else signal.SIGSEGV)
        if settings.signals_to is not None and index == 0:
            probe = (
                "import signal; print(signal.getsignal(signal.SIGTERM) == signal.SIG_DFL, "
                "signal.getsignal(signal.SIGINT) is signal.default_int_handler)"
            )
            seen = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
            Path(settings.signals_to).write_text(seen.strip())
        if settings.hang_unit == index:
            first = settings.hang_once is None or not Path(settings.hang_once).exists()
            if settings.hang_once is not None:
                Path(settings.hang_once).touch()
            if first and settings.hang_child is not None:
                child = subprocess.Popen(["sleep", "600"])
                Path(settings.hang_child).write_text(str(child.pid))
                if child.wait() != 0:
                    raise RuntimeError(f"the unit's program ended with {child.returncode}")
            while first:
                time.sleep(3600)
        r = 3.5 + 0.5 * (index + 0.5) / settings.points
        x = 0.5 + 0.4 * math.sin(settings.seed + index)
        total = 0.0
        for _ in range(settings.steps):
            x = r * x * (1.0 - x)
            total += x
        (unit.scratch_dir / "trace.txt").write_text(repr(x))
        if settings.allocate_mb:
            hold_memory(settings.allocate_mb, settings.hold_s)
        if settings.sleep_s:
            time.sleep(settings.sleep_s)
        values = {"index": index, "r": r, "mean": total / settings.steps, "last": x}
        (unit.result_dir / "value.json").write_text(json.dumps(values, sort_keys=True))

    def merge(self, settings: ScanSettings, merge: MergeContext) -> dict[str, Any]:
        if settings.merge_fails == "raise":
            raise ValueError("the merge fails on purpose")
        rows = []
        for index, results in merge.units():
            values = json.loads((results / "value.json").read_text())
            assert values["index"] == index
            rows.append(values)
        lines = ["index,r,mean,last"] + [f"{v['index']},{v['r']!r},{v['mean']!r},{v['last']!r}" for v in rows]
        (merge.outputs["table"] / "table.csv").write_text("\n".join(lines) + "\n")
        if settings.merge_fails == "list":
            return [len(rows)]  # type: ignore[return-value]
        return {"points": len(rows), "total": sum(v["mean"] for v in rows), "max": max(v["mean"] for v in rows)}


class QuickHang(Scan):
    """The scan with a time limit of its own of one second per unit and two retries."""

    unit_timeout_s = 1.0
    unit_retries = 2


class TinySettings(TaskSettings):
    units: int = Field(default=1000, ge=1)
    seed: int = 0
    fail_unit: int | None = None
    spin_us: int = Field(default=0, ge=0, description="Busy wall time per unit, microseconds.")


class Tiny(SplitTaskType):
    """Units of a few microseconds that return their result instead of writing files."""

    Settings = TinySettings
    outputs = ("sum",)

    def count_units(self, settings: TinySettings) -> int:
        return settings.units

    def compute_unit(self, settings: TinySettings, index: int, unit: UnitContext) -> int:
        if settings.fail_unit == index:
            raise ArithmeticError(f"unit {index} cannot be computed")
        if settings.spin_us:
            until = time.perf_counter() + settings.spin_us / 1e6
            while time.perf_counter() < until:
                pass
        return (settings.seed * 7919 + index * index) % 1_000_003

    def merge(self, settings: TinySettings, merge: MergeContext) -> dict[str, Any]:
        values = [value for _, value in merge.values()]
        (merge.outputs["sum"] / "sum.txt").write_text(f"{sum(values)}\n")
        return {"units": len(values), "sum": sum(values), "first": values[0], "last": values[-1]}


class TotalSettings(TaskSettings):
    scale: float = 1.0
    sleep_s: float = 0.0
    allocate_mb: int = 0


class Total(UnsplitTaskType):
    """Sums the mean column of an upstream scan's table."""

    Settings = TotalSettings
    inputs = ("table",)
    outputs = ("report",)

    def run(self, settings: TotalSettings, context: ExecContext) -> dict[str, Any]:
        if settings.allocate_mb:
            hold_memory(settings.allocate_mb, 0.0)
        if settings.sleep_s:
            time.sleep(settings.sleep_s)
        lines = (context.inputs["table"] / "table.csv").read_text().splitlines()[1:]
        total = settings.scale * sum(float(line.split(",")[2]) for line in lines)
        (context.outputs["report"] / "total.txt").write_text(f"{total!r}\n")
        return {"rows": len(lines), "total": total}


SHELL_SCRIPT = """
import json, os, sys, time
settings = json.load(open(os.environ["SIMRUN_SETTINGS"]))
time.sleep(settings["sleep_s"])
if settings["exit_code"]:
    sys.exit(settings["exit_code"])
out = os.environ["SIMRUN_OUTPUT_RESULT_FILES"]
with open(os.path.join(out, "message.txt"), "w") as f:
    f.write(settings["message"] + " from " + os.getcwd() + "\\n")
with open(os.environ["SIMRUN_SUMMARY"], "w") as f:
    json.dump({"length": len(settings["message"]), "outputs": sorted(json.loads(os.environ["SIMRUN_OUTPUTS"]))}, f)
"""


class ShellSettings(TaskSettings):
    message: str = "hello"
    sleep_s: float = 0.0
    exit_code: int = 0


class Shell(UnsplitTaskType):
    """Runs an external command which reads its settings from $SIMRUN_SETTINGS."""

    Settings = ShellSettings
    outputs = ("result-files",)
    command: ClassVar[list[str]] = [sys.executable, "-c", SHELL_SCRIPT]


class LooseSettings(BaseModel):
    model_config = ConfigDict(extra="allow")
    points: int = 2


class Loose(Scan):
    """A type whose settings accept anything: refused when loaded."""

    Settings = LooseSettings  # type: ignore[assignment]


class NoRun(UnsplitTaskType):
    """An unsplit type with neither command nor run: refused when loaded."""

    Settings = TotalSettings


def module_path() -> Path:
    return Path(__file__).resolve()
