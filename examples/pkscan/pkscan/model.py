"""The one-compartment model with first-order absorption, solved on a time grid with numpy."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
"""The repository's root: the model and the patients are files beside the package, read relative to it."""


def parameters() -> dict[str, float]:
    return json.loads((ROOT / "models" / "one_compartment.json").read_text())


def patients() -> list[dict[str, str]]:
    with (ROOT / "data" / "patients.csv").open() as f:
        return list(csv.DictReader(f))


def concentration(dose_mg: float, clearance_l_per_h: float, p: dict[str, float]) -> tuple[np.ndarray, np.ndarray]:
    """Plasma concentration (mg/L) after one oral dose: the Bateman function of the model's parameters."""
    t = np.linspace(0.0, p["hours"], int(p["samples"]))
    ka, v, f = p["absorption_per_h"], p["volume_l"], p["bioavailability"]
    ke = clearance_l_per_h / v
    c = f * dose_mg * ka / (v * (ka - ke)) * (np.exp(-ke * t) - np.exp(-ka * t))
    return t, c


def exposure(dose_mg: float, clearance_l_per_h: float) -> dict[str, float]:
    """AUC over the simulated hours (trapezoid rule), peak concentration and its time."""
    t, c = concentration(dose_mg, clearance_l_per_h, parameters())
    auc = float(np.sum((c[1:] + c[:-1]) * np.diff(t)) / 2.0)
    peak = int(np.argmax(c))
    return {"auc_mg_h_per_l": auc, "cmax_mg_per_l": float(c[peak]), "tmax_h": float(t[peak])}
