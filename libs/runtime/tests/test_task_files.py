"""A task's pods lay out its files from the record as they start: `settings.json` and `provenance.json` written
where missing or changed, a link or a FIFO left in the folder replaced and never followed, a record written
before the settings were kept read as before."""

from __future__ import annotations

import json
import os
import shutil
from typing import Any

from simrun_runtime.files import json_bytes
from simrun_runtime.layout import RunLayout
from simrun_runtime.record import RunRecord, TaskRecord

SCAN = "simrun_toymodel:Scan"
SETTINGS = {"points": 4, "steps": 100, "seed": 0.5}


def recorded_with_settings(pods: Any, run_id: str) -> RunLayout:
    """A run as a submission now records it: the task's settings in its record, no task folder at all."""
    run = pods.lay_out(run_id, "scan", SCAN, {"points": 99})  # the file a submission no longer writes
    record = RunRecord.load(run)
    record.tasks["scan"].settings = SETTINGS
    record.save(run)
    shutil.rmtree(run.tasks)
    return run


def test_a_pod_writes_its_task_s_files_from_the_record_and_computes_with_them(pods: Any) -> None:
    run = recorded_with_settings(pods, "fresh")
    done = pods.run(pods.env(run, "scan", "w0"))
    assert done.returncode == 0, done.stderr
    task = run.task("scan")
    assert task.settings.read_bytes() == json_bytes(SETTINGS)
    assert json.loads(task.provenance.read_text())["run_id"] == "fresh"
    assert json.loads(task.summary.read_text())["points"] == SETTINGS["points"]  # computed from the record's
    assert not [p.name for p in task.root.iterdir() if ".tmp-" in p.name]


def test_a_pod_replaces_what_an_earlier_pod_left_at_its_task_s_files(pods: Any, tmp_path: Any) -> None:
    """The folder is its pods' to write: settings changed by the model's code, a link to a FIFO (which would block
    a reader that followed it) and a missing provenance are put back as the record says."""
    run = recorded_with_settings(pods, "tampered")
    task = run.task("scan")
    task.root.mkdir(parents=True)
    task.settings.write_text(json.dumps({"points": 1000}))
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    task.provenance.symlink_to(fifo)
    done = pods.run(pods.env(run, "scan", "w0"), timeout=60)
    assert done.returncode == 0, done.stderr
    assert task.settings.read_bytes() == json_bytes(SETTINGS)
    assert not task.provenance.is_symlink()
    assert json.loads(task.provenance.read_text())["run_id"] == "tampered"


def test_a_pod_that_cannot_write_its_task_s_files_says_so_and_computes_nothing(pods: Any) -> None:
    run = recorded_with_settings(pods, "blocked")
    task = run.task("scan")
    task.settings.mkdir(parents=True)  # a folder where the file goes: not replaced
    done = pods.run(pods.env(run, "scan", "w0"))
    assert done.returncode == 2
    line = done.stderr.strip().splitlines()[-1]
    assert "cannot write the files of task 'scan'" in line, done.stderr
    assert not task.units.root.exists()


def test_a_record_written_before_the_settings_were_kept_reads_its_files(pods: Any) -> None:
    run = pods.lay_out("older", "scan", SCAN, SETTINGS)
    before = {name: (run.task("scan").root / name).read_bytes() for name in ("settings.json", "provenance.json")}
    assert RunRecord.load(run).tasks["scan"].settings is None
    done = pods.run(pods.env(run, "scan", "w0"))
    assert done.returncode == 0, done.stderr
    assert {name: (run.task("scan").root / name).read_bytes() for name in before} == before


def test_settings_that_hold_nan_and_infinities_reach_the_pod_as_submitted(tmp_path: Any) -> None:
    """YAML's `.nan` and `.inf` are floats a task's settings may hold: the record keeps them, not null."""
    settings = {"low": float("-inf"), "high": float("inf"), "missing": float("nan"), "points": 3}
    record = RunRecord.model_validate(
        {"run_id": "r", "identity": {"name": "a", "kind": "person", "priority": "standard"}, "tasks": {}}
    )
    record.tasks["t"] = TaskRecord(task_id="t", type="m:T", settings=settings)
    run = RunLayout(tmp_path / "runs" / "r")
    run.root.mkdir(parents=True)
    record.save(run)
    again = RunRecord.load(run)
    assert again.write_task_files(run, "t") == ["settings.json", "provenance.json"]
    written = json.loads(run.task("t").settings.read_text())
    assert written["low"] == float("-inf") and written["high"] == float("inf") and written["points"] == 3
    assert written["missing"] != written["missing"]  # NaN
    assert again.write_task_files(run, "t") == []  # whole and as the record says: nothing written again
