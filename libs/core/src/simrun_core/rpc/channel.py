"""The one way simrun opens a gRPC channel: the client's, the tracker's to the learner, the gateway's to services.

Every channel gets the process's tracing interceptor (a client span per call, the trace context in the metadata)
and, when given, a bearer token on every call.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import grpc

from simrun_core.telemetry_env import may_record

if TYPE_CHECKING:
    from simrun_core.telemetry import Telemetry

ChannelOption = tuple[str, Any]


class _CallDetails(NamedTuple):
    method: str
    timeout: float | None
    metadata: Any
    credentials: Any
    wait_for_ready: bool | None
    compression: Any


class BearerToken(
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
    grpc.StreamUnaryClientInterceptor,
    grpc.StreamStreamClientInterceptor,
):
    """Adds `authorization: Bearer <token>` to every call."""

    def __init__(self, token: str) -> None:
        # As `simrun_core.rpc.auth.bearer_metadata` says it; not imported from there, which loads pydantic
        # (the CLI's start).
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
    address: str,
    *,
    token: str | None = None,
    options: Sequence[ChannelOption] = (),
    telemetry: Telemetry | None = None,
    credentials: grpc.ChannelCredentials | None = None,
) -> grpc.Channel:
    """A channel to `host:port`, traced, sending `token` as a bearer token on every call if given.

    Args:
        address: `host:port` of the server.
        token: a bearer token; None or empty sends none (the gateway's proxy forwards each caller's own).
        options: gRPC channel options (message size limits, …).
        telemetry: where the channel's client spans go; the process's own by default (made only when it may
            record: a pass-through telemetry leaves a client channel as it is, so OpenTelemetry stays unloaded).
        credentials: TLS credentials; None for plaintext (which a server beyond loopback refuses unless its
            config says `insecure: true`).
    """
    if credentials is not None:
        channel = grpc.secure_channel(address, credentials, options=list(options))
    else:
        channel = grpc.insecure_channel(address, options=list(options))
    # The token interceptor sits inside the tracing one: the client span covers the whole call as sent.
    if token:
        channel = grpc.intercept_channel(channel, BearerToken(token))
    if telemetry is None:
        if not may_record():
            return channel
        from simrun_core.telemetry import process_telemetry

        telemetry = process_telemetry("simrun")
    return telemetry.instrument_channel(channel)


def open_aio_channel(
    address: str,
    *,
    options: Sequence[ChannelOption] = (),
    credentials: grpc.ChannelCredentials | None = None,
) -> grpc.aio.Channel:
    """An asyncio channel to `host:port`, for a process that follows many streams at once on its event loop.

    grpcio's blocking streams wake their reading thread ten times a second while they wait (its `_common.wait`),
    so a thread per followed stream costs CPU that grows with the streams; an asyncio channel waits on the
    event loop instead. It sends no token of its own (each call carries its caller's) and is not traced.

    Must be called with the event loop it is used on running.
    """
    if credentials is not None:
        return grpc.aio.secure_channel(address, credentials, options=list(options))
    return grpc.aio.insecure_channel(address, options=list(options))
