"""The task type of pkscan: DoseScan, one unit per (dose, patient), merged into one table."""

from __future__ import annotations

import csv

from pydantic import Field
from simrun_runtime import MergeContext, ResourceHint, SplitTaskType, TaskSettings, UnitContext

from pkscan.model import exposure, patients


class DoseScan(SplitTaskType):
    """Exposure of every patient of data/patients.csv at every dose: AUC, peak and time of peak."""

    class Settings(TaskSettings):
        doses_mg: list[float] = Field(default=[50, 100, 200, 400], min_length=1, description="Oral doses, mg.")

    outputs = ("table",)
    resources = ResourceHint(base_memory_gb=0.2, per_worker_gb=0.1)

    def count_units(self, settings: Settings) -> int:
        return len(settings.doses_mg) * len(patients())

    def compute_unit(self, settings: Settings, index: int, unit: UnitContext) -> dict[str, float | str]:
        people = patients()
        dose, patient = settings.doses_mg[index // len(people)], people[index % len(people)]
        clearance = float(patient["clearance_l_per_h"])
        return {
            "dose_mg": dose,
            "patient": patient["patient"],
            "clearance_l_per_h": clearance,
            **exposure(dose, clearance),
        }

    def merge(self, settings: Settings, merge: MergeContext) -> dict[str, float]:
        rows = [row for _, row in merge.values()]
        table = merge.outputs["table"] / "exposure.csv"
        with table.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=sorted(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
        return {"rows": len(rows), "max_auc": max(r["auc_mg_h_per_l"] for r in rows)}
