"""The learner port: the resource learner in this process, or its service at an address."""

from __future__ import annotations

from collections import Counter
from typing import Any

import grpc
from simrun.v1 import learner_pb2, learner_pb2_grpc
from simrun_core.config import TlsConfig
from simrun_core.errors import FailedPrecondition
from simrun_core.resources import ObservationKey, ResolvedResources
from simrun_core.rpc.channel import open_channel
from simrun_core.rpc.errors import to_domain_error
from simrun_core.rpc.tls import service_credentials
from simrun_core.telemetry import Telemetry
from simrun_learner import convert
from simrun_learner.learner import ResourceLearner
from simrun_learner.reports import observations_from_reports
from simrun_learner.rules import Observation
from simrun_runtime.layout import StoreLayout
from simrun_runtime.record import RunRecord


def _task_observations(store: StoreLayout, record: RunRecord, task_id: str, succeeded: bool) -> list[Observation]:
    """The observations of a finished task's worker reports, keyed by its type, the model and its cost value."""
    task = record.tasks[task_id]
    if not record.snapshots:
        return []
    key = ObservationKey(task.type, record.snapshots[0].name, task.cost_value or "")
    shape = (task.plan or {}).get("shape", {})
    # The reports are written by the task's own pods: the server's facts (the pods it started, the kills for
    # memory it saw, the memory and processes it gave, the memory its executor measured) bound what they claim.
    kills = Counter(kill.worker for kill in record.oom_kills if kill.task_id == task_id)
    return observations_from_reports(
        store.run(record.run_id).task(task_id),
        key,
        succeeded,
        record.run_id,
        memory_gb=shape.get("memory_gb"),
        retry_memory_gb=shape.get("retry_memory_gb"),
        processes=shape.get("processes"),
        retry_processes=shape.get("retry_processes"),
        attempts=dict(task.attempts),
        kills=kills,
        measured_gb=dict(task.measured_memory_gb),
    )


class InProcessLearner:
    """Calls the learner's domain directly: the embedded server's learner port."""

    def __init__(self, learner: ResourceLearner, store: StoreLayout) -> None:
        self._learner = learner
        self._store = store

    def resolve(self, key: ObservationKey, hint: ResolvedResources) -> ResolvedResources:
        return self._learner.resolve(key, hint)

    def record_reports(self, record: RunRecord, task_id: str, succeeded: bool) -> int:
        return len(self._learner.record_all(_task_observations(self._store, record, task_id, succeeded)))

    def estimate(self, key: ObservationKey, units: int, pods: int, processes: int) -> float | None:
        try:
            return self._learner.estimate(key, units, pods, processes).seconds
        except FailedPrecondition:
            return None

    def close(self) -> None:
        """Nothing to release: the learner is closed by whoever made it."""


class GrpcLearner:
    """Calls the resource learner service at an address: the learner port of a tracker that runs alone.

    The observations of a finished task are still made here from its reports (the tracker has the store), then
    sent to the learner one by one.
    """

    def __init__(
        self,
        address: str,
        store: StoreLayout,
        token: str = "",
        timeout_s: float = 10.0,
        tls: TlsConfig | None = None,
        telemetry: Telemetry | None = None,
    ) -> None:
        self._channel = open_channel(
            address, token=token or None, telemetry=telemetry, credentials=service_credentials(tls)
        )
        self._stub = learner_pb2_grpc.ResourceLearnerServiceStub(self._channel)
        self._store = store
        self._timeout_s = timeout_s

    def _call(self, method: Any, request: Any) -> Any:
        try:
            return method(request, timeout=self._timeout_s)
        except grpc.RpcError as exc:
            raise to_domain_error(exc) from None

    def resolve(self, key: ObservationKey, hint: ResolvedResources) -> ResolvedResources:
        request = learner_pb2.ResolveResourcesRequest(
            key=convert.key_to_proto(key), hint=convert.resources_to_proto(hint)
        )
        return convert.resources_from_proto(self._call(self._stub.ResolveResources, request).resources)

    def record_reports(self, record: RunRecord, task_id: str, succeeded: bool) -> int:
        observations = _task_observations(self._store, record, task_id, succeeded)
        for observation in observations:
            request = learner_pb2.CreateObservationRequest(observation=convert.observation_to_proto(observation))
            self._call(self._stub.CreateObservation, request)
        return len(observations)

    def estimate(self, key: ObservationKey, units: int, pods: int, processes: int) -> float | None:
        request = learner_pb2.EstimateTaskRequest(
            key=convert.key_to_proto(key), units=units, pods=pods, processes=processes
        )
        try:
            return self._call(self._stub.EstimateTask, request).seconds
        except FailedPrecondition:
            return None

    def close(self) -> None:
        self._channel.close()
