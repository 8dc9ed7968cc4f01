"""The task types of the odescan model: PredatorPreyScan (split over a grid of parameters)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import Field
from scipy.integrate import solve_ivp
from scipy.signal import find_peaks
from simrun_runtime import MergeContext, ResourceHint, SplitTaskType, TaskSettings, UnitContext


def lotka_volterra(t: float, y: np.ndarray, alpha: float, beta: float, delta: float, gamma: float) -> list[float]:
    """dx/dt = alpha x - beta x y (prey), dy/dt = delta x y - gamma y (predators)."""
    prey, predators = y
    return [alpha * prey - beta * prey * predators, delta * prey * predators - gamma * predators]


def simulate(alpha: float, beta: float, delta: float, gamma: float, t_end: float, points: int) -> dict[str, float]:
    """Solves one parameter point with LSODA and measures the prey's oscillation: period, peak and trough."""
    t = np.linspace(0.0, t_end, points)
    solution = solve_ivp(
        lotka_volterra,
        (0.0, t_end),
        [10.0, 5.0],
        args=(alpha, beta, delta, gamma),
        t_eval=t,
        method="LSODA",
        rtol=1e-8,
        atol=1e-10,
    )
    if not solution.success:
        raise RuntimeError(f"the solver failed at alpha={alpha}, beta={beta}: {solution.message}")
    prey = solution.y[0]
    peaks, _ = find_peaks(prey)
    period = float(np.mean(np.diff(t[peaks]))) if len(peaks) >= 2 else float("nan")
    return {"period": period, "prey_max": float(prey.max()), "prey_min": float(prey.min()), "steps": int(solution.nfev)}


def _write_json(path: Path, data: Any) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    tmp.replace(path)


class PredatorPreyScan(SplitTaskType):
    """Scans a grid of prey growth rates (alpha) and predation rates (beta); one unit per grid point."""

    class Settings(TaskSettings):
        alphas: list[float] = Field(default=[0.8, 1.0, 1.2, 1.4], min_length=1, description="Prey growth rates.")
        betas: list[float] = Field(default=[0.05, 0.1, 0.2], min_length=1, description="Predation rates.")
        delta: float = Field(default=0.075, gt=0, description="Predator growth per prey eaten.")
        gamma: float = Field(default=1.5, gt=0, description="Predator death rate.")
        t_end: float = Field(default=60.0, gt=0, description="Simulated time.")
        points: int = Field(default=6000, ge=100, le=1_000_000, description="Output times of each solution.")

    outputs = ("scan",)
    resources = ResourceHint(base_memory_gb=0.3, per_worker_gb=0.3)

    def count_units(self, settings: Settings) -> int:
        return len(settings.alphas) * len(settings.betas)

    def compute_unit(self, settings: Settings, index: int, unit: UnitContext) -> None:
        alpha = settings.alphas[index // len(settings.betas)]
        beta = settings.betas[index % len(settings.betas)]
        result = simulate(alpha, beta, settings.delta, settings.gamma, settings.t_end, settings.points)
        _write_json(unit.result_dir / "point.json", {"index": index, "alpha": alpha, "beta": beta, **result})

    def merge(self, settings: Settings, merge: MergeContext) -> dict[str, Any]:
        points = sorted(
            (json.loads((result / "point.json").read_text()) for _, result in merge.units()), key=lambda p: p["index"]
        )
        out = merge.outputs["scan"]
        _write_json(out / "scan.json", points)
        lines = ["alpha,beta,period,prey_max,prey_min"]
        lines += [f"{p['alpha']},{p['beta']},{p['period']!r},{p['prey_max']!r},{p['prey_min']!r}" for p in points]
        (out / "scan.csv").write_text("\n".join(lines) + "\n")
        periods = [p["period"] for p in points if p["period"] == p["period"]]
        return {
            "points": len(points),
            "min_period": min(periods) if periods else None,
            "max_period": max(periods) if periods else None,
        }
