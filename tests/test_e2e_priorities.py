"""End to end: take-back by preemption, reservations, cancellation and who may cancel."""

from __future__ import annotations

import json
import time

import pytest
from click.testing import CliRunner
from conftest import TOKENS
from e2e_support import expected_total, wait_final, write_workflow
from simrun.v1 import common_pb2
from simrun_cli.main import cli
from simrun_core.errors import FailedPrecondition, NotFound, PermissionDenied
from simrun_runtime.layout import StoreLayout

THREE_NODES = [{"name": f"node-{c}", "cores": 1, "memory_gb": 2} for c in "abc"]


def slow(model, units: int, seconds: float, seed: int, name: str = "slow.yaml", extra: str = "") -> object:
    return write_workflow(
        model,
        f"""
name: slow
{extra}
tasks:
  values:
    type: e2etasks.tasks:Slow
    settings: {{units: {units}, seconds: {seconds}, seed: {seed}}}
""",
        name,
    )


def wait_running(client, run_id: str, units_done: int = 1, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        run = client.get_run(run_id)
        if run.state == common_pb2.RUN_STATE_RUNNING and run.tasks[0].units_done >= units_done:
            return
        time.sleep(0.05)
    raise AssertionError(f"run {run_id} did not start: {client.get_run(run_id)}")


def test_an_owner_run_takes_back_an_agents_extra_workers_and_both_finish_correctly(start_server, client_for, e2e_model):
    server = start_server(nodes=THREE_NODES)
    agent, owner = client_for(server, "agent"), client_for(server, "owner")
    agent_run = agent.submit(slow(e2e_model, units=48, seconds=0.25, seed=5, name="agent.yaml"))
    assert agent_run.tasks[0].plan.pods == 3
    wait_running(agent, agent_run.run_id, units_done=2)
    owner_run = owner.submit(slow(e2e_model, units=2, seconds=0.25, seed=9, name="owner.yaml"))
    assert owner_run.tasks[0].plan.pods == 2  # no pod without a unit
    # Watched while the agent's run runs: the executor forgets an ended run's pods.
    preempted: dict[str, int] = {}
    deadline = time.monotonic() + 90
    while agent.get_run(agent_run.run_id).state < 4:
        assert time.monotonic() < deadline, "the agent's run did not end"
        for pod in server.tracker.executor.pods(agent_run.run_id):
            preempted[pod.spec.worker] = max(preempted.get(pod.spec.worker, 0), pod.preemptions)
        time.sleep(0.02)
    owner_final = wait_final(owner, owner_run.run_id)
    agent_final = wait_final(agent, agent_run.run_id)
    assert owner_final.state == agent_final.state == common_pb2.RUN_STATE_SUCCEEDED
    store = StoreLayout(server.config.store)
    agent_task = store.run(agent_run.run_id).task("values")
    assert json.loads(agent_task.summary.read_text())["total"] == expected_total(5, 48)
    assert preempted == {"w0": 0, "w1": 1, "w2": 1}  # the extra workers were taken back; the coordinator kept
    owner_task = store.run(owner_run.run_id).task("values")
    assert json.loads(owner_task.summary.read_text())["total"] == expected_total(9, 2)


def test_a_reserved_node_is_left_to_its_run_and_released_when_it_ends(start_server, client_for, e2e_model):
    server = start_server(nodes=THREE_NODES[:2])
    owner, agent = client_for(server, "owner"), client_for(server, "agent")
    owner_agent = client_for(server, "owner-agent")
    reserving = owner.submit(slow(e2e_model, units=4, seconds=0.3, seed=1, name="r.yaml"), reserve="node-b")
    assert reserving.reservation == "node-b"
    assert reserving.tasks[0].plan.pods == 1  # planned on its reserved node only
    with pytest.raises(FailedPrecondition, match="node-b is reserved by run"):
        owner_agent.submit(slow(e2e_model, units=2, seconds=0.1, seed=2, name="a.yaml"), reserve="node-b")
    with pytest.raises(PermissionDenied, match="bob-agent may not reserve node node-b"):
        agent.submit(slow(e2e_model, units=2, seconds=0.1, seed=2, name="a.yaml"), reserve="node-b")
    other = agent.submit(slow(e2e_model, units=4, seconds=0.1, seed=3, name="b.yaml"))
    assert other.tasks[0].plan.pods == 1  # node-b is not usable for it
    assert wait_final(owner, reserving.run_id).state == common_pb2.RUN_STATE_SUCCEEDED
    assert wait_final(agent, other.run_id).state == common_pb2.RUN_STATE_SUCCEEDED
    assert {n.name: n.reserved_by for n in owner.nodes()} == {"node-a": "", "node-b": ""}


def test_cancel_stops_the_pods_and_only_the_submitter_or_the_owner_may(start_server, client_for, e2e_model):
    server = start_server()
    bob, carol, alice = client_for(server, "agent"), client_for(server, "other-agent"), client_for(server, "owner")
    run = bob.submit(slow(e2e_model, units=40, seconds=0.5, seed=1))
    wait_running(bob, run.run_id)
    with pytest.raises(NotFound, match=f"no run '{run.run_id}'"):
        carol.cancel(run.run_id)  # another's agent does not even see the run (the read policy)
    cancelled = bob.cancel(run.run_id)
    assert cancelled.state == common_pb2.RUN_STATE_CANCELLED
    assert cancelled.tasks[0].state == common_pb2.TASK_STATE_CANCELLED
    with pytest.raises(FailedPrecondition, match="has ended already"):
        bob.cancel(run.run_id)
    other = bob.submit(slow(e2e_model, units=40, seconds=0.5, seed=2))
    assert alice.cancel(other.run_id).state == common_pb2.RUN_STATE_CANCELLED
    task = StoreLayout(server.config.store).run(run.run_id).task("values")
    time.sleep(1.0)
    done = len(list(task.units.done.iterdir()))
    time.sleep(1.0)
    assert len(list(task.units.done.iterdir())) == done < 40  # nothing computes any more


def test_a_cancelled_task_that_never_ran_shows_no_pods(start_server, client_for, e2e_model) -> None:
    """`simrun status`'s pods column counts the pods that started: the downstream task of a run cancelled while
    its upstream computed shows 0, not the pod its plan had."""
    server = start_server()
    client = client_for(server, "agent")
    workflow = (
        slow(
            e2e_model,
            units=40,
            seconds=0.5,
            seed=3,
            name="two.yaml",
        ).read_text()
        + "  total:\n    type: e2etasks.tasks:Sum\n    inputs: {values: values.values}\n"
    )
    run = client.submit(write_workflow(e2e_model, workflow, "two.yaml"))
    wait_running(client, run.run_id)
    client.cancel(run.run_id)
    env = {"SIMRUN_ENDPOINT": server.address, "SIMRUN_TOKEN": TOKENS["agent"], "COLUMNS": "200"}
    status = CliRunner().invoke(cli, ["status", run.run_id], env=env, catch_exceptions=False)
    rows = {
        line.split()[0]: line.split() for line in status.output.splitlines() if line.startswith(("values", "total"))
    }
    assert rows["total"][2] == "cancelled" and rows["total"][-1] == "0", status.output
    assert rows["values"][2] == "cancelled" and int(rows["values"][-1]) >= 1, status.output
