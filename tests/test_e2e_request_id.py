"""Idempotent submission end to end: a request id is deduplicated per identity, under concurrent retries, across a
restart of the server, and bounded in length."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from e2e_support import wait_final, write_workflow
from simrun.v1 import common_pb2
from simrun_core.errors import InvalidArgument

QUICK = "tasks: {values: {type: 'e2etasks.tasks:Slow', settings: {units: 2, seconds: 0.05, seed: 11}}}"


def test_a_request_id_is_the_same_run_for_one_identity_and_another_for_another(
    start_server, client_for, e2e_model, tmp_path
):
    home = tmp_path / "home"
    server = start_server(home=home)
    agent, person = client_for(server, "agent"), client_for(server, "person")
    workflow = write_workflow(e2e_model, QUICK)

    # Retries racing each other (an agent whose first call timed out) make one run.
    with ThreadPoolExecutor(4) as pool:
        runs = list(pool.map(lambda _: agent.submit(workflow, request_id="same-id"), range(4)))
    assert len({run.run_id for run in runs}) == 1
    first = runs[0].run_id
    # The same id from another identity is another submission.
    theirs = person.submit(workflow, request_id="same-id")
    assert theirs.run_id != first
    assert wait_final(agent, first).state == common_pb2.RUN_STATE_SUCCEEDED
    assert wait_final(person, theirs.run_id).state == common_pb2.RUN_STATE_SUCCEEDED
    assert len(agent.list_runs()) == 1

    with pytest.raises(InvalidArgument, match="request id is 201 characters"):
        agent.submit(workflow, request_id="x" * 201)
    assert len(agent.list_runs()) == 1  # nothing was recorded

    # The records keep the id: a restarted server still returns the first run, with its units done.
    server.stop()
    again = start_server(home=home)
    retried = client_for(again, "agent").submit(workflow, request_id="same-id")
    assert retried.run_id == first and retried.state == common_pb2.RUN_STATE_SUCCEEDED
    assert retried.tasks[0].units_done == 2
