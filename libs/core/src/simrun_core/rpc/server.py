"""The one way simrun builds a gRPC server: interceptors (tracing, auth, then errors), health, a bound port."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from simrun_core.config import TlsConfig, is_loopback
from simrun_core.errors import InvalidArgument, SimrunError
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
    calls_per_identity: int | None = None,
    tls: TlsConfig | None = None,
    insecure: bool = False,
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
        calls_per_identity: calls one identity (not the owner, not a service) may have open at once; None: no
            bound but `max_concurrent_calls`.
        tls: serve TLS with this certificate and key (and require client certificates of its client CA).
        insecure: serve plaintext beyond loopback; without it such an address needs `tls`.
        telemetry: where the server's spans go; the process's own (from the OpenTelemetry variables) by default.

    Raises:
        InvalidArgument: plaintext on an address beyond loopback without `insecure`, or unreadable TLS files.
        OSError: the address is taken (the port is bound without SO_REUSEPORT, so a second server is refused).
    """
    check_transport(address, tls, insecure)
    credentials = server_credentials(tls) if tls is not None else None
    # Tracing first, so a call's span covers authentication and error mapping (a refused call records status 16).
    interceptors: list[grpc.ServerInterceptor] = [*(telemetry or process_telemetry("simrun")).server_interceptors()]
    if tokens is not None:
        interceptors.append(AuthInterceptor(tokens, calls_per_identity))
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
    try:
        port = server.add_secure_port(address, credentials) if credentials else server.add_insecure_port(address)
    except RuntimeError:
        port = 0
    if port == 0:
        raise OSError(f"cannot bind the gRPC server to {address}: is another server running there?")
    return BoundServer(server, port, health_servicer)


def check_transport(address: str, tls: TlsConfig | None, insecure: bool) -> None:
    """Refuses plaintext on an address beyond loopback unless the config says `insecure: true`.

    Raises:
        InvalidArgument: such an address without TLS.
    """
    if tls is None and not insecure and not is_loopback(address):
        raise InvalidArgument(
            f"refusing to serve plaintext on {address}: bearer tokens would cross the network in the clear; "
            "give the config tls: {cert, key} or bind to 127.0.0.1 (insecure: true serves plaintext anyway)"
        )


def server_credentials(tls: TlsConfig) -> grpc.ServerCredentials:
    """The TLS credentials of a config: its certificate and key, and its client CA for mutual TLS."""

    def read(path: Path, what: str) -> bytes:
        try:
            return path.read_bytes()
        except OSError as exc:
            raise InvalidArgument(f"tls.{what}: cannot read {path}: {exc.strerror}") from exc

    pair = [(read(tls.key, "key"), read(tls.cert, "cert"))]
    if tls.client_ca is None:
        return grpc.ssl_server_credentials(pair)
    return grpc.ssl_server_credentials(
        pair, root_certificates=read(tls.client_ca, "client_ca"), require_client_auth=True
    )
