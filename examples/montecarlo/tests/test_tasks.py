"""The montecarlo task types called directly, without simrun: units, merge and report."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from montecarlo.tasks import ConvergenceScan, EstimatePi, Report
from simrun_runtime import ExecContext, MergeContext, SettingsError, UnitContext, describe_type


def _compute(task: EstimatePi | ConvergenceScan, settings: object, results: Path, indices: list[int]) -> None:
    for index in indices:
        result_dir = results / str(index)
        result_dir.mkdir(parents=True, exist_ok=True)
        task.compute_unit(settings, index, UnitContext(index=index, result_dir=result_dir, inputs={}))


def _merge(task: EstimatePi | ConvergenceScan, settings: object, results: Path, out: Path, port: str) -> dict:
    (out / port).mkdir(parents=True)
    count = task.count_units(settings)
    context = MergeContext(count=count, results=results, outputs={port: out / port}, inputs={}, scratch_dir=out)
    return task.merge(settings, context)


MODEL_ROOT = Path(__file__).resolve().parents[1]


def test_types_load_and_describe_as_simrun_does() -> None:
    pi = describe_type("montecarlo.tasks:EstimatePi", MODEL_ROOT, {"units": 5})
    assert pi.split and pi.outputs == ["estimate"] and pi.units == 5 and pi.cost_value == "500000"
    report = describe_type("montecarlo.tasks:Report", MODEL_ROOT, {})
    assert not report.split and report.inputs == ["estimate"] and report.outputs == ["report"]
    scan = describe_type("montecarlo.tasks:ConvergenceScan", MODEL_ROOT, {"points": 3})
    assert scan.units == 3
    wrong = describe_type("montecarlo.tasks:EstimatePi", MODEL_ROOT, {"sample_per_unit": 1})
    assert wrong.settings_errors and "samples_per_unit" in wrong.settings_errors[0]


def test_estimate_pi_does_not_depend_on_the_order_or_repetition_of_units(tmp_path: Path) -> None:
    task = EstimatePi()
    settings = task.validate_settings({"units": 4, "samples_per_unit": 20_000, "seed": 3})
    assert task.count_units(settings) == 4
    _compute(task, settings, tmp_path / "a", [0, 1, 2, 3])
    _compute(task, settings, tmp_path / "b", [3, 1, 1, 0, 2, 3])
    first = _merge(task, settings, tmp_path / "a", tmp_path / "out-a", "estimate")
    second = _merge(task, settings, tmp_path / "b", tmp_path / "out-b", "estimate")
    assert first == second
    assert first["samples"] == 80_000
    assert abs(first["pi"] - math.pi) < 5 * first["stderr"]
    written = json.loads((tmp_path / "out-a/estimate/estimate.json").read_text())
    assert written["pi"] == first["pi"] and written["units"] == 4


def test_a_different_seed_gives_a_different_estimate(tmp_path: Path) -> None:
    task = EstimatePi()
    estimates = []
    for seed in (1, 2):
        settings = task.validate_settings({"units": 2, "samples_per_unit": 10_000, "seed": seed})
        _compute(task, settings, tmp_path / f"r{seed}", [0, 1])
        estimates.append(_merge(task, settings, tmp_path / f"r{seed}", tmp_path / f"o{seed}", "estimate")["pi"])
    assert estimates[0] != estimates[1]


def test_a_misspelled_setting_is_refused_by_name() -> None:
    with pytest.raises(SettingsError, match="samples_per_unit"):
        EstimatePi().validate_settings({"sample_per_unit": 10})


def test_scan_doubles_the_samples(tmp_path: Path) -> None:
    task = ConvergenceScan()
    settings = task.validate_settings({"points": 3, "min_samples": 1000})
    _compute(task, settings, tmp_path / "r", [0, 1, 2])
    summary = _merge(task, settings, tmp_path / "r", tmp_path / "o", "scan")
    assert summary["points"] == 3 and summary["max_samples"] == 4000
    csv = (tmp_path / "o/scan/scan.csv").read_text().splitlines()
    assert [line.split(",")[0] for line in csv[1:]] == ["1000", "2000", "4000"]


def test_report_reads_the_estimate(tmp_path: Path) -> None:
    estimate = tmp_path / "estimate"
    estimate.mkdir()
    data = {"pi": 3.1416, "stderr": 0.001, "hits": 1, "samples": 10, "units": 2, "seed": 0}
    (estimate / "estimate.json").write_text(json.dumps(data))
    (tmp_path / "report").mkdir()
    task = Report()
    context = ExecContext(
        inputs={"estimate": estimate},
        outputs={"report": tmp_path / "report"},
        scratch_dir=tmp_path / "scratch",
        model_root=tmp_path,
        task_id="report",
    )
    summary = task.run(task.validate_settings({"digits": 4}), context)
    assert summary == {"pi": 3.1416, "stderr": 0.001, "consistent": True}
    text = (tmp_path / "report/report.md").read_text()
    assert "| estimate | 3.1416 |" in text and "consistent with pi" in text
