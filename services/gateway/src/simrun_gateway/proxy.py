"""Forwards the calls of services that run apart to their addresses, with the caller's token, unchanged.

The forwarding channels are traced like every other (the channel factory), so the service's span is a child of the
gateway's. The raw `traceparent`/`tracestate` of the caller are then not forwarded: a call would carry two, the
server would read one of them, and the gateway's span would drop out of the trace. Only when the gateway records
no spans (nothing configured, or telemetry off) are they passed on, so the service still joins the caller's trace.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import grpc
from simrun_core.config import TlsConfig
from simrun_core.rpc.channel import open_channel
from simrun_core.rpc.tls import service_credentials
from simrun_core.telemetry import Telemetry, process_telemetry

_FORWARDED_METADATA = ("authorization",)
_TRACE_METADATA = ("traceparent", "tracestate")
_NO_DEADLINE_S = 10 * 365 * 24 * 3600.0


def _identity(data: bytes) -> bytes:
    return data


class ForwardingHandler(grpc.GenericRpcHandler):
    """Serves every method of the named services by calling the same method at the service's address.

    Messages pass through as bytes, so the gateway needs no change when a service gains a method.
    """

    def __init__(
        self,
        routes: Mapping[str, str],
        streaming: Mapping[str, tuple[bool, bool]],
        telemetry: Telemetry | None = None,
        tls: TlsConfig | None = None,
    ) -> None:
        """`routes`: full service name -> address; `streaming`: full method name -> (client, server) streaming;
        `telemetry`: the gateway's (the process's own by default); `tls`: the config's TLS (see
        `service_credentials`), None for plaintext."""
        telemetry = telemetry or process_telemetry("simrun")
        credentials = service_credentials(tls)
        self._channels = {
            service: open_channel(address, telemetry=telemetry, credentials=credentials)
            for service, address in routes.items()
        }
        self._streaming = dict(streaming)
        self._forwarded = _FORWARDED_METADATA if telemetry.recording else _FORWARDED_METADATA + _TRACE_METADATA

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        method: str = handler_call_details.method  # type: ignore[attr-defined]
        service = method.rsplit("/", 1)[0].lstrip("/")
        channel = self._channels.get(service)
        if channel is None or method not in self._streaming:
            return None
        client_streaming, server_streaming = self._streaming[method]
        kwargs: dict[str, Any] = {"request_serializer": _identity, "response_deserializer": _identity}
        forwarded = self._forwarded

        def metadata(context: grpc.ServicerContext) -> list[tuple[str, str]]:
            return [(k, v) for k, v in context.invocation_metadata() if k in forwarded]

        if not client_streaming and not server_streaming:
            call = channel.unary_unary(method, **kwargs)

            def unary_unary(request: bytes, context: grpc.ServicerContext) -> bytes:
                return _relay(lambda: call(request, metadata=metadata(context), timeout=_timeout(context)), context)

            return grpc.unary_unary_rpc_method_handler(unary_unary)
        if not client_streaming:
            stream_call = channel.unary_stream(method, **kwargs)

            def unary_stream(request: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
                responses = stream_call(request, metadata=metadata(context), timeout=_timeout(context))
                context.add_callback(responses.cancel)
                yield from _relay_stream(responses, context)

            return grpc.unary_stream_rpc_method_handler(unary_stream)
        if not server_streaming:
            upload = channel.stream_unary(method, **kwargs)

            def stream_unary(requests: Iterator[bytes], context: grpc.ServicerContext) -> bytes:
                return _relay(lambda: upload(requests, metadata=metadata(context), timeout=_timeout(context)), context)

            return grpc.stream_unary_rpc_method_handler(stream_unary)
        both = channel.stream_stream(method, **kwargs)

        def stream_stream(requests: Iterator[bytes], context: grpc.ServicerContext) -> Iterator[bytes]:
            yield from _relay_stream(both(requests, metadata=metadata(context), timeout=_timeout(context)), context)

        return grpc.stream_stream_rpc_method_handler(stream_stream)

    def close(self) -> None:
        for channel in self._channels.values():
            channel.close()


def _timeout(context: grpc.ServicerContext) -> float | None:
    """The caller's remaining deadline, or None for a call without one.

    grpc reports a call without a deadline as about 9e18 seconds remaining, which a new call cannot take.
    """
    remaining = context.time_remaining()
    return remaining if 0 < remaining < _NO_DEADLINE_S else None


def _relay(call: Any, context: grpc.ServicerContext) -> bytes:
    try:
        return call()
    except grpc.RpcError as exc:
        context.abort(exc.code(), exc.details())  # type: ignore[attr-defined]
        raise


def _relay_stream(responses: Any, context: grpc.ServicerContext) -> Iterator[bytes]:
    try:
        yield from responses
    except grpc.RpcError as exc:
        context.abort(exc.code(), exc.details())  # type: ignore[attr-defined]


def method_shapes(*service_descriptors: Any) -> dict[str, tuple[bool, bool]]:
    """Full method name -> (client streaming, server streaming), from generated service descriptors."""
    shapes = {}
    for descriptor in service_descriptors:
        for method in descriptor.methods:
            shapes[f"/{descriptor.full_name}/{method.name}"] = (method.client_streaming, method.server_streaming)
    return shapes
