"""A downstream pod awaits each split input's merge marker before it computes: on a cluster, Argo starts it when the
upstream coordinator exits, which can precede the marker's visibility on NFS (its attribute cache)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from simrun_runtime.layout import RunLayout, StoreLayout
from simrun_runtime.pod import UsageError, await_merged, resolve_inputs
from simrun_runtime.record import Identity, RunRecord, TaskRecord

OWNER = Identity(name="alice", kind="owner", priority="owner")


def record(split: bool) -> RunRecord:
    return RunRecord(
        run_id="r1",
        identity=OWNER,
        tasks={
            "scan": TaskRecord(task_id="scan", type="m:Scan", split=split),
            "report": TaskRecord(task_id="report", type="m:Report", inputs={"points": "scan.points"}),
        },
    )


@pytest.fixture
def run(tmp_path: Path) -> RunLayout:
    layout = StoreLayout(tmp_path / "store").run("r1")
    layout.task("scan").out_port("points").mkdir(parents=True)
    return layout


def test_inputs_are_resolved_once_the_split_input_s_merge_marker_appears(run: RunLayout) -> None:
    marker = run.task("scan").merge_marker

    def merge_later() -> None:
        time.sleep(0.6)
        marker.write_text("{}")

    threading.Thread(target=merge_later).start()
    began = time.monotonic()
    inputs = resolve_inputs(run, "report", record(split=True).tasks["report"], ("points",), record(split=True))
    assert time.monotonic() - began >= 0.5, "the pod went on before its input had merged"
    assert inputs == {"points": run.task("scan").out_port("points")}


def test_an_input_that_never_merges_fails_the_pod_with_the_reason(run: RunLayout) -> None:
    with pytest.raises(UsageError, match="input task 'scan' shows no merge marker after 0 s"):
        await_merged(run, "scan", record(split=True), wait_s=0.2)


def test_an_unsplit_input_has_no_marker_to_await(run: RunLayout) -> None:
    began = time.monotonic()
    await_merged(run, "scan", record(split=False), wait_s=30)
    assert time.monotonic() - began < 1.0
