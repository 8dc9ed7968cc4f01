"""End to end: a server stopped in the middle of a run is started again and the run ends as it would have."""

from __future__ import annotations

import json
import os
import time

from e2e_support import expected_total, wait_final, write_workflow
from simrun.v1 import common_pb2
from simrun_runtime.layout import StoreLayout

ACTIVE = (common_pb2.RUN_STATE_SUBMITTING, common_pb2.RUN_STATE_QUEUED, common_pb2.RUN_STATE_RUNNING)


def test_a_restarted_server_continues_the_run_from_its_ledger(start_server, client_for, e2e_model, tmp_path):
    home = tmp_path / "restart-home"
    workflow = write_workflow(
        e2e_model,
        """
name: long
tasks:
  values:
    type: e2etasks.tasks:Slow
    settings: {units: 30, seconds: 0.2, seed: 4}
  total:
    type: e2etasks.tasks:Sum
    inputs: {values: values.values}
""",
    )
    first = start_server(home=home)
    client = client_for(first)
    run_id = client.submit(workflow).run_id
    deadline = time.monotonic() + 30
    while client.get_run(run_id).tasks[0].units_done < 6:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    first.stop()
    run = StoreLayout(home / "store").run(run_id)
    task = run.task("values")
    done_before = {p.name for p in task.units.done.iterdir()}
    assert 6 <= len(done_before) < 30
    # A task's pods write its files from the record as they start, without fsync: a power cut may leave them
    # empty; the next pod writes them again.
    task.settings.write_bytes(b"")
    # A task recorded before its record kept its settings, whose files its submission wrote without fsync, as a
    # power cut leaves them: the starting server writes them again from the workflow in the record.
    record = json.loads(run.record.read_text())
    del record["tasks"]["total"]["settings"]
    run.record.write_text(json.dumps(record))
    run.task("total").root.mkdir(exist_ok=True)  # not started yet: its pod has laid out nothing
    # And what a task's pods may leave in their folder: a link to a FIFO is not read (it would block the start).
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    run.task("total").settings.symlink_to(fifo)

    second = start_server(home=home)
    client = client_for(second)
    assert client.get_run(run_id).state == common_pb2.RUN_STATE_RUNNING  # from the rebuilt index and records
    final = wait_final(client, run_id)
    assert final.state == common_pb2.RUN_STATE_SUCCEEDED, final.message
    assert json.loads(task.summary.read_text())["total"] == expected_total(4, 30)
    assert not run.task("total").settings.is_symlink()
    assert json.loads(run.task("total").settings.read_text()) == {}
    assert json.loads(run.task("total").provenance.read_text())["run_id"] == run_id
    progress_units = [json.loads(line)["unit"] for line in task.progress.read_text().splitlines()]
    assert set(progress_units) == set(range(30))
    assert len(progress_units) < 30 + 6  # what was done before the stop was not computed again (beyond in-flight)


def test_a_restarted_server_keeps_a_run_s_reservation_and_releases_it_at_the_end(
    start_server, client_for, e2e_model, tmp_path
):
    home = tmp_path / "reserve-home"
    nodes = [{"name": "node-a", "cores": 1, "memory_gb": 4}, {"name": "node-b", "cores": 1, "memory_gb": 4}]
    workflow = write_workflow(
        e2e_model,
        """
name: reserved
reserve: node-b
tasks:
  values:
    type: e2etasks.tasks:Slow
    settings: {units: 12, seconds: 0.25, seed: 8}
""",
        "reserved.yaml",
    )
    first = start_server(nodes=nodes, home=home)
    client = client_for(first)
    run_id = client.submit(workflow).run_id
    deadline = time.monotonic() + 30
    while client.get_run(run_id).tasks[0].units_done < 2:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    first.stop()

    second = start_server(nodes=nodes, home=home)
    client = client_for(second)
    # Before the driver's first step, the reservation is the run's again: nobody else can take node-b.
    assert {n.name: n.reserved_by for n in client.nodes()} == {"node-a": "", "node-b": run_id}
    nodes_used: set[str | None] = set()  # seen while the run runs: the executor forgets an ended run's pods
    deadline = time.monotonic() + 60
    while client.get_run(run_id).state in ACTIVE:
        assert time.monotonic() < deadline, "the run did not end"
        nodes_used |= {p.node for p in second.tracker.executor.pods(run_id) if p.node}
        time.sleep(0.02)
    final = wait_final(client, run_id)
    assert final.state == common_pb2.RUN_STATE_SUCCEEDED, final.message
    assert nodes_used == {"node-b"}
    assert {n.name: n.reserved_by for n in client.nodes()} == {"node-a": "", "node-b": ""}
