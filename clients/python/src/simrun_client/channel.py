"""A gRPC channel to simrun with the caller's bearer token, and calls whose failures come back as domain errors."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from simrun_core.errors import InvalidArgument
from simrun_core.telemetry_env import may_record

if TYPE_CHECKING:
    import grpc
    from simrun_core.telemetry import Telemetry

R = TypeVar("R")

# Uploads stream chunks of about 1 MiB; leave room for a header listing many files.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
SERVICE_NAME = "simrun-client"
"""The client's OpenTelemetry service name, unless `OTEL_SERVICE_NAME` names it."""


def open_channel(
    endpoint: str,
    token: str | None = None,
    *,
    tls_ca: Path | None = None,
    tls_cert: Path | None = None,
    tls_key: Path | None = None,
    telemetry: Telemetry | None = None,
) -> grpc.Channel:
    """A channel to `host:port` that sends `token` as a bearer token on every call, if given, and traces its calls
    (with the client's own telemetry from the OpenTelemetry variables unless `telemetry` is given; where those
    variables configure nothing and no provider is installed, the channel is left untraced without loading
    OpenTelemetry).

    With `tls_ca` the channel is TLS and verifies the server against that CA bundle (with `tls_cert` and
    `tls_key` it also presents a client certificate, for a server that asks for mutual TLS); without, plaintext,
    which a server beyond loopback refuses unless its config says `insecure: true`.
    """
    options = [
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ]
    # grpcio is imported here, not with the module: a client that makes its unary calls without it
    # (`simrun_client.unary`) reads this module's bounds and never opens a channel.
    from simrun_core.rpc import channel as rpc_channel

    credentials = channel_credentials(tls_ca, tls_cert, tls_key) if tls_ca is not None else None
    if telemetry is None and may_record():
        from simrun_core.telemetry import process_telemetry

        telemetry = process_telemetry(SERVICE_NAME)
    return rpc_channel.open_channel(
        endpoint, token=token, options=options, telemetry=telemetry, credentials=credentials
    )


def channel_credentials(ca: Path, cert: Path | None = None, key: Path | None = None) -> grpc.ChannelCredentials:
    """TLS credentials that trust the CA bundle `ca`, presenting `cert`/`key` when both are given.

    Raises:
        InvalidArgument: a file that cannot be read, or a certificate without its key.
    """

    def read(path: Path, what: str) -> bytes:
        try:
            return path.read_bytes()
        except OSError as exc:
            raise InvalidArgument(f"{what}: cannot read {path}: {exc.strerror}") from None

    import grpc

    if (cert is None) != (key is None):
        raise InvalidArgument("a client certificate needs its key: give both --tls-cert and --tls-key")
    return grpc.ssl_channel_credentials(
        root_certificates=read(ca, "--tls-ca"),
        private_key=read(key, "--tls-key") if key else None,
        certificate_chain=read(cert, "--tls-cert") if cert else None,
    )


def call(method: Callable[..., R], request: Any, **kwargs: Any) -> R:
    """Calls a stub method; a failed call raises the typed domain error (`NotFound`, `InvalidArgument`, …)."""
    import grpc
    from simrun_core.rpc.errors import to_domain_error

    try:
        return method(request, **kwargs)
    except grpc.RpcError as exc:
        raise to_domain_error(exc) from None
