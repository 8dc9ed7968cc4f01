"""End to end on one machine through the real gRPC server: split workflows, outputs, reports, progress, compare."""

from __future__ import annotations

import json

from click.testing import CliRunner
from e2e_support import E2E_MODEL, TOKENS, expected_total, git_repo, wait_final, write_workflow
from simrun.v1 import common_pb2
from simrun_cli.main import cli
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


def test_outputs_flow_downstream_and_runs_compare_side_by_side(start_server, client_for, e2e_model, tmp_path):
    server = start_server()
    client = client_for(server)
    other_model = git_repo(E2E_MODEL, tmp_path / "other-model")
    runs = []
    for model, seed in ((e2e_model, 1), (e2e_model, 2), (other_model, 3)):
        workflow = write_workflow(
            model,
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
    assert rows[("total", "total")] == [json.dumps(expected_total(seed, 6)) for seed in (1, 2, 3)]
    assert rows[("values", "units")] == ["6", "6", "6"]
    # What each run ran on comes first, so runs of two models do not read as one study.
    sources = {row.key: [json.loads(v) for v in row.values] for row in comparison.sources}
    assert sources["model"] == ["e2e-model", "e2e-model", "other-model"]
    snapshots = [client.get_run(run_id).snapshots[0] for run_id in runs]
    assert sources["snapshot"] == [s.snapshot_id for s in snapshots]
    assert sources["commit"] == [s.provenance.commit for s in snapshots] and all(sources["commit"])
    assert sources["dirty"] == [True, True, True]  # the workflow files are not committed
    shown = CliRunner().invoke(
        cli, ["compare", "--group", "study", "--endpoint", server.address, "--token", TOKENS["owner"]]
    )
    assert shown.exit_code == 0, shown.output
    lines = shown.output.splitlines()
    model_row = next(line for line in lines if line.split()[:2] == ["run", "model"])
    assert model_row.split()[2:] == ["e2e-model", "e2e-model", "other-model"]
    commit_row = next(line for line in lines if line.split()[:2] == ["run", "commit"])
    assert commit_row.split()[2] == sources["commit"][0][:12]
    assert lines[-1] == "these runs are of 2 models (e2e-model, other-model): their values are not one study"
    listed = client.list_runs(group="study", page_size=1)
    assert [r.run_id for r in listed] == list(reversed(runs))
    assert client.list_runs(group="other") == []
    assert len(client.list_runs(state="succeeded", owner="alice")) == 3
