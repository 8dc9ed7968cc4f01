"""The tracker's task keys at submission: recorded per task, and a type that is not cacheable keys nothing below it."""

from __future__ import annotations

import json

from simrun_runtime.layout import StoreLayout
from simrun_runtime.loading import TypeDescription
from simrun_runtime.record import Identity, RunRecord, SnapshotRef, TaskRecord
from simrun_runtime.tasktype import ResourceHint
from simrun_tracker.reuse import keys_of
from simrun_tracker.submission import PlannedTask


def planned(task_id: str, type_name: str, cacheable: bool = True, settings: dict | None = None) -> PlannedTask:
    description = TypeDescription(
        type=type_name,
        split=False,
        inputs=[],
        outputs=["out"],
        resources=ResourceHint(),
        cost_setting=None,
        cacheable=cacheable,
        settings_schema={},
        settings=settings or {},
    )
    return PlannedTask(task_id, description, None, None, None)  # type: ignore[arg-type]


def record(tmp_path) -> RunRecord:
    store = StoreLayout(tmp_path)
    listing = store.snapshot_files("m", "s1")
    listing.parent.mkdir(parents=True)
    listing.write_text(json.dumps({"files": {"a.py": "0" * 64}, "executable": [], "symlinks": {}}))
    return RunRecord(
        run_id="r",
        identity=Identity(name="bob", kind="person", priority="standard"),
        tasks={
            "clock": TaskRecord(task_id="clock", type="m:Clock"),
            "fit": TaskRecord(task_id="fit", type="m:Fit", inputs={"t": "clock.out"}),
            "other": TaskRecord(task_id="other", type="m:Other"),
        },
        snapshots=[SnapshotRef(name="m", snapshot_id="s1", path="snapshots/m/s1")],
        environment="env-1",
    )


def test_a_type_that_is_not_cacheable_keys_nothing_that_reads_it(tmp_path):
    run = record(tmp_path)
    store = StoreLayout(tmp_path)
    tasks = [planned("clock", "m:Clock", cacheable=False), planned("fit", "m:Fit"), planned("other", "m:Other")]
    first, second = keys_of(store, run, tasks), keys_of(store, run, tasks)
    assert first["clock"] is None and second["clock"] is None
    assert first["fit"] != second["fit"]  # downstream of a type that is not cacheable: a new key each time
    assert first["other"] == second["other"] and first["other"] is not None


def test_keys_follow_the_settings_with_defaults_filled(tmp_path):
    run = record(tmp_path)
    store = StoreLayout(tmp_path)
    base = [planned("clock", "m:Clock"), planned("fit", "m:Fit", settings={"order": 2}), planned("other", "m:Other")]
    changed = [base[0], planned("fit", "m:Fit", settings={"order": 3}), base[2]]
    a, b = keys_of(store, run, base), keys_of(store, run, changed)
    assert a["clock"] == b["clock"] and a["other"] == b["other"]
    assert a["fit"] != b["fit"]
