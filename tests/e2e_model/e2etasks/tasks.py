"""Task types whose behaviour the end-to-end tests steer by their settings."""

from __future__ import annotations

import csv
import json
import time
from typing import Any

from pydantic import Field
from simrun_runtime import (
    ExecContext,
    MergeContext,
    ResourceHint,
    SplitTaskType,
    TaskSettings,
    UnitContext,
    UnsplitTaskType,
)


def unit_value(seed: int, index: int) -> int:
    """What unit `index` computes: depends on the settings and the index only."""
    return (seed * 7919 + index * index * 104729) % 1_000_003


class SlowSettings(TaskSettings):
    units: int = 8
    seconds: float = 0.2
    seed: int = 0


class Slow(SplitTaskType):
    """Units that each take `seconds` of wall time and produce a number; the merge sums them."""

    Settings = SlowSettings
    outputs = ("values",)
    resources = ResourceHint(base_memory_gb=0.25, per_worker_gb=0.25)

    def count_units(self, settings: SlowSettings) -> int:
        return settings.units

    def compute_unit(self, settings: SlowSettings, index: int, unit: UnitContext) -> None:
        time.sleep(settings.seconds)
        (unit.result_dir / "value.json").write_text(json.dumps({"value": unit_value(settings.seed, index)}))

    def merge(self, settings: SlowSettings, merge: MergeContext) -> dict[str, Any]:
        values = [json.loads((path / "value.json").read_text())["value"] for _, path in merge.units()]
        (merge.outputs["values"] / "values.json").write_text(json.dumps(values))
        return {"total": sum(values), "units": len(values)}


class HogSettings(TaskSettings):
    units: int = 1
    mib: int = 1536


class Hog(SplitTaskType):
    """Each unit touches `mib` MiB of anonymous memory."""

    Settings = HogSettings
    outputs = ("sizes",)
    resources = ResourceHint(base_memory_gb=0.5, per_worker_gb=0.5)
    cost_setting = "mib"

    def count_units(self, settings: HogSettings) -> int:
        return settings.units

    def compute_unit(self, settings: HogSettings, index: int, unit: UnitContext) -> None:
        block = bytearray(settings.mib * 1024 * 1024)
        for offset in range(0, len(block), 4096):
            block[offset] = 1
        time.sleep(0.3)
        (unit.result_dir / "size.json").write_text(json.dumps({"mib": len(block) // (1024 * 1024)}))

    def merge(self, settings: HogSettings, merge: MergeContext) -> dict[str, Any]:
        sizes = [json.loads((path / "size.json").read_text())["mib"] for _, path in merge.units()]
        (merge.outputs["sizes"] / "sizes.json").write_text(json.dumps(sizes))
        return {"mib": sum(sizes)}


class SumSettings(TaskSettings):
    fail: bool = False
    offset: int = 0


class Sum(UnsplitTaskType):
    """Reads the values of a Slow task and writes their total; fails on request."""

    Settings = SumSettings
    inputs = ("values",)
    outputs = ("total",)

    def run(self, settings: SumSettings, context: ExecContext) -> dict[str, Any]:
        if settings.fail:
            raise SystemExit(3)
        values = json.loads((context.inputs["values"] / "values.json").read_text())
        total = sum(values) + settings.offset
        (context.outputs["total"] / "total.json").write_text(json.dumps(total))
        return {"total": total}


class GridSettings(TaskSettings):
    xs: list[float] = Field(default_factory=lambda: [1.0, 2.0])
    ys: list[float] = Field(default_factory=lambda: [1.0, 2.0])
    seconds: float = 0.0
    note: str = ""
    fail_with: str = ""
    parquet: bool = False


class Grid(SplitTaskType):
    """A two-parameter scan: unit i is the point (xs[i % len(xs)], ys[i // len(xs)]), its value x*x + y; the merge
    writes grid.csv (x, y, value, note), one row per unit (and the same as grid.parquet with `parquet`, where
    pyarrow is installed), and fails with `fail_with` as its message when set."""

    Settings = GridSettings
    outputs = ("grid",)
    resources = ResourceHint(base_memory_gb=0.25, per_worker_gb=0.25)

    def count_units(self, settings: GridSettings) -> int:
        return len(settings.xs) * len(settings.ys)

    def compute_unit(self, settings: GridSettings, index: int, unit: UnitContext) -> None:
        x, y = settings.xs[index % len(settings.xs)], settings.ys[index // len(settings.xs)]
        print(f"unit {index}: x={x} y={y} {settings.note}", flush=True)
        time.sleep(settings.seconds)
        (unit.result_dir / "point.json").write_text(json.dumps({"x": x, "y": y, "value": x * x + y}))

    def merge(self, settings: GridSettings, merge: MergeContext) -> dict[str, Any]:
        if settings.fail_with:
            raise RuntimeError(settings.fail_with)
        points = [json.loads((path / "point.json").read_text()) for _, path in merge.units()]
        with (merge.outputs["grid"] / "grid.csv").open("w", newline="") as table:
            writer = csv.writer(table, lineterminator="\n")
            writer.writerow(["x", "y", "value", "note"])
            writer.writerows([p["x"], p["y"], p["value"], settings.note] for p in points)
        if settings.parquet:
            import pyarrow as pa
            import pyarrow.parquet as pq

            columns = {name: [p[name] for p in points] for name in ("x", "y", "value")}
            pq.write_table(
                pa.table({**columns, "note": [settings.note] * len(points)}), merge.outputs["grid"] / "grid.parquet"
            )
        return {"max": max(p["value"] for p in points), "points": len(points), "note": settings.note}
