"""The task types of the montecarlo model: EstimatePi and ConvergenceScan (split), Report (unsplit)."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import numpy as np
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

# Samples are drawn in blocks of this size so a unit's memory stays small whatever its sample count;
# the block size is fixed, so the draws (and the result) depend on the seed and the unit's index only.
_BLOCK = 1_000_000


def count_hits(rng: np.random.Generator, samples: int) -> int:
    """How many of `samples` uniform points of the unit square fall inside the quarter circle."""
    hits = 0
    remaining = samples
    while remaining > 0:
        n = min(remaining, _BLOCK)
        x = rng.random(n)
        y = rng.random(n)
        hits += int(np.count_nonzero(x * x + y * y <= 1.0))
        remaining -= n
    return hits


def pi_estimate(hits: int, samples: int) -> tuple[float, float]:
    """The estimate of pi from `hits` of `samples` and its standard error (binomial)."""
    p = hits / samples
    return 4.0 * p, 4.0 * math.sqrt(p * (1.0 - p) / samples)


def _write_json(path: Path, data: Any) -> None:
    # Written beside, then renamed, so a reader never sees half a file.
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    tmp.replace(path)


class EstimatePi(SplitTaskType):
    """Estimates pi by drawing points in the unit square; each unit draws `samples_per_unit` of them."""

    class Settings(TaskSettings):
        units: int = Field(default=8, ge=1, le=100_000, description="Number of units.")
        samples_per_unit: int = Field(default=500_000, ge=1, le=100_000_000, description="Points per unit.")
        seed: int = Field(default=0, ge=0, description="Seed; unit i draws from default_rng([seed, i]).")

    outputs = ("estimate",)
    resources = ResourceHint(base_memory_gb=0.25, per_worker_gb=0.25)
    cost_setting = "samples_per_unit"

    def count_units(self, settings: Settings) -> int:
        return settings.units

    def compute_unit(self, settings: Settings, index: int, unit: UnitContext) -> None:
        rng = np.random.default_rng([settings.seed, index])
        hits = count_hits(rng, settings.samples_per_unit)
        _write_json(unit.result_dir / "unit.json", {"index": index, "hits": hits, "samples": settings.samples_per_unit})

    def merge(self, settings: Settings, merge: MergeContext) -> dict[str, Any]:
        hits = samples = 0
        for _, result in merge.units():
            data = json.loads((result / "unit.json").read_text())
            hits += data["hits"]
            samples += data["samples"]
        pi, stderr = pi_estimate(hits, samples)
        estimate = {
            "pi": pi,
            "stderr": stderr,
            "hits": hits,
            "samples": samples,
            "units": merge.count,
            "seed": settings.seed,
        }
        _write_json(merge.outputs["estimate"] / "estimate.json", estimate)
        return {"pi": pi, "stderr": stderr, "samples": samples, "abs_error": abs(pi - math.pi)}


class ConvergenceScan(SplitTaskType):
    """Scans the sample count: point i estimates pi from `min_samples * 2**i` points, one unit per point."""

    class Settings(TaskSettings):
        points: int = Field(default=8, ge=1, le=24, description="Points of the scan, doubling the samples each.")
        min_samples: int = Field(default=10_000, ge=1, description="Samples of the first point.")
        seed: int = Field(default=0, ge=0, description="Seed; point i draws from default_rng([seed, i]).")

    outputs = ("scan",)
    resources = ResourceHint(base_memory_gb=0.25, per_worker_gb=0.25)

    def count_units(self, settings: Settings) -> int:
        return settings.points

    def compute_unit(self, settings: Settings, index: int, unit: UnitContext) -> None:
        samples = settings.min_samples * 2**index
        hits = count_hits(np.random.default_rng([settings.seed, index]), samples)
        pi, stderr = pi_estimate(hits, samples)
        point = {"index": index, "samples": samples, "hits": hits, "pi": pi, "stderr": stderr}
        _write_json(unit.result_dir / "point.json", point)

    def merge(self, settings: Settings, merge: MergeContext) -> dict[str, Any]:
        points = [json.loads((result / "point.json").read_text()) for _, result in merge.units()]
        for point in points:
            point["abs_error"] = abs(point["pi"] - math.pi)
        out = merge.outputs["scan"]
        _write_json(out / "scan.json", points)
        lines = ["samples,pi,stderr,abs_error"]
        lines += [f"{p['samples']},{p['pi']!r},{p['stderr']!r},{p['abs_error']!r}" for p in points]
        (out / "scan.csv").write_text("\n".join(lines) + "\n")
        last = points[-1]
        return {"points": len(points), "max_samples": last["samples"], "pi": last["pi"], "stderr": last["stderr"]}


class Report(UnsplitTaskType):
    """Writes a Markdown report of an EstimatePi result read from the input `estimate`."""

    class Settings(TaskSettings):
        title: str = Field(default="Monte Carlo estimate of pi", min_length=1)
        digits: int = Field(default=6, ge=1, le=15, description="Decimals shown.")

    inputs = ("estimate",)
    outputs = ("report",)
    resources = ResourceHint(base_memory_gb=0.25, per_worker_gb=0.25)

    def run(self, settings: Settings, context: ExecContext) -> dict[str, Any]:
        estimate = json.loads((context.inputs["estimate"] / "estimate.json").read_text())
        pi, stderr = estimate["pi"], estimate["stderr"]
        error = abs(pi - math.pi)
        # Within three standard errors holds for all but about 0.3% of seeds.
        consistent = error <= 3 * stderr
        d = settings.digits
        in_stderrs = f" ({error / stderr:.2f} standard errors)" if stderr else ""
        verdict = "consistent with pi" if consistent else "NOT within 3 standard errors of pi"
        text = "\n".join(
            [
                f"# {settings.title}",
                "",
                "| quantity | value |",
                "|---|---|",
                f"| estimate | {pi:.{d}f} |",
                f"| standard error | {stderr:.{d}f} |",
                f"| pi | {math.pi:.{d}f} |",
                f"| error | {error:.{d}f}{in_stderrs} |",
                f"| samples | {estimate['samples']} in {estimate['units']} units (seed {estimate['seed']}) |",
                "",
                f"The estimate is {verdict}.",
                "",
            ]
        )
        (context.outputs["report"] / "report.md").write_text(text)
        return {"pi": pi, "stderr": stderr, "consistent": consistent}
