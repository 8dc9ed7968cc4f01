"""Who may write and forget the learner: services create observations, the owner lists and forgets them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from simrun.v1 import common_pb2, learner_pb2, learner_pb2_grpc
from simrun_core.identity import TokenRegistry
from simrun_core.rpc.auth import bearer_metadata
from simrun_learner.server import create_server

KEY = common_pb2.ObservationKey(task_type="model.tasks:Fit", model="pkmodel")
HINT = common_pb2.ResolvedResources(base_memory_gb=1, per_worker_gb=2, cores_per_process=1)
TOKENS = {
    "owner": "alice",
    "tokens": {
        "t-alice": {"name": "alice"},
        "t-alice-agent": {"name": "alice-agent", "agent_of": "alice"},
        "t-bob": {"name": "bob"},
        "t-bob-agent": {"name": "bob-agent", "agent_of": "bob"},
        "t-tracker": {"name": "tracker", "service": True},
    },
}


@pytest.fixture
def stub(tmp_path: Path) -> Iterator[learner_pb2_grpc.ResourceLearnerServiceStub]:
    bound = create_server(tmp_path / "o.sqlite", "127.0.0.1:0", TokenRegistry.from_mapping(TOKENS)).start()
    with grpc.insecure_channel(f"127.0.0.1:{bound.port}") as channel:
        yield learner_pb2_grpc.ResourceLearnerServiceStub(channel)
    bound.stop(None)


def create(stub: learner_pb2_grpc.ResourceLearnerServiceStub, token: str, gb: float) -> None:
    observation = common_pb2.Observation(key=KEY, per_worker_gb=gb, run_id="r", succeeded=True)
    stub.CreateObservation(
        learner_pb2.CreateObservationRequest(observation=observation), metadata=bearer_metadata(token)
    )


def resolved_gb(stub: learner_pb2_grpc.ResourceLearnerServiceStub, token: str = "t-bob") -> float:
    request = learner_pb2.ResolveResourcesRequest(key=KEY, hint=HINT)
    return stub.ResolveResources(request, metadata=bearer_metadata(token)).resources.per_worker_gb


@pytest.mark.parametrize("token", ["t-alice", "t-alice-agent", "t-bob", "t-bob-agent"])
def test_people_and_agents_may_not_create_observations(stub, token: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(grpc.RpcError) as info:
        for _ in range(20):
            create(stub, token, 56.0)
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "may not create observations: the run tracker records them" in (info.value.details() or "")
    assert resolved_gb(stub) == 2.0  # still the hint: nothing was recorded


def test_everyone_reads_learned_resources_and_only_the_owner_lists_and_forgets(stub) -> None:  # type: ignore[no-untyped-def]
    for _ in range(3):
        create(stub, "t-tracker", 5.0)
    assert resolved_gb(stub, "t-bob-agent") == pytest.approx(5.5)
    for token in ("t-bob", "t-bob-agent", "t-alice-agent"):
        for call, request in (
            (stub.ListObservations, learner_pb2.ListObservationsRequest(key=KEY)),
            (stub.DeleteObservations, learner_pb2.DeleteObservationsRequest(key=KEY)),
        ):
            with pytest.raises(grpc.RpcError) as info:
                call(request, metadata=bearer_metadata(token))
            assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    owner = bearer_metadata("t-alice")
    assert len(stub.ListObservations(learner_pb2.ListObservationsRequest(key=KEY), metadata=owner).observations) == 3
    deleted = stub.DeleteObservations(learner_pb2.DeleteObservationsRequest(key=KEY), metadata=owner)
    assert deleted.deleted_count == 3
    assert resolved_gb(stub) == 2.0
