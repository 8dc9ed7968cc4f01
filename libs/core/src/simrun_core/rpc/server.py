"""The one way simrun builds a gRPC server: interceptors (tracing, auth, then errors), health, a bound port."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from concurrent import futures
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from simrun_core.errors import SimrunError
from simrun_core.identity import TokenRegistry
from simrun_core.rpc.auth import AuthInterceptor
from simrun_core.rpc.errors import ErrorInterceptor
from simrun_core.telemetry import Telemetry, process_telemetry

Registration = Callable[[grpc.Server], None]


@dataclass
class BoundServer:
    """A built server, not yet started, and the port it is bound to."""

    server: grpc.Server
    port: int
    health: health.HealthServicer

    def start(self) -> BoundServer:
        self.server.start()
        return self

    def stop(self, grace_s: float | None = 2.0) -> None:
        self.health.enter_graceful_shutdown()
        self.server.stop(grace_s).wait()


def build_server(
    address: str,
    registrations: Iterable[Registration],
    service_names: Iterable[str],
    *,
    tokens: TokenRegistry | None = None,
    translate: Mapping[type[Exception], type[SimrunError]] | None = None,
    max_concurrent_calls: int = 1000,
    telemetry: Telemetry | None = None,
) -> BoundServer:
    """Builds a server with the production interceptors and `grpc.health.v1`, bound to `address`.

    Args:
        address: `host:port`; port 0 picks a free one.
        registrations: callables that add servicers to the server.
        service_names: full names of the services, reported SERVING by the health service.
        tokens: when given, every call but health checks needs a known bearer token.
        translate: a domain's own exception types and the `SimrunError` they stand for.
        max_concurrent_calls: calls served at once, streams included; one more is refused at once with
            RESOURCE_EXHAUSTED instead of waiting. A stream holds a thread while open, but a watching stream waits
            on a condition (no CPU), and threads are made only as calls need them, so the bound is cheap to keep
            high; one thread above it is kept free for the calls that must answer the refusal.
        telemetry: where the server's spans go; the process's own (from the OpenTelemetry variables) by default.
    """
    # Tracing first, so a call's span covers authentication and error mapping (a refused call records status 16).
    interceptors: list[grpc.ServerInterceptor] = [*(telemetry or process_telemetry("simrun")).server_interceptors()]
    if tokens is not None:
        interceptors.append(AuthInterceptor(tokens))
    interceptors.append(ErrorInterceptor(translate))
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=max_concurrent_calls + 1, thread_name_prefix="simrun-rpc"),
        interceptors=interceptors,
        maximum_concurrent_rpcs=max_concurrent_calls,
        options=[("grpc.so_reuseport", 0)],
    )
    for register in registrations:
        register(server)
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    for name in [*service_names, ""]:
        health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    port = server.add_insecure_port(address)
    if port == 0:
        raise OSError(f"cannot bind the gRPC server to {address}")
    return BoundServer(server, port, health_servicer)
