"""End to end with every service in its own server and the gateway forwarding to them by configured addresses."""

from __future__ import annotations

import json

import grpc
import pytest
from e2e_support import TOKENS, wait_final
from simrun.v1 import common_pb2, planner_pb2, planner_pb2_grpc
from simrun_client.client import Client
from simrun_core.config import EnvironmentsConfig, NodeConfig, ServerConfig, ServiceAddresses
from simrun_core.identity import TokenRegistry
from simrun_core.rpc.auth import bearer_metadata
from simrun_gateway.embedded import start_embedded
from simrun_learner.learner import ResourceLearner
from simrun_learner.rules import ObservationKey
from simrun_learner.server import create_server as learner_server
from simrun_planner.server import create_server as planner_server
from simrun_runtime.layout import StoreLayout
from simrun_snapshot.server import create_server as snapshot_server
from simrun_tracker.server import build_tracker
from simrun_tracker.server import create_server as tracker_server


@pytest.fixture
def apart(tmp_path, tokens_file):
    tokens = TokenRegistry.load(tokens_file)
    store = StoreLayout(tmp_path / "store")
    store.root.mkdir()
    learner = ResourceLearner(store.observations)
    servers = {
        "learner": learner_server(learner, "127.0.0.1:0", tokens).start(),
        "planner": planner_server("127.0.0.1:0", tokens).start(),
        "snapshot": snapshot_server(store.root, "127.0.0.1:0", tokens).start(),
    }
    addresses = {name: f"127.0.0.1:{server.port}" for name, server in servers.items()}
    tracker_config = ServerConfig(
        home=tmp_path,
        store=store.root,
        tokens_file=tokens_file,
        nodes=[NodeConfig(name="node-a", cores=2, memory_gb=4)],
        services=ServiceAddresses(learner=addresses["learner"]),
        service_token=TOKENS["service"],
        grace_s=5,
        environments=EnvironmentsConfig(kind="server"),
    )
    tracker = build_tracker(tracker_config, store, learner=None)
    servers["tracker"] = tracker_server(tracker, "127.0.0.1:0", tokens).start()
    tracker.start()
    addresses["tracker"] = f"127.0.0.1:{servers['tracker'].port}"
    gateway = start_embedded(
        ServerConfig(
            home=tmp_path,
            store=tmp_path / "gateway-store",
            address="127.0.0.1:0",
            tokens_file=tokens_file,
            services=ServiceAddresses(**addresses),
        )
    )
    yield gateway, learner, store
    gateway.stop()
    for server in servers.values():
        server.stop()
    tracker.close()
    learner.close()


def test_a_run_through_the_gateway_reaches_every_service_apart(apart, example_model):
    gateway, learner, store = apart
    assert gateway.tracker is None and gateway.learner is None  # nothing served in the gateway itself
    with Client(gateway.address, TOKENS["person"]) as client:
        assert client.identity().name == "bob"
        run = client.submit(example_model / "pi.yaml")
        final = wait_final(client, run.run_id)
        assert final.state == common_pb2.RUN_STATE_SUCCEEDED, final.message
        logs = "".join(response.lines for response in client.logs(run.run_id, "estimate"))
        assert "attempt 1" in logs
    summary = json.loads(store.run(run.run_id).task("estimate").summary.read_text())
    assert abs(summary["pi"] - 3.1416) < 0.01
    assert learner.observations(ObservationKey("montecarlo.tasks:EstimatePi", "montecarlo", "500000"))


def test_the_gateway_forwards_status_codes_and_refuses_unknown_tokens(apart):
    gateway, _, _ = apart
    channel = grpc.insecure_channel(gateway.address)
    planner = planner_pb2_grpc.PlannerServiceStub(channel)
    request = planner_pb2.PlanTaskRequest(
        task_id="t",
        task_type="m:T",
        split=True,
        units=4,
        resources=common_pb2.ResolvedResources(base_memory_gb=100, per_worker_gb=100),
        nodes=[common_pb2.Node(name="n", cores=2, memory_gb=4)],
        priority=common_pb2.PRIORITY_AGENT,
    )
    with pytest.raises(grpc.RpcError) as caught:
        planner.PlanTask(request, metadata=bearer_metadata(TOKENS["agent"]))
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    with pytest.raises(grpc.RpcError) as caught:
        planner.PlanTask(request, metadata=bearer_metadata("nope"))
    assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
    channel.close()
