"""The resource learner through a real gRPC server on loopback, with the production interceptors and the stub."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from simrun.v1 import common_pb2, learner_pb2, learner_pb2_grpc
from simrun_learner import ObservationKey, ResourceLearner
from simrun_learner.server import SERVICE_NAME, create_server

KEY = common_pb2.ObservationKey(task_type="model.tasks:Fit", model="pkmodel", cost_value="8")
HINT = common_pb2.ResolvedResources(
    base_memory_gb=1, per_worker_gb=4, cores_per_process=1, rule=common_pb2.RESOLUTION_RULE_HINT
)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[learner_pb2_grpc.ResourceLearnerServiceStub, grpc.Channel]]:
    bound = create_server(tmp_path / "observations.sqlite", "127.0.0.1:0").start()
    with grpc.insecure_channel(f"127.0.0.1:{bound.port}") as channel:
        yield learner_pb2_grpc.ResourceLearnerServiceStub(channel), channel
    bound.stop(None)


@pytest.fixture
def stub(served: tuple[learner_pb2_grpc.ResourceLearnerServiceStub, grpc.Channel]):  # type: ignore[no-untyped-def]
    return served[0]


def observation(gb: float, run: str, **kw: object) -> learner_pb2.CreateObservationRequest:
    return learner_pb2.CreateObservationRequest(
        observation=common_pb2.Observation(key=KEY, per_worker_gb=gb, run_id=run, **kw)  # type: ignore[arg-type]
    )


def test_resolve_without_observations_is_the_hint(stub: learner_pb2_grpc.ResourceLearnerServiceStub) -> None:
    resources = stub.ResolveResources(learner_pb2.ResolveResourcesRequest(key=KEY, hint=HINT)).resources
    assert (resources.per_worker_gb, resources.rule) == (4, common_pb2.RESOLUTION_RULE_HINT)
    assert not resources.HasField("unit_seconds")
    assert "no observations" in resources.reason


def test_record_then_resolve(stub: learner_pb2_grpc.ResourceLearnerServiceStub) -> None:
    created = stub.CreateObservation(observation(2.0, "r1", succeeded=True, unit_seconds=[3.0, 5.0])).observation
    assert created.observation_id and created.observe_time.seconds > 0
    assert (created.per_worker_gb, list(created.unit_seconds)) == (2.0, [3.0, 5.0])
    resources = stub.ResolveResources(learner_pb2.ResolveResourcesRequest(key=KEY, hint=HINT)).resources
    assert resources.rule == common_pb2.RESOLUTION_RULE_PERCENTILE
    assert resources.per_worker_gb == pytest.approx(2.2, abs=1 / 1024)
    assert resources.unit_seconds == 4.0
    stub.CreateObservation(observation(2.0, "r2", oom_killed=True, oom_per_worker_gb=3.0))
    floored = stub.ResolveResources(learner_pb2.ResolveResourcesRequest(key=KEY, hint=HINT)).resources
    assert (floored.rule, floored.per_worker_gb) == (common_pb2.RESOLUTION_RULE_OOM_FLOOR, 4.5)


def test_list_observations_pages_oldest_first(stub: learner_pb2_grpc.ResourceLearnerServiceStub) -> None:
    for i in range(5):
        stub.CreateObservation(observation(1.0 + i, f"r{i}"))
    seen, token = [], ""
    while True:
        page = stub.ListObservations(learner_pb2.ListObservationsRequest(key=KEY, page_size=2, page_token=token))
        seen += [o.run_id for o in page.observations]
        token = page.next_page_token
        if not token:
            break
    assert seen == ["r0", "r1", "r2", "r3", "r4"]


def test_estimate_task(stub: learner_pb2_grpc.ResourceLearnerServiceStub) -> None:
    request = learner_pb2.EstimateTaskRequest(key=KEY, units=100, pods=2, processes=8)
    with pytest.raises(grpc.RpcError) as raised:
        stub.EstimateTask(request)
    assert raised.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    stub.CreateObservation(observation(1.0, "r1", unit_seconds=[2.0, 4.0, 30.0]))
    response = stub.EstimateTask(request)
    assert (response.unit_seconds, response.rounds, response.seconds) == (4.0, 7, 28.0)


@pytest.mark.parametrize(
    "call",
    [
        lambda s: s.CreateObservation(
            learner_pb2.CreateObservationRequest(observation=common_pb2.Observation(per_worker_gb=1))
        ),
        lambda s: s.CreateObservation(observation(-1.0, "r1")),
        lambda s: s.CreateObservation(observation(1.0, "r1", oom_killed=True)),
        lambda s: s.ResolveResources(learner_pb2.ResolveResourcesRequest(hint=HINT)),
        lambda s: s.ListObservations(learner_pb2.ListObservationsRequest(key=KEY, page_size=-1)),
        lambda s: s.ListObservations(learner_pb2.ListObservationsRequest(key=KEY, page_token="garbage")),
        lambda s: s.EstimateTask(learner_pb2.EstimateTaskRequest(key=KEY, units=1, pods=0, processes=1)),
    ],
)
def test_bad_requests_are_invalid_arguments(stub: learner_pb2_grpc.ResourceLearnerServiceStub, call) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(grpc.RpcError) as raised:
        call(stub)
    assert raised.value.code() is grpc.StatusCode.INVALID_ARGUMENT


def test_health(served: tuple[learner_pb2_grpc.ResourceLearnerServiceStub, grpc.Channel]) -> None:
    health = health_pb2_grpc.HealthStub(served[1])
    assert health.Check(health_pb2.HealthCheckRequest(service=SERVICE_NAME)).status == 1
    assert SERVICE_NAME == "simrun.v1.ResourceLearnerService"


def test_an_embedded_server_shares_the_learner_the_tracker_calls(tmp_path: Path) -> None:
    with ResourceLearner(tmp_path / "observations.sqlite") as learner:
        bound = create_server(learner).start()
        try:
            with grpc.insecure_channel(f"127.0.0.1:{bound.port}") as channel:
                learner_pb2_grpc.ResourceLearnerServiceStub(channel).CreateObservation(observation(1.0, "r1"))
            assert [o.run_id for o in learner.observations(ObservationKey(KEY.task_type, KEY.model, "8"))] == ["r1"]
        finally:
            bound.stop(None)
