"""End to end: a submission writes no task folder for a run that waits; its pods lay out their task's
`settings.json` and `provenance.json` from the record as they start, and a task reused whole gets them from its
submission."""

from __future__ import annotations

import dataclasses
import json
import threading
import time

from e2e_support import wait_final, write_workflow
from simrun.v1 import common_pb2
from simrun_runtime.layout import StoreLayout
from simrun_tracker.ports import EnvironmentState

HOLDER = "tasks: {hold: {type: 'e2etasks.tasks:Slow', settings: {units: 1, seconds: 120}}}"
SCAN = "tasks: {scan: {type: 'e2etasks.tasks:Slow', settings: {units: 2, seconds: 0.05, seed: 3}}}"
SCAN_SETTINGS = {"units": 2, "seconds": 0.05, "seed": 3}


def wait_state(client, run_id: str, state: int, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while client.get_run(run_id).state != state:
        assert time.monotonic() < deadline, f"run {run_id} is {client.get_run(run_id).state}, not {state}"
        time.sleep(0.05)


def test_a_queued_run_has_no_task_files_until_its_pod_starts_and_lays_them_out(
    start_server, client_for, e2e_model, tmp_path
):
    home = tmp_path / "home"
    server = start_server(nodes=[{"name": "node-a", "cores": 1, "memory_gb": 4}], home=home)
    client = client_for(server)
    holder = client.submit(write_workflow(e2e_model, HOLDER, "hold.yaml")).run_id
    wait_state(client, holder, common_pb2.RUN_STATE_RUNNING)
    queued = client.submit(write_workflow(e2e_model, SCAN, "scan.yaml"), reuse="never").run_id
    wait_state(client, queued, common_pb2.RUN_STATE_QUEUED)
    run = StoreLayout(home / "store").run(queued)
    time.sleep(0.5)  # the driver's steps of the queued run: they start its pod, which waits for the core
    assert client.get_run(queued).state == common_pb2.RUN_STATE_QUEUED
    assert run.record.is_file() and not run.tasks.exists()

    client.cancel(holder)
    final = wait_final(client, queued)
    assert final.state == common_pb2.RUN_STATE_SUCCEEDED, final.message
    task = run.task("scan")
    assert json.loads(task.settings.read_text()) == SCAN_SETTINGS
    provenance = json.loads(task.provenance.read_text())
    assert provenance["run_id"] == queued
    assert [s["name"] for s in provenance["snapshots"]] == [s.name for s in final.snapshots]


def test_a_task_reused_whole_has_its_own_task_files(start_server, client_for, e2e_model, tmp_path):
    home = tmp_path / "home"
    client = client_for(start_server(home=home))
    workflow = write_workflow(e2e_model, SCAN, "scan.yaml")
    first = client.submit(workflow).run_id
    assert wait_final(client, first).state == common_pb2.RUN_STATE_SUCCEEDED
    second = client.submit(workflow).run_id
    final = wait_final(client, second)
    assert final.state == common_pb2.RUN_STATE_SUCCEEDED, final.message
    task = StoreLayout(home / "store").run(second).task("scan")
    assert task.summary.is_file()  # reused: its outputs are the first run's, linked
    assert json.loads(task.settings.read_text()) == SCAN_SETTINGS
    assert json.loads(task.provenance.read_text())["run_id"] == second


def test_a_task_reused_once_its_environment_is_ready_has_its_own_task_files(
    start_server, client_for, e2e_model, tmp_path
):
    """A run recorded while its environment builds is planned by the driver, which reuses what it finds: its
    task reused whole gets its files then (no pod of it starts to lay them out)."""
    home = tmp_path / "home"
    server = start_server(home=home)
    client = client_for(server)
    workflow = write_workflow(e2e_model, SCAN, "scan.yaml")
    first = client.submit(workflow).run_id
    assert wait_final(client, first).state == common_pb2.RUN_STATE_SUCCEEDED
    port = server.tracker.environments
    resolve, get = port.resolve, port.get
    built = threading.Event()

    def building(environment):
        return environment if built.is_set() else dataclasses.replace(environment, state=EnvironmentState.BUILDING)

    port.resolve = lambda snapshots: building(resolve(snapshots))
    port.get = lambda environment_id: building(get(environment_id))
    try:
        second = client.submit(workflow).run_id
        run = StoreLayout(home / "store").run(second)
        assert client.get_run(second).state == common_pb2.RUN_STATE_SUBMITTING and not run.tasks.exists()
        built.set()
        final = wait_final(client, second)
    finally:
        port.resolve, port.get = resolve, get
    assert final.state == common_pb2.RUN_STATE_SUCCEEDED, final.message
    assert final.tasks[0].reused_from.run_id == first
    task = run.task("scan")
    assert json.loads(task.settings.read_text()) == SCAN_SETTINGS
    assert json.loads(task.provenance.read_text())["run_id"] == second
