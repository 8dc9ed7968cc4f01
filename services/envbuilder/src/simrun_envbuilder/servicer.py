"""The EnvironmentBuilderService servicer: decodes a request, makes one call on the builder, encodes the answer."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
from simrun.v1 import envbuilder_pb2, envbuilder_pb2_grpc
from simrun_core.access import may_read_any
from simrun_core.config import ReadPolicy
from simrun_core.identity import Identity, IdentityKind
from simrun_core.paging import page
from simrun_core.rpc.auth import caller_identity
from simrun_core.snapshots.store import SnapshotStore

from simrun_envbuilder import convert
from simrun_envbuilder.builder import DEFAULT_ENVIRONMENT, Environment, EnvironmentBuilder

DEFAULT_PAGE_SIZE = 100


class EnvironmentBuilderServicer(envbuilder_pb2_grpc.EnvironmentBuilderServiceServicer):
    """Serves one environment builder; its listing follows the read policy."""

    def __init__(self, builder: EnvironmentBuilder, policy: ReadPolicy | None = None) -> None:
        self._builder = builder
        self._policy = policy or ReadPolicy()
        self._snapshots = SnapshotStore(builder.store.root)

    def _visible(self, identity: Identity | None, environment: Environment) -> bool:
        """The owner and services see every environment; another identity those resolved for a model snapshot
        of an identity it may read (the snapshot's readers: who uploaded or named it, the runs' submitters)."""
        if identity is None or identity.is_owner or identity.kind is IdentityKind.SERVICE:
            return True
        if environment.environment_id == DEFAULT_ENVIRONMENT:
            return True
        for name, snapshot_id in self._builder.readers.models(environment.environment_id):
            readers = self._snapshots.readers(name, snapshot_id)
            if readers is not None and may_read_any(identity, readers, self._policy):
                return True
        return False

    def CreateEnvironment(
        self, request: envbuilder_pb2.CreateEnvironmentRequest, context: grpc.ServicerContext
    ) -> envbuilder_pb2.CreateEnvironmentResponse:
        snapshots = convert.snapshots_from_proto(self._builder.store, request.snapshots)
        environment = self._builder.resolve(snapshots, request.python_version)
        return envbuilder_pb2.CreateEnvironmentResponse(environment=convert.environment_to_proto(environment))

    def GetEnvironment(
        self, request: envbuilder_pb2.GetEnvironmentRequest, context: grpc.ServicerContext
    ) -> envbuilder_pb2.GetEnvironmentResponse:
        environment = self._builder.get(request.environment_id)
        lock = self._builder.lock_of(environment.environment_id).decode() if request.include_lock else ""
        return envbuilder_pb2.GetEnvironmentResponse(environment=convert.environment_to_proto(environment), lock=lock)

    def ListEnvironments(
        self, request: envbuilder_pb2.ListEnvironmentsRequest, context: grpc.ServicerContext
    ) -> envbuilder_pb2.ListEnvironmentsResponse:
        identity = caller_identity()
        environments, next_token = page(
            [e for e in self._builder.list_environments() if self._visible(identity, e)],
            request.page_size,
            request.page_token,
            "environments",
            DEFAULT_PAGE_SIZE,
        )
        return envbuilder_pb2.ListEnvironmentsResponse(
            environments=[convert.environment_to_proto(e) for e in environments], next_page_token=next_token
        )

    def WatchEnvironment(
        self, request: envbuilder_pb2.WatchEnvironmentRequest, context: grpc.ServicerContext
    ) -> Iterator[envbuilder_pb2.WatchEnvironmentResponse]:
        for environment, lines in self._builder.watch(request.environment_id):
            if not context.is_active():
                return
            yield envbuilder_pb2.WatchEnvironmentResponse(
                environment=convert.environment_to_proto(environment), log_lines=lines
            )
