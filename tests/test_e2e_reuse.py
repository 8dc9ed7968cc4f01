"""Reuse of earlier results end to end on the local executor: unchanged upstream tasks are not computed again, a
cancelled split task resumes with only its missing units, an edited file reuses nothing, and no one reuses another
person's run."""

from __future__ import annotations

import json
import time

import pytest
from click.testing import CliRunner
from e2e_support import TOKENS, expected_total, wait_final, write_workflow
from simrun.v1 import common_pb2
from simrun_cli.main import cli
from simrun_core.errors import FailedPrecondition, NotFound
from simrun_learner.rules import ObservationKey
from simrun_runtime.layout import StoreLayout
from simrun_runtime.ledger import Ledger
from simrun_runtime.reports import load_reports

SUMS = """
name: sums
tasks:
  values:
    type: e2etasks.tasks:Slow
    settings: {{units: {units}, seconds: {seconds}, seed: 5}}
  total:
    type: e2etasks.tasks:Sum
    settings: {{offset: {offset}}}
    inputs: {{values: values.values}}
"""


def sums(units: int = 6, seconds: float = 0.05, offset: int = 0) -> str:
    return SUMS.format(units=units, seconds=seconds, offset=offset)


def units_computed(store: StoreLayout, run_id: str, task_id: str) -> int:
    """Units the pods of a task computed, as their worker reports count them."""
    reports = load_reports(store.run(run_id).task(task_id))
    return sum(r.unit_seconds.count if r.unit_seconds else len(r.units) for r in reports)


def task(run: common_pb2.Run, task_id: str) -> common_pb2.Task:
    return next(t for t in run.tasks if t.task_id == task_id)


def test_a_downstream_change_computes_no_unit_upstream_and_matches_a_fresh_run(start_server, client_for, e2e_model):
    server = start_server()
    client = client_for(server, "person")
    store = StoreLayout(server.config.store)
    first = client.submit(write_workflow(e2e_model, sums()))
    assert wait_final(client, first.run_id).state == common_pb2.RUN_STATE_SUCCEEDED
    assert server.learner is not None
    key = ObservationKey("e2etasks.tasks:Slow", "e2e-model", "")
    observed = len(server.learner.observations(key))

    # The workflow file in the model's tree changes; the upstream task's key does not.
    estimate = client.estimate(write_workflow(e2e_model, sums(offset=7)))
    reused = {t.task_id: t.reused_from for t in estimate.tasks if t.HasField("reused_from")}
    assert set(reused) == {"values"} and reused["values"].run_id == first.run_id
    # A reused task computes nothing; the other one has run before under its observation key (type, model).
    seconds = {t.task_id: t.seconds for t in estimate.tasks}
    assert seconds["values"] == 0 and all(t.HasField("seconds") for t in estimate.tasks)
    cli_args = ["--endpoint", server.address, "--token", TOKENS["person"]]
    workflow = str(write_workflow(e2e_model, sums(offset=7)))
    shown = CliRunner().invoke(cli, ["estimate", workflow, *cli_args])
    assert shown.exit_code == 0, shown.output
    assert "unknown" not in shown.output and "compute seconds in all: " in shown.output
    # Without reuse the split task gets its learned unit seconds times its rounds over the processes.
    never = client.estimate(write_workflow(e2e_model, sums(offset=7)), reuse="never")
    values_plan = next(t for t in never.tasks if t.task_id == "values")
    rounds = -(-6 // (values_plan.plan.pods * values_plan.plan.shape.processes))
    assert 0.05 * rounds * 0.8 <= values_plan.seconds <= 0.05 * rounds * 3

    second = client.submit(write_workflow(e2e_model, sums(offset=7)))
    final = wait_final(client, second.run_id)
    assert final.state == common_pb2.RUN_STATE_SUCCEEDED, final.message
    values = task(final, "values")
    assert values.state == common_pb2.TASK_STATE_SUCCEEDED
    assert values.reused_from.run_id == first.run_id and values.reused_from.task_id == "values"
    assert values.message == f"reused from run {first.run_id} task values"
    assert values.units_done == values.units == 6  # every unit done (in the run it came from)
    assert values.key == task(first, "values").key and task(final, "total").key != task(first, "total").key
    assert units_computed(store, second.run_id, "values") == 0
    assert not task(final, "total").HasField("reused_from")
    assert len(server.learner.observations(key)) == observed  # the learner records nothing for a reused task
    shown = CliRunner().invoke(
        cli, ["status", second.run_id, "--endpoint", server.address, "--token", TOKENS["person"]]
    )
    assert shown.exit_code == 0, shown.output
    assert f"values: outputs reused from run {first.run_id} task values" in " ".join(shown.output.split())

    fresh = client.submit(write_workflow(e2e_model, sums(offset=7)), reuse="never")
    assert wait_final(client, fresh.run_id).state == common_pb2.RUN_STATE_SUCCEEDED
    assert units_computed(store, fresh.run_id, "values") == 6
    for port, name in (("values", "values.json"), ("total", "total.json")):
        task_id = "values" if port == "values" else "total"
        reused_bytes = (store.run(second.run_id).task(task_id).out_port(port) / name).read_bytes()
        fresh_bytes = (store.run(fresh.run_id).task(task_id).out_port(port) / name).read_bytes()
        assert reused_bytes == fresh_bytes
    total = json.loads((store.run(second.run_id).task("total").out_port("total") / "total.json").read_text())
    assert total == expected_total(5, 6) + 7

    # --rerun computes the named task again; what reads it keeps its key (same results) and is reused.
    again = client.submit(write_workflow(e2e_model, sums(offset=7)), rerun=["values"])
    final = wait_final(client, again.run_id)
    assert not task(final, "values").HasField("reused_from")
    assert units_computed(store, again.run_id, "values") == 6
    assert task(final, "total").reused_from.task_id == "total"


def test_a_cancelled_split_task_resumes_with_only_its_missing_units(start_server, client_for, e2e_model):
    server = start_server(nodes=[{"name": "node-a", "cores": 2, "memory_gb": 8}])
    client = client_for(server, "person")
    store = StoreLayout(server.config.store)
    workflow = write_workflow(e2e_model, sums(units=16, seconds=0.5))
    first = client.submit(workflow)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        done = task(client.get_run(first.run_id), "values").units_done
        if done >= 4:
            break
        time.sleep(0.05)
    # A run still computing cannot be resumed: its tasks have not ended, so nothing of it could be reused yet.
    with pytest.raises(FailedPrecondition, match="resume it once it has ended"):
        client.submit(workflow, resume_from=first.run_id)
    client.cancel(first.run_id)
    assert wait_final(client, first.run_id).state == common_pb2.RUN_STATE_CANCELLED
    # Done units of its ledger (the reports of stopped pods may not have counted their last units yet).
    done_before = Ledger.of(store.run(first.run_id).task("values")).done_count()
    assert 4 <= done_before < 16

    resumed = client.resume(first.run_id, model=e2e_model)
    final = wait_final(client, resumed.run_id)
    assert final.state == common_pb2.RUN_STATE_SUCCEEDED, final.message
    values = task(final, "values")
    seeded = values.reused_from.units
    assert values.reused_from.run_id == first.run_id and seeded == done_before
    assert units_computed(store, resumed.run_id, "values") == 16 - seeded  # the worker reports count them
    assert values.units_done == 16  # seeded and computed units alike

    undisturbed = client.submit(workflow, reuse="never")
    assert wait_final(client, undisturbed.run_id).state == common_pb2.RUN_STATE_SUCCEEDED
    merged = (store.run(resumed.run_id).task("values").out_port("values") / "values.json").read_bytes()
    assert merged == (store.run(undisturbed.run_id).task("values").out_port("values") / "values.json").read_bytes()


def test_an_edited_file_reuses_nothing(start_server, client_for, e2e_model):
    server = start_server()
    client = client_for(server, "person")
    workflow = write_workflow(e2e_model, sums())
    first = client.submit(workflow)
    assert wait_final(client, first.run_id).state == common_pb2.RUN_STATE_SUCCEEDED
    (e2e_model / "e2etasks" / "tasks.py").write_text(
        (e2e_model / "e2etasks" / "tasks.py").read_text() + "\n# an edit\n"
    )
    # `simrun resume` snapshots the edited tree: every key changes, nothing is reused.
    options = ["--endpoint", server.address, "--token", TOKENS["person"]]
    resumed = CliRunner().invoke(cli, ["resume", first.run_id, "--model", str(e2e_model), "--json", *options])
    assert resumed.exit_code == 0, resumed.output
    final = wait_final(client, json.loads(resumed.output)["run_id"])
    assert final.state == common_pb2.RUN_STATE_SUCCEEDED
    assert not any(t.HasField("reused_from") for t in final.tasks)
    assert all(t.key != task(first, t.task_id).key for t in final.tasks)


def test_only_runs_the_caller_may_read_are_reused(start_server, client_for, e2e_model):
    """Reuse follows the read policy: Carol's agent never reuses Bob's run, nor does Bob's own agent, which may not
    read Bob's runs by default; a run that is hidden is not found when it is resumed, whatever the path."""
    server = start_server()
    bob, carols_agent = client_for(server, "person"), client_for(server, "other-agent")
    workflow = write_workflow(e2e_model, sums())
    first = bob.submit(workflow)
    assert wait_final(bob, first.run_id).state == common_pb2.RUN_STATE_SUCCEEDED
    theirs = carols_agent.submit(workflow)
    final = wait_final(carols_agent, theirs.run_id)
    assert final.state == common_pb2.RUN_STATE_SUCCEEDED
    assert not any(t.HasField("reused_from") for t in final.tasks)
    assert task(final, "values").key == task(first, "values").key  # the same key: refused by identity alone
    # The read policy hides Bob's run from Carol's agent: it cannot resume what does not exist for it, and the
    # refusal says no more than for a run that does not exist (not whose it is).
    with pytest.raises(NotFound, match="no run"):
        carols_agent.resume(first.run_id, model=e2e_model)
    with pytest.raises(NotFound, match="no run") as refused:
        carols_agent.submit(workflow, resume_from=first.run_id)
    assert "bob" not in str(refused.value)
    # Bob's agent may not read Bob's runs either (read_policy.agents_see_their_person is off): no reuse.
    bobs_agent = client_for(server, "agent")
    with pytest.raises(NotFound, match="no run"):
        bobs_agent.submit(workflow, resume_from=first.run_id)
    again = bobs_agent.submit(workflow)
    mine = wait_final(bobs_agent, again.run_id)
    assert mine.state == common_pb2.RUN_STATE_SUCCEEDED
    assert not any(t.HasField("reused_from") for t in mine.tasks)
    # Bob reads his agent's runs, so he reuses them.
    later = bob.submit(workflow)
    assert task(wait_final(bob, later.run_id), "values").reused_from.run_id in (first.run_id, again.run_id)
