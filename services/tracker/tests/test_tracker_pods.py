"""The pods of a task from its plan, and the tracker's small helpers (run ids, flattened summaries)."""

from __future__ import annotations

import dataclasses
import re
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace

import pytest
from simrun_core.identity import Priority
from simrun_core.resources import ResolvedResources, SplitMode
from simrun_planner import Node, plan_task
from simrun_runtime.layout import RunLayout, StoreLayout
from simrun_runtime.record import Identity, RunRecord, TaskRecord
from simrun_tracker.executor import LocationError, PodRole, PodSpec
from simrun_tracker.pods import merge_pod, run_spec, task_pods
from simrun_tracker.reads import flatten as _flatten
from simrun_tracker.tracker import new_run_id

NODES = [Node(f"n{i}", 16, 64) for i in range(3)]
RESOURCES = ResolvedResources(base_memory_gb=1, per_worker_gb=0.5)


def plan(task_id: str, split: bool, units: int | None, priority: Priority = Priority.AGENT) -> dict:
    planned = plan_task(
        SimpleNamespace(id=task_id),
        SimpleNamespace(name="m:T", split=split),
        RESOURCES,
        NODES,
        SplitMode.FASTEST,
        priority,
        units,
        run_id="r1",
    )
    return dataclasses.asdict(planned)


@pytest.fixture
def run(tmp_path: Path) -> RunLayout:
    return StoreLayout(tmp_path).run("r1")


def record(task: TaskRecord) -> RunRecord:
    identity = Identity(name="bob-agent", kind="agent", on_behalf_of="bob", priority="agent")
    return RunRecord(run_id="r1", identity=identity, tasks={task.task_id: task})


def test_a_split_task_has_a_merging_coordinator_and_extra_workers(run: RunLayout) -> None:
    task = TaskRecord(task_id="scan", type="m:T", split=True, units=200, plan=plan("scan", True, 200))
    assert task.plan is not None
    assert task.plan["pods"] >= 2, "the plan should split the task over several pods"
    pods = task_pods(record(task), task, "env-1", grace_s=7.5)
    shape = task.plan["shape"]

    assert [p.worker for p in pods] == [f"w{i}" for i in range(task.plan["pods"])]
    for index, pod in enumerate(pods):
        assert (pod.run_id, pod.task_id, pod.environment_id) == ("r1", "scan", "env-1")
        assert pod.role == PodRole.WORKER and pod.role.module == "simrun_runtime.worker"
        # Nothing local: store paths relative to the store's root, wherever an adapter mounts it.
        assert pod.contract == {
            "SIMRUN_RUN_DIR": "runs/r1",
            "SIMRUN_TASK": "scan",
            "SIMRUN_WORKER": f"w{index}",
            "SIMRUN_PROCESSES": str(shape["processes"]),
            "SIMRUN_MERGE": "1" if index == 0 else "0",
            "SIMRUN_GRACE_S": "7.5",
            "SIMRUN_PROVENANCE": "runs/r1/tasks/scan/provenance.json",
            "PYTHONDONTWRITEBYTECODE": "1",
        }
        assert str(run.root).endswith(pod.contract["SIMRUN_RUN_DIR"])
        assert (pod.cores, pod.memory_gb, pod.processes) == (shape["cores"], shape["memory_gb"], shape["processes"])
        assert pod.retry_memory_gb == shape["retry_memory_gb"]
        assert pod.grace_s == 7.5
    assert [p.priority_class for p in pods] == ["simrun-agent-base"] + ["simrun-agent-extra"] * (len(pods) - 1)


def test_an_unsplit_task_has_one_pod_at_the_base_priority_run_by_execute(run: RunLayout) -> None:
    task = TaskRecord(task_id="fit", type="m:T", split=False, plan=plan("fit", False, None, Priority.OWNER))
    (pod,) = task_pods(record(task), task, "default", grace_s=10)
    assert pod.role == PodRole.EXECUTE and pod.role.module == "simrun_runtime.execute"
    assert (pod.worker, pod.contract["SIMRUN_WORKER"], pod.contract["SIMRUN_MERGE"]) == ("w0", "w0", "0")
    assert pod.contract["SIMRUN_GRACE_S"] == "10"
    assert pod.priority_class == "simrun-owner-base"


def test_a_plan_recorded_before_the_coordinator_merged_has_no_merging_pod(run: RunLayout) -> None:
    old = plan("scan", True, 200)
    old["coordinator_merges"] = False
    task = TaskRecord(task_id="scan", type="m:T", split=True, units=200, plan=old)
    assert {p.contract["SIMRUN_MERGE"] for p in task_pods(record(task), task, "default", 1)} == {"0"}
    legacy = merge_pod(record(task), task, "default", 1)
    assert (legacy.worker, legacy.role, legacy.contract["SIMRUN_MERGE"]) == ("merge", PodRole.MERGE, "1")
    assert legacy.priority_class == "simrun-agent-base"


def test_a_whole_run_names_each_task_s_pods_and_the_tasks_it_reads() -> None:
    scan = TaskRecord(task_id="scan", type="m:T", split=True, units=200, plan=plan("scan", True, 200))
    old = plan("fit", True, 200)
    old["coordinator_merges"] = False
    fit = TaskRecord(task_id="fit", type="m:T", split=True, units=200, plan=old, inputs={"points": "scan.points"})
    identity = Identity(name="bob-agent", kind="agent", on_behalf_of="bob", priority="agent")
    whole = run_spec(
        RunRecord(run_id="r1", identity=identity, tasks={"scan": scan, "fit": fit}), "e", 5, "img@sha256:1"
    )
    assert [(t.task_id, t.depends_on) for t in whole.tasks] == [("scan", []), ("fit", ["scan"])]
    assert whole.tasks[0].merge_pod is None and whole.tasks[1].merge_pod is not None
    assert {p.image for t in whole.tasks for p in t.pods} == {"img@sha256:1"}


@pytest.mark.parametrize("path", ["/store/runs/r1", "runs/../../etc", "../r1"])
def test_a_pod_spec_refuses_host_paths(path: str) -> None:
    with pytest.raises(LocationError, match="relative to the store"):
        PodSpec(
            run_id="r1",
            task_id="t",
            worker="w0",
            role=PodRole.EXECUTE,
            environment_id="default",
            contract={"SIMRUN_RUN_DIR": path},
            cores=1,
            memory_gb=1,
            processes=1,
            retry_memory_gb=1.5,
            priority_class="simrun-agent-base",
        )


def test_new_run_id_is_sortable_and_dns_safe() -> None:
    before = datetime.now(UTC).replace(microsecond=0)
    run_id = new_run_id()
    after = datetime.now(UTC)
    assert re.fullmatch(r"\d{8}-\d{6}-[0-9a-f]{6}", run_id), run_id
    # A DNS-1123 label: lowercase letters, digits and '-', starting and ending with one of the first two.
    assert re.fullmatch(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?", run_id) and len(run_id) <= 63
    # Fixed-width UTC time first, so the ids sort as their runs were made.
    stamp = datetime.strptime(run_id[:15], "%Y%m%d-%H%M%S").replace(tzinfo=UTC)
    assert before <= stamp <= after


def test_flatten_gives_dotted_keys_in_order() -> None:
    summary = {"points": 8, "fit": {"chi2": 1.5, "params": {"a": 1, "b": [2, 3]}}, "empty": {}, "name": "x"}
    assert list(_flatten(summary)) == [
        ("points", 8),
        ("fit.chi2", 1.5),
        ("fit.params.a", 1),
        ("fit.params.b", [2, 3]),
        ("name", "x"),
    ]


def test_flatten_of_a_bare_value() -> None:
    assert list(_flatten(3)) == [("(value)", 3)]
    assert list(_flatten({})) == []
