"""The EnvironmentBuilderService servicer: decodes a request, makes one call on the builder, encodes the answer."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
from simrun.v1 import envbuilder_pb2, envbuilder_pb2_grpc
from simrun_core.paging import page

from simrun_envbuilder import convert
from simrun_envbuilder.builder import EnvironmentBuilder

DEFAULT_PAGE_SIZE = 100


class EnvironmentBuilderServicer(envbuilder_pb2_grpc.EnvironmentBuilderServiceServicer):
    """Serves one environment builder."""

    def __init__(self, builder: EnvironmentBuilder) -> None:
        self._builder = builder

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
        environments, next_token = page(
            self._builder.list_environments(), request.page_size, request.page_token, "environments", DEFAULT_PAGE_SIZE
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
