"""The tracker's driver over the kubernetes executor, through the real client, against the fake API server with
Argo and Kueue played: a run from submission to its end, a second kill for memory failing it, a cancel."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes_cluster import ScriptedCluster
from simrun_planner import Node
from simrun_runtime.layout import StoreLayout
from simrun_runtime.record import RunState, TaskState
from simrun_tracker.kubernetes.adapter import KubernetesExecutor
from simrun_tracker.kubernetes.config import KubernetesSettings
from simrun_tracker.kubernetes.names import quantity_gib
from test_driver import make_world as make_world  # the driver tests' fixture
from test_driver import task

NODES = [Node("n1", cores=4, memory_gb=16)]
IMAGE = "registry.simrun:5000/simrun/env@sha256:" + "0a" * 32


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[ScriptedCluster, KubernetesExecutor]]:
    scripted = ScriptedCluster(NODES)
    settings = KubernetesSettings(default_image=IMAGE, watch_timeout_s=5, backoff_max_s=0.5)
    executor = KubernetesExecutor(settings, StoreLayout(tmp_path / "store"), client=scripted.api.client())
    yield scripted, executor
    scripted.close()


def pod_running(scripted: ScriptedCluster, task_id: str, worker: str = "w0", timeout_s: float = 10) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            scripted._running("r1", task_id, worker)
            return
        except AssertionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)


def shut_down(scripted: ScriptedCluster, timeout_s: float = 10) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if scripted.api.cluster.get("workflows", "simrun", "simrun-r1")["spec"].get("shutdown") == "Terminate":
            return True
        time.sleep(0.02)
    return False


def test_a_run_goes_through_argo_in_the_order_of_its_inputs_and_argo_ends_its_workflow(make_world, cluster) -> None:
    scripted, executor = cluster
    world = make_world(executor)
    world.submit(task("scan", split=True), task("report", inputs={"points": "scan.points"}))
    pod_running(scripted, "scan")
    assert world.until(lambda r: r.state == RunState.RUNNING).tasks["report"].state == TaskState.PENDING
    world.merged("scan")
    scripted.exit("r1", "scan", "w0", 0)
    world.until(lambda r: r.tasks["scan"].state == TaskState.SUCCEEDED)
    pod_running(scripted, "report")  # Argo starts it once the coordinator succeeded
    scripted.exit("r1", "report", "w0", 0)
    assert world.until(lambda r: r.state.final).state == RunState.SUCCEEDED
    deadline = time.monotonic() + 10
    while (scripted.api.cluster.get("workflows", "simrun", "simrun-r1").get("status") or {}).get("phase") is None:
        assert time.monotonic() < deadline, "Argo never ended the Workflow"
        time.sleep(0.02)
    # Every pod succeeded: Argo ends the Workflow itself (Succeeded, its pods collected), simrun stops nothing.
    assert scripted.api.cluster.get("workflows", "simrun", "simrun-r1")["status"]["phase"] == "Succeeded"
    assert not shut_down(scripted, timeout_s=0.5)
    assert len([r for r in scripted.api.cluster.requests if r.method == "POST"]) == 1


def test_a_second_kill_for_memory_fails_the_run_naming_the_retry_memory(make_world, cluster) -> None:
    scripted, executor = cluster
    world = make_world(executor)
    world.submit(task("fit"))
    pod_running(scripted, "fit")
    scripted.exit("r1", "fit", "w0", 137, "OOMKilled")
    record = world.until(lambda r: len(r.oom_kills) == 1)
    pod_running(scripted, "fit")
    retry = scripted.api.cluster.items("pods")[-1]["spec"]["containers"][0]["resources"]["limits"]["memory"]
    scripted.exit("r1", "fit", "w0", 137, "OOMKilled")
    record = world.until(lambda r: r.state.final)
    assert record.state == RunState.FAILED and len(record.oom_kills) == 2
    assert (
        "killed for memory twice" in record.message
        and f"the retry had {record.oom_kills[1].memory_gb:g} GiB" in record.message
    )
    planned_retry = record.tasks["fit"].plan["shape"]["retry_memory_gb"]
    assert retry == quantity_gib(planned_retry) and record.oom_kills[1].memory_gb == planned_retry
    assert shut_down(scripted)


def test_a_cancel_stops_the_workflow(make_world, cluster) -> None:
    scripted, executor = cluster
    world = make_world(executor)
    world.submit(task("fit"))
    pod_running(scripted, "fit")
    with world.runs.run_lock("r1"):
        record = world.state()
        record.cancel_requested = True
        world.runs.save(record)
    assert world.until(lambda r: r.state.final).state == RunState.CANCELLED
    assert shut_down(scripted)


def test_a_run_whose_workflow_was_never_created_before_a_restart_is_handed_over_with_its_image(
    make_world, cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import test_driver
    from simrun_runtime.record import RunRecord
    from simrun_tracker.ports import Environment, EnvironmentState
    from simrun_tracker.runstore import RunStore

    own_image = "registry.simrun:5000/simrun/environments@sha256:" + "5e" * 32
    monkeypatch.setattr(
        test_driver.Environments,
        "get",
        lambda self, environment_id: Environment(environment_id, EnvironmentState.READY, image=own_image),
    )
    # The tracker recorded the run QUEUED and stopped before the adapter created its Workflow.
    runs = RunStore(StoreLayout(tmp_path / "store"))
    record = RunRecord(run_id="r1", identity=test_driver.AGENT, tasks={"fit": task("fit")}, environment="env-1")
    record.state = RunState.QUEUED
    runs.create(record, lambda staging: staging.tasks.mkdir(parents=True))
    runs.close()
    scripted, executor = cluster
    world = make_world(executor)  # a restarted tracker: recover, then the driver's steps
    pod_running(scripted, "fit")
    workflow = scripted.api.cluster.get("workflows", "simrun", "simrun-r1")
    assert {t["container"]["image"] for t in workflow["spec"]["templates"] if "container" in t} == {own_image}
    scripted.exit("r1", "fit", "w0", 0)
    assert world.until(lambda r: r.state.final).state == RunState.SUCCEEDED
    assert len([r for r in scripted.api.cluster.requests if r.method == "POST"]) == 1
