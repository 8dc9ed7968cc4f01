"""The planner through a real gRPC server on loopback, with the production interceptors and the generated stub."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from simrun.v1 import common_pb2, planner_pb2, planner_pb2_grpc
from simrun_core.identity import TokenRegistry
from simrun_core.rpc.auth import bearer_metadata
from simrun_planner.server import SERVICE_NAME, create_server

TOKENS = {"owner": "alice", "tokens": {"s3cret": {"name": "alice"}}}


@pytest.fixture(scope="module")
def channel() -> Iterator[grpc.Channel]:
    bound = create_server("127.0.0.1:0").start()
    with grpc.insecure_channel(f"127.0.0.1:{bound.port}") as channel:
        yield channel
    bound.stop(None)


@pytest.fixture(scope="module")
def stub(channel: grpc.Channel) -> planner_pb2_grpc.PlannerServiceStub:
    return planner_pb2_grpc.PlannerServiceStub(channel)


def small_nodes(count: int) -> list[common_pb2.Node]:
    return [common_pb2.Node(name=f"n{i}", cores=16, memory_gb=64) for i in range(count)]


def resources(per_worker_gb: float = 4, **kw: object) -> common_pb2.ResolvedResources:
    return common_pb2.ResolvedResources(base_memory_gb=2, per_worker_gb=per_worker_gb, cores_per_process=1, **kw)


def test_shape_pod(stub: planner_pb2_grpc.PlannerServiceStub) -> None:
    response = stub.ShapePod(planner_pb2.ShapePodRequest(resources=resources(), nodes=small_nodes(3)))
    assert response.shape == common_pb2.PodShape(
        cores=15, memory_gb=62, processes=15, per_worker_gb=4, retry_memory_gb=63, retry_per_worker_gb=6.1
    )
    capped = stub.ShapePod(planner_pb2.ShapePodRequest(resources=resources(), nodes=small_nodes(3), max_processes=2))
    assert capped.shape.processes == 2


def test_shape_pod_uses_the_runs_reserved_node(stub: planner_pb2_grpc.PlannerServiceStub) -> None:
    nodes = [*small_nodes(3), common_pb2.Node(name="big", cores=64, memory_gb=512, reserved_by="run-1")]
    other = stub.ShapePod(planner_pb2.ShapePodRequest(resources=resources(), nodes=nodes, run_id="run-2"))
    mine = stub.ShapePod(planner_pb2.ShapePodRequest(resources=resources(), nodes=nodes, run_id="run-1"))
    assert (other.shape.processes, mine.shape.processes) == (15, 64)


def test_plan_split_task(stub: planner_pb2_grpc.PlannerServiceStub) -> None:
    request = planner_pb2.PlanTaskRequest(
        task_id="fit",
        task_type="model.tasks:Fit",
        split=True,
        resources=resources(),
        nodes=small_nodes(5),
        priority=common_pb2.PRIORITY_AGENT,
        units=100,
    )
    plan = stub.PlanTask(request).plan
    assert (plan.task_id, plan.pods, plan.shape.processes, plan.units) == ("fit", 5, 15, 100)
    assert (plan.base_priority, plan.extra_priority) == ("simrun-agent-base", "simrun-agent-extra")
    assert plan.coordinator_merges
    request.mode = common_pb2.SPLIT_MODE_SINGLE_SERVER
    assert stub.PlanTask(request).plan.pods == 1


def test_plan_with_learned_unit_seconds_and_pod_start(stub: planner_pb2_grpc.PlannerServiceStub) -> None:
    # 150 units of 2 s on 15 processes: p pods have 20/p s each, so 2 pods at the default 10 s and 4 at 5 s.
    request = planner_pb2.PlanTaskRequest(
        task_id="fit",
        task_type="t",
        split=True,
        resources=resources(unit_seconds=2.0),
        nodes=small_nodes(8),
        mode=common_pb2.SPLIT_MODE_FASTEST,
        priority=common_pb2.PRIORITY_OWNER,
        units=150,
    )
    assert stub.PlanTask(request).plan.pods == 2
    request.pod_start_s = 5
    assert stub.PlanTask(request).plan.pods == 4


def test_unset_cores_per_process_are_one(stub: planner_pb2_grpc.PlannerServiceStub) -> None:
    unset = common_pb2.ResolvedResources(base_memory_gb=2, per_worker_gb=4)
    response = stub.ShapePod(planner_pb2.ShapePodRequest(resources=unset, nodes=small_nodes(1)))
    assert (response.shape.processes, response.shape.cores) == (15, 15)


def test_plan_unsplit_task_leaves_units_absent(stub: planner_pb2_grpc.PlannerServiceStub) -> None:
    request = planner_pb2.PlanTaskRequest(
        task_id="sim", task_type="t", resources=resources(), nodes=small_nodes(2), priority=common_pb2.PRIORITY_OWNER
    )
    plan = stub.PlanTask(request).plan
    assert (plan.pods, plan.shape.processes, plan.HasField("units")) == (1, 1, False)


def test_plan_error_is_failed_precondition_with_the_message(stub: planner_pb2_grpc.PlannerServiceStub) -> None:
    with pytest.raises(grpc.RpcError) as raised:
        stub.ShapePod(planner_pb2.ShapePodRequest(resources=resources(per_worker_gb=100), nodes=small_nodes(2)))
    assert raised.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert "one worker needs 1 core(s), 102 GiB" in raised.value.details()
    assert "n0, has 16 cores, 64 GiB" in raised.value.details()


@pytest.mark.parametrize(
    "request_",
    [
        planner_pb2.PlanTaskRequest(task_id="t", split=True, units=5, resources=resources()),  # no priority
        planner_pb2.PlanTaskRequest(
            task_id="t", split=True, resources=resources(), priority=common_pb2.PRIORITY_OWNER
        ),  # split without units
        planner_pb2.PlanTaskRequest(
            task_id="t", split=True, units=5, priority=common_pb2.PRIORITY_OWNER, resources=resources(per_worker_gb=-1)
        ),
    ],
)
def test_bad_requests_are_invalid_arguments(
    stub: planner_pb2_grpc.PlannerServiceStub, request_: planner_pb2.PlanTaskRequest
) -> None:
    request = planner_pb2.PlanTaskRequest()
    request.CopyFrom(request_)
    request.nodes.extend(small_nodes(2))
    with pytest.raises(grpc.RpcError) as raised:
        stub.PlanTask(request)
    assert raised.value.code() is grpc.StatusCode.INVALID_ARGUMENT


def test_health_reports_the_service(channel: grpc.Channel) -> None:
    health = health_pb2_grpc.HealthStub(channel)
    response = health.Check(health_pb2.HealthCheckRequest(service=SERVICE_NAME))
    assert response.status == health_pb2.HealthCheckResponse.SERVING
    assert SERVICE_NAME == "simrun.v1.PlannerService"


def test_with_tokens_a_call_needs_one() -> None:
    bound = create_server("127.0.0.1:0", tokens=TokenRegistry.from_mapping(TOKENS)).start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{bound.port}") as channel:
            stub = planner_pb2_grpc.PlannerServiceStub(channel)
            request = planner_pb2.ShapePodRequest(resources=resources(), nodes=small_nodes(1))
            with pytest.raises(grpc.RpcError) as raised:
                stub.ShapePod(request)
            assert raised.value.code() is grpc.StatusCode.UNAUTHENTICATED
            assert stub.ShapePod(request, metadata=bearer_metadata("s3cret")).shape.processes == 15
    finally:
        bound.stop(None)
