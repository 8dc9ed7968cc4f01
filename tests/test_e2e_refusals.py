"""End to end: bad submissions are refused with an error naming the culprit, and leave nothing behind."""

from __future__ import annotations

import grpc
import pytest
from e2e_support import write_workflow
from simrun.v1 import tracker_pb2, tracker_pb2_grpc
from simrun_client.client import Client
from simrun_core.errors import FailedPrecondition, InvalidArgument, NotFound, Unauthenticated

SLOW = "e2etasks.tasks:Slow"


@pytest.mark.parametrize(
    ("workflow", "error", "match"),
    [
        ("tasks: {a: {type: 'e2etasks.tasks:Nope'}}", InvalidArgument, r"task a: .*Nope"),
        ("tasks: {a: {type: 'nomodule:Slow'}}", InvalidArgument, r"task a: cannot import module 'nomodule'"),
        (f"tasks: {{a: {{type: '{SLOW}', settings: {{unitz: 3}}}}}}", InvalidArgument, r"task a: .*unitz"),
        (
            f"tasks: {{a: {{type: '{SLOW}'}}, b: {{type: 'e2etasks.tasks:Sum', inputs: {{valuez: a.values}}}}}}",
            InvalidArgument,
            r"task b: unknown input port 'valuez'",
        ),
        (
            f"tasks: {{a: {{type: '{SLOW}'}}, b: {{type: 'e2etasks.tasks:Sum', inputs: {{values: a.nothing}}}}}}",
            InvalidArgument,
            r"a has no output port 'nothing'",
        ),
        (
            "tasks: {a: {type: 'e2etasks.tasks:Sum', inputs: {values: b.total}},"
            " b: {type: 'e2etasks.tasks:Sum', inputs: {values: a.total}}}",
            InvalidArgument,
            r"cycle: (a -> b -> a|b -> a -> b)",
        ),
        ("tasks: {a: {type: 'e2etasks.tasks:Sum'}}", InvalidArgument, r"input port 'values' is not connected"),
        (f"tasks: {{a: {{type: '{SLOW}', setings: {{}}}}}}", InvalidArgument, r"tasks.a.setings: unknown field"),
        (
            "tasks: {a: {type: 'e2etasks.tasks:Hog', settings: {mib: 100}}}\nreserve: node-zz",
            NotFound,
            r"no node 'node-zz'",
        ),
    ],
)
def test_bad_workflows_are_refused_naming_the_culprit(start_server, client_for, e2e_model, workflow, error, match):
    server = start_server()
    client = client_for(server)
    with pytest.raises(error, match=match):
        client.submit(write_workflow(e2e_model, workflow))
    runs = server.config.store / "runs"
    assert not any(runs.iterdir())  # no half-written run
    assert client.list_runs() == []


def test_a_task_that_fits_no_node_is_a_failed_precondition(start_server, client_for, e2e_model):
    server = start_server(nodes=[{"name": "tiny", "cores": 1, "memory_gb": 0.5}])
    client = client_for(server)
    with pytest.raises(FailedPrecondition, match=r"task a: .*GiB"):
        client.submit(write_workflow(e2e_model, "tasks: {a: {type: 'e2etasks.tasks:Hog'}}"))
    assert not any((server.config.store / "runs").iterdir())


def test_requests_without_a_known_token_are_unauthenticated(start_server):
    server = start_server()
    with Client(server.address, "not-a-token") as client, pytest.raises(Unauthenticated, match="unknown bearer"):
        client.list_runs()
    channel = grpc.insecure_channel(server.address)
    stub = tracker_pb2_grpc.RunTrackerServiceStub(channel)
    with pytest.raises(grpc.RpcError) as caught:
        stub.ListRuns(tracker_pb2.ListRunsRequest())
    assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
    channel.close()


def test_identity_maps_tokens_to_priorities(start_server, client_for):
    server = start_server()
    expected = {"owner": 1, "owner-agent": 1, "person": 2, "agent": 3}
    for who, priority in expected.items():
        assert client_for(server, who).identity().priority == priority
