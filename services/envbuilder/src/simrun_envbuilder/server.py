"""Builds the environment builder's gRPC server."""

from __future__ import annotations

import grpc
from simrun.v1 import envbuilder_pb2, envbuilder_pb2_grpc
from simrun_core.config import ReadPolicy
from simrun_core.identity import TokenRegistry
from simrun_core.rpc.server import BoundServer, Registration, build_server

from simrun_envbuilder.builder import EnvironmentBuilder
from simrun_envbuilder.servicer import EnvironmentBuilderServicer

SERVICE_NAME = envbuilder_pb2.DESCRIPTOR.services_by_name["EnvironmentBuilderService"].full_name


def register(builder: EnvironmentBuilder, policy: ReadPolicy | None = None) -> Registration:
    """A registration that adds the EnvironmentBuilderService over `builder` to a server (for `simrun server`),
    its listing following `policy`."""

    def add(server: grpc.Server) -> None:
        servicer = EnvironmentBuilderServicer(builder, policy)
        envbuilder_pb2_grpc.add_EnvironmentBuilderServiceServicer_to_server(servicer, server)

    return add


def create_server(
    builder: EnvironmentBuilder,
    address: str,
    tokens: TokenRegistry | None = None,
    policy: ReadPolicy | None = None,
) -> BoundServer:
    """The environment builder with the production interceptors and health, bound to `address`, not yet started."""
    return build_server(address, [register(builder, policy)], [SERVICE_NAME], tokens=tokens)
