"""End to end on one machine through the real gRPC server: split workflows, outputs, reports, progress, compare."""

from __future__ import annotations

import json

from e2e_support import expected_total, wait_final, write_workflow
from simrun.v1 import common_pb2
from simrun_runtime.layout import StoreLayout
from simrun_runtime.reports import read_progress


def test_example_split_workflow_succeeds_with_merged_outputs(start_server, client_for, example_model):
    server = start_server(nodes=[{"name": "node-a", "cores": 2, "memory_gb": 8}])
    client = client_for(server)
    run = client.submit(example_model / "pi.yaml")
    assert run.state == common_pb2.RUN_STATE_SUBMITTING
    final = wait_final(client, run.run_id)
    assert final.state == common_pb2.RUN_STATE_SUCCEEDED, final.message
    store = StoreLayout(server.config.store)
    estimate = store.run(run.run_id).task("estimate")
    assert estimate.merge_marker.exists()
    summary = json.loads(estimate.summary.read_text())
    assert abs(summary["pi"] - 3.14159) < 0.01
    units = final.tasks[0].units
    assert units == 16 and final.tasks[0].units_done == 16
    progress = read_progress(estimate.progress)  # a line per claim: one unit, or a range of short units
    assert sorted(index for line in progress for index in line.units()) == list(range(16))
    reports = [json.loads(p.read_text()) for p in estimate.workers.glob("*.json")]
    assert reports and all(r["ended"] == "done" for r in reports)
    assert sum(r["unit_seconds"]["count"] for r in reports) >= 16
    report = store.run(run.run_id).task("report")
    assert (report.out_port("report") / "report.md").is_file()
    assert (report.logs / "w0.log").is_file()
    # The finished tasks' reports became the learner's observations.
    assert server.learner is not None
    from simrun_learner.rules import ObservationKey

    assert server.learner.observations(ObservationKey("montecarlo.tasks:EstimatePi", "montecarlo", "500000"))


def test_outputs_flow_downstream_and_runs_compare_side_by_side(start_server, client_for, e2e_model):
    server = start_server()
    client = client_for(server)
    runs = []
    for seed in (1, 2):
        workflow = write_workflow(
            e2e_model,
            f"""
name: sums
group: study
tasks:
  values:
    type: e2etasks.tasks:Slow
    settings: {{units: 6, seconds: 0.05, seed: {seed}}}
  total:
    type: e2etasks.tasks:Sum
    inputs: {{values: values.values}}
""",
        )
        runs.append(client.submit(workflow).run_id)
    for run_id in runs:
        assert wait_final(client, run_id).state == common_pb2.RUN_STATE_SUCCEEDED
    comparison = client.compare(group="study")
    assert list(comparison.run_ids) == runs
    rows = {(row.task_id, row.key): list(row.values) for row in comparison.rows}
    assert rows[("total", "total")] == [json.dumps(expected_total(1, 6)), json.dumps(expected_total(2, 6))]
    assert rows[("values", "units")] == ["6", "6"]
    listed = client.list_runs(group="study", page_size=1)
    assert [r.run_id for r in listed] == list(reversed(runs))
    assert client.list_runs(group="other") == []
    assert len(client.list_runs(state="succeeded", owner="alice")) == 2
