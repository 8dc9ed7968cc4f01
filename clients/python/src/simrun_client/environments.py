"""The environments of simrun through the client: list, get and follow the builds (EnvironmentBuilderService)."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
from simrun.v1 import common_pb2, envbuilder_pb2, envbuilder_pb2_grpc
from simrun_core.rpc.errors import to_domain_error

from simrun_client.client import Client


def _stub(client: Client) -> envbuilder_pb2_grpc.EnvironmentBuilderServiceStub:
    return envbuilder_pb2_grpc.EnvironmentBuilderServiceStub(client.channel)


def list_environments(client: Client, page_size: int = 0) -> list[common_pb2.Environment]:
    """Every environment, newest first, read page by page."""
    stub = _stub(client)
    request = envbuilder_pb2.ListEnvironmentsRequest(page_size=page_size)
    found: list[common_pb2.Environment] = []
    while True:
        try:
            response = stub.ListEnvironments(request, timeout=client.timeout_s)
        except grpc.RpcError as exc:
            raise to_domain_error(exc) from None
        found.extend(response.environments)
        if not response.next_page_token:
            return found
        request.page_token = response.next_page_token


def get_environment(client: Client, environment_id: str) -> common_pb2.Environment:
    """One environment now."""
    request = envbuilder_pb2.GetEnvironmentRequest(environment_id=environment_id)
    try:
        return _stub(client).GetEnvironment(request, timeout=client.timeout_s).environment
    except grpc.RpcError as exc:
        raise to_domain_error(exc) from None


def watch_environment(client: Client, environment_id: str) -> Iterator[envbuilder_pb2.WatchEnvironmentResponse]:
    """The environment and its build's new log lines until it is READY or FAILED."""
    call = _stub(client).WatchEnvironment(envbuilder_pb2.WatchEnvironmentRequest(environment_id=environment_id))
    try:
        yield from call
    except grpc.RpcError as exc:
        raise to_domain_error(exc) from None
    finally:
        call.cancel()
