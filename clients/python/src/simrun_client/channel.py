"""A gRPC channel to simrun with the caller's bearer token, and calls whose failures come back as domain errors."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple, TypeVar

import grpc
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


def open_channel(endpoint: str, token: str | None = None) -> grpc.Channel:
    """An insecure channel to `host:port` that sends `token` as a bearer token on every call, if given."""
    options = [
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ]
    channel = grpc.insecure_channel(endpoint, options=options)
    if token:
        channel = grpc.intercept_channel(channel, _BearerToken(token))
    return channel


def call(method: Callable[..., R], request: Any, **kwargs: Any) -> R:
    """Calls a stub method; a failed call raises the typed domain error (`NotFound`, `InvalidArgument`, …)."""
    try:
        return method(request, **kwargs)
    except grpc.RpcError as exc:
        raise to_domain_error(exc) from None
