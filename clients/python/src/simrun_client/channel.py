"""A gRPC channel to simrun with the caller's bearer token, and calls whose failures come back as domain errors."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

import grpc
from simrun_core.errors import InvalidArgument
from simrun_core.rpc.errors import to_domain_error

R = TypeVar("R")

# Uploads stream chunks of about 1 MiB; leave room for a header listing many files.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024


class _CallDetails(NamedTuple):
    method: str
    timeout: float | None
    metadata: Any
    credentials: Any
    wait_for_ready: bool | None
    compression: Any


class _BearerToken(
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
    grpc.StreamUnaryClientInterceptor,
    grpc.StreamStreamClientInterceptor,
):
    """Adds `authorization: Bearer <token>` to every call."""

    def __init__(self, token: str) -> None:
        # As `simrun_core.rpc.auth.bearer_metadata` says it; not imported from there, which loads pydantic.
        self._metadata = (("authorization", f"Bearer {token}"),)

    def _details(self, details: Any) -> _CallDetails:
        metadata = [*(details.metadata or ()), *self._metadata]
        return _CallDetails(
            details.method, details.timeout, metadata, details.credentials, details.wait_for_ready, details.compression
        )

    def intercept_unary_unary(self, continuation: Any, client_call_details: Any, request: Any) -> Any:
        return continuation(self._details(client_call_details), request)

    def intercept_unary_stream(self, continuation: Any, client_call_details: Any, request: Any) -> Any:
        return continuation(self._details(client_call_details), request)

    def intercept_stream_unary(self, continuation: Any, client_call_details: Any, request_iterator: Any) -> Any:
        return continuation(self._details(client_call_details), request_iterator)

    def intercept_stream_stream(self, continuation: Any, client_call_details: Any, request_iterator: Any) -> Any:
        return continuation(self._details(client_call_details), request_iterator)


def open_channel(
    endpoint: str,
    token: str | None = None,
    *,
    tls_ca: Path | None = None,
    tls_cert: Path | None = None,
    tls_key: Path | None = None,
) -> grpc.Channel:
    """A channel to `host:port` that sends `token` as a bearer token on every call, if given.

    With `tls_ca` the channel is TLS and verifies the server against that CA bundle (with `tls_cert` and
    `tls_key` it also presents a client certificate, for a server that asks for mutual TLS); without, plaintext,
    which a server beyond loopback refuses unless its config says `insecure: true`.
    """
    options = [
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ]
    if tls_ca is not None:
        credentials = channel_credentials(tls_ca, tls_cert, tls_key)
        channel = grpc.secure_channel(endpoint, credentials, options=options)
    else:
        channel = grpc.insecure_channel(endpoint, options=options)
    if token:
        channel = grpc.intercept_channel(channel, _BearerToken(token))
    return channel


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

    if (cert is None) != (key is None):
        raise InvalidArgument("a client certificate needs its key: give both --tls-cert and --tls-key")
    return grpc.ssl_channel_credentials(
        root_certificates=read(ca, "--tls-ca"),
        private_key=read(key, "--tls-key") if key else None,
        certificate_chain=read(cert, "--tls-cert") if cert else None,
    )


def call(method: Callable[..., R], request: Any, **kwargs: Any) -> R:
    """Calls a stub method; a failed call raises the typed domain error (`NotFound`, `InvalidArgument`, …)."""
    try:
        return method(request, **kwargs)
    except grpc.RpcError as exc:
        raise to_domain_error(exc) from None
