"""The resource learner's gRPC servicer: decode, one call of the domain, encode."""

from __future__ import annotations

import grpc
from simrun.v1 import learner_pb2, learner_pb2_grpc
from simrun_core.errors import PermissionDenied
from simrun_core.rpc.auth import caller_identity

from simrun_learner import convert
from simrun_learner.learner import ResourceLearner


class ResourceLearnerService(learner_pb2_grpc.ResourceLearnerServiceServicer):
    """Learns the memory and unit seconds of task types from the reports of their pods."""

    def __init__(self, learner: ResourceLearner) -> None:
        self._learner = learner

    def ResolveResources(
        self, request: learner_pb2.ResolveResourcesRequest, context: grpc.ServicerContext
    ) -> learner_pb2.ResolveResourcesResponse:
        key, hint = convert.key_from_proto(request.key), convert.resources_from_proto(request.hint)
        resources = self._learner.resolve(key, hint)
        return learner_pb2.ResolveResourcesResponse(resources=convert.resources_to_proto(resources))

    def CreateObservation(
        self, request: learner_pb2.CreateObservationRequest, context: grpc.ServicerContext
    ) -> learner_pb2.CreateObservationResponse:
        _require_service()
        observation = self._learner.record(convert.observation_from_proto(request.observation))
        return learner_pb2.CreateObservationResponse(observation=convert.observation_to_proto(observation))

    def ListObservations(
        self, request: learner_pb2.ListObservationsRequest, context: grpc.ServicerContext
    ) -> learner_pb2.ListObservationsResponse:
        _require_owner("list observations")
        key = convert.key_from_proto(request.key)
        observations, token = self._learner.list_observations(key, request.page_size, request.page_token)
        return learner_pb2.ListObservationsResponse(
            observations=[convert.observation_to_proto(o) for o in observations], next_page_token=token
        )

    def DeleteObservations(
        self, request: learner_pb2.DeleteObservationsRequest, context: grpc.ServicerContext
    ) -> learner_pb2.DeleteObservationsResponse:
        _require_owner("forget observations")
        deleted = self._learner.forget(convert.key_from_proto(request.key))
        return learner_pb2.DeleteObservationsResponse(deleted_count=deleted)

    def EstimateTask(
        self, request: learner_pb2.EstimateTaskRequest, context: grpc.ServicerContext
    ) -> learner_pb2.EstimateTaskResponse:
        key = convert.key_from_proto(request.key)
        estimate = self._learner.estimate(key, request.units, request.pods, request.processes)
        return convert.estimate_to_proto(estimate)


def _require_service() -> None:
    """Observations come from the tracker's reading of pod reports; a person or agent could poison them."""
    identity = caller_identity()
    if identity is not None and not identity.is_service:
        raise PermissionDenied(
            f"{identity.name} may not create observations: the run tracker records them from the reports of pods"
        )


def _require_owner(what: str) -> None:
    identity = caller_identity()
    if identity is not None and not (identity.is_owner or identity.is_service):
        raise PermissionDenied(f"{identity.name} may not {what}: only the cluster's owner may")
