"""Submission checks: reservations, snapshots, and task types described in a real describer subprocess."""

from __future__ import annotations

import os
import signal
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from simrun_core.errors import FailedPrecondition, InvalidArgument, NotFound
from simrun_core.workflow import parse_workflow
from simrun_planner import Node
from simrun_runtime.describe import DescribeRequest
from simrun_runtime.layout import StoreLayout
from simrun_runtime.record import SnapshotRef
from simrun_tracker.describer import SubprocessDescriber
from simrun_tracker.submission import check_snapshots, describe_tasks, reserving

MODULE = "simrun_tracker_testmodel"

MODEL = '''
"""Task types of the tracker's submission tests."""

import os

from simrun_runtime import ExecContext, ResourceHint, SplitTaskType, TaskSettings, UnsplitTaskType


class ScanSettings(TaskSettings):
    points: int = 4


class Scan(SplitTaskType):
    Settings = ScanSettings
    outputs = ("table",)
    resources = ResourceHint(base_memory_gb=1.0, per_worker_gb=0.25)
    cost_setting = "points"

    def count_units(self, settings):
        return settings.points

    def compute_unit(self, settings, index, unit):
        pass

    def merge(self, settings, merge):
        return {}


class Fit(UnsplitTaskType):
    Settings = TaskSettings
    inputs = ("table",)
    outputs = ("model",)

    def run(self, settings, context: ExecContext):
        return {}


class Pid(SplitTaskType):
    """Its unit count is the pid of the process describing it."""

    Settings = TaskSettings

    def count_units(self, settings):
        return os.getpid()

    def compute_unit(self, settings, index, unit):
        pass

    def merge(self, settings, merge):
        return {}
'''


@pytest.fixture(scope="module")
def model_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("model")
    (root / f"{MODULE}.py").write_text(textwrap.dedent(MODEL))
    return root


@pytest.fixture(scope="module")
def describer() -> Iterator[SubprocessDescriber]:
    describer = SubprocessDescriber(timeout_s=30)
    yield describer
    describer.close()


def describe(describer: SubprocessDescriber, model_root: Path, text: str) -> dict:
    return describe_tasks(describer, sys.executable, model_root, parse_workflow(text))


# --- describe_tasks --------------------------------------------------------------------------------------------


def test_a_good_workflow_is_described(describer: SubprocessDescriber, model_root: Path) -> None:
    descriptions = describe(
        describer,
        model_root,
        f"""
tasks:
  fit: {{type: "{MODULE}:Fit", inputs: {{table: scan.table}}}}
  scan: {{type: "{MODULE}:Scan", settings: {{points: 8}}}}
""",
    )
    assert list(descriptions) == ["scan", "fit"]
    scan, fit = descriptions["scan"], descriptions["fit"]
    assert (scan.split, scan.units, scan.cost_value, scan.outputs) == (True, 8, "8", ["table"])
    assert (scan.resources.base_memory_gb, scan.settings) == (1.0, {"points": 8})
    assert (fit.split, fit.inputs, fit.outputs) == (False, ["table"], ["model"])


@pytest.mark.parametrize(
    ("tasks", "message"),
    [
        (
            f'scan: {{type: "{MODULE}:Scna"}}',
            f"task scan: module '{MODULE}' has no 'Scna'",
        ),
        (
            'scan: {type: "simrun_no_such_module:Scan"}',
            "task scan: cannot import module 'simrun_no_such_module'",
        ),
        (
            f'scan: {{type: "{MODULE}:Scan", settings: {{pionts: 3}}}}',
            "task scan: unknown setting 'pionts' (did you mean 'points'?)",
        ),
        (
            f'scan: {{type: "{MODULE}:Scan"}}\n  fit: {{type: "{MODULE}:Fit", inputs: {{tabel: scan.table}}}}',
            f"task fit: unknown input port 'tabel' of type {MODULE}:Fit (its inputs: table)",
        ),
        (
            f'scan: {{type: "{MODULE}:Scan"}}\n  fit: {{type: "{MODULE}:Fit"}}',
            "task fit: input port 'table' is not connected: add inputs.table",
        ),
        (
            f'scan: {{type: "{MODULE}:Scan"}}\n  fit: {{type: "{MODULE}:Fit", inputs: {{table: scan.tabel}}}}',
            "task fit: input table reads scan.tabel, but scan has no output port 'tabel' (its outputs: table)",
        ),
    ],
)
def test_refusals_name_the_task_and_the_culprit(
    describer: SubprocessDescriber, model_root: Path, tasks: str, message: str
) -> None:
    with pytest.raises(InvalidArgument) as info:
        describe(describer, model_root, f"tasks:\n  {tasks}\n")
    assert str(info.value).startswith(message)


# --- the describer process ---------------------------------------------------------------------------------


def pid_of(describer: SubprocessDescriber, model_root: Path) -> int:
    (response,) = describer.describe(sys.executable, model_root, [DescribeRequest(type=f"{MODULE}:Pid", settings={})])
    assert response.ok and response.description is not None, response.error
    units = response.description.units
    assert units is not None
    return units


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_describer_process_is_reused_restarted_after_a_kill_and_closed(model_root: Path) -> None:
    describer = SubprocessDescriber(timeout_s=30, answers_kept=0)  # every request reaches the process
    try:
        first = pid_of(describer, model_root)
        assert first != os.getpid()
        assert pid_of(describer, model_root) == first
        os.kill(first, signal.SIGKILL)
        second = pid_of(describer, model_root)
        assert second != first
        assert pid_of(describer, model_root) == second
    finally:
        describer.close()
    deadline = time.monotonic() + 5
    while alive(second) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not alive(second)


# --- reservations and snapshots ------------------------------------------------------------------------------


NODES = [Node("small", 4, 16), Node("big", 64, 512), Node("held", 8, 32, reserved_by="r-other")]


def test_no_reservation_leaves_the_nodes_alone() -> None:
    assert reserving(NODES, "r1", None) == NODES


def test_reserving_marks_the_node_for_the_run() -> None:
    nodes = reserving(NODES, "r1", "big")
    assert [(n.name, n.reserved_by) for n in nodes] == [("small", None), ("big", "r1"), ("held", "r-other")]
    assert NODES[1].reserved_by is None  # the nodes given are not changed
    assert reserving(NODES, "r-other", "held") == NODES  # a run may name the node it holds already


def test_reserving_an_unknown_node_is_not_found() -> None:
    with pytest.raises(NotFound, match="no node 'huge'"):
        reserving(NODES, "r1", "huge")


def test_reserving_a_node_held_by_another_run_is_refused() -> None:
    with pytest.raises(FailedPrecondition, match="node held is reserved by run r-other"):
        reserving(NODES, "r1", "held")


def test_check_snapshots(tmp_path: Path) -> None:
    store = StoreLayout(tmp_path)
    store.snapshot("model", "s1").mkdir(parents=True)
    model = SnapshotRef(name="model", snapshot_id="s1", path="snapshots/model/s1")
    data = SnapshotRef(name="data", snapshot_id="s9", path="snapshots/data/s9")
    assert check_snapshots(store, [model]) == store.snapshot("model", "s1").resolve()
    with pytest.raises(InvalidArgument, match="a run needs the snapshot of its model"):
        check_snapshots(store, [])
    with pytest.raises(NotFound, match="snapshot data/s9 is not in the tracker's store: take it first"):
        check_snapshots(store, [model, data])
