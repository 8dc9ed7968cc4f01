"""Forwards the calls of services that run apart to their addresses, with the caller's token, unchanged.

The calls go out on asyncio channels driven by one event loop thread of the gateway (the relay). grpcio's blocking
client wakes its waiting thread ten times a second (its `_common.wait`), so a forwarded stream that waits, as
following a run does for hours, would cost CPU that grows with the streams; a served call's thread here waits on
a future of the relay instead, which wakes only when the service sends.

Forwarded calls are traced by hand (a client span per call, `Telemetry.client_span`), so the service's span is a
child of the gateway's. The raw `traceparent`/`tracestate` of the caller are then not forwarded: a call would carry
two, the server would read one of them, and the gateway's span would drop out of the trace. Only when the gateway
records no spans (nothing configured, or telemetry off) are they passed on, so the service still joins the
caller's trace.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import Callable, Coroutine, Iterator, Mapping
from typing import Any, TypeVar

import grpc
from simrun_core.config import TlsConfig
from simrun_core.rpc.channel import open_aio_channel
from simrun_core.rpc.tls import service_credentials
from simrun_core.telemetry import ClientSpan, Telemetry, process_telemetry

_FORWARDED_METADATA = ("authorization",)
_TRACE_METADATA = ("traceparent", "tracestate")
_NO_DEADLINE_S = 10 * 365 * 24 * 3600.0

T = TypeVar("T")


def _identity(data: bytes) -> bytes:
    return data


class _Relay:
    """An event loop in a thread of its own, and the asyncio channels to the services on it."""

    def __init__(self, routes: Mapping[str, str], credentials: grpc.ChannelCredentials | None) -> None:
        self.loop = asyncio.new_event_loop()
        self._closing = False
        self._thread = threading.Thread(target=self.loop.run_forever, name="simrun-gateway-relay", daemon=True)
        self._thread.start()

        async def open_channels() -> dict[str, grpc.aio.Channel]:
            return {service: open_aio_channel(address, credentials=credentials) for service, address in routes.items()}

        self.channels = self.run(open_channels())

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """The result of `coroutine` run on the relay's loop; the calling thread waits without waking."""
        return self.submit(coroutine).result()

    def submit(self, coroutine: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        if self._closing:  # a loop that stops would leave the future unanswered, and its waiter waiting
            coroutine.close()
            raise concurrent.futures.CancelledError("the gateway is stopping")
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop)

    def call_soon(self, callback: Callable[[], object]) -> None:
        """`callback` on the relay's loop, unless the relay is closed (a call that ends as the gateway stops)."""
        with contextlib.suppress(RuntimeError):  # closed: its calls were ended with its channels
            self.loop.call_soon_threadsafe(callback)

    def close(self) -> None:
        if self._closing:
            return

        async def close_channels() -> None:
            for channel in self.channels.values():
                await channel.close()

        # Closing a channel ends its calls, so every waiter is answered before the loop stops.
        closed = self.submit(close_channels())
        self._closing = True
        closed.result()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()


class ForwardingHandler(grpc.GenericRpcHandler):
    """Serves every method of the named services by calling the same method at the service's address.

    Messages pass through as bytes, so the gateway needs no change when a service gains a method. A caller's
    deadline goes with the call; a caller that cancels cancels the forwarded call.
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
        self._telemetry = telemetry or process_telemetry("simrun")
        self._relay = _Relay(routes, service_credentials(tls))
        self._streaming = dict(streaming)
        recording = self._telemetry.recording
        self._forwarded = _FORWARDED_METADATA if recording else _FORWARDED_METADATA + _TRACE_METADATA

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        method: str = handler_call_details.method  # type: ignore[attr-defined]
        channel = self._relay.channels.get(method.rsplit("/", 1)[0].lstrip("/"))
        if channel is None or method not in self._streaming:
            return None
        client_streaming, server_streaming = self._streaming[method]
        shape = {"request_serializer": _identity, "response_deserializer": _identity}
        if not client_streaming and not server_streaming:
            unary = channel.unary_unary(method, **shape)

            def unary_unary(request: bytes, context: grpc.ServicerContext) -> bytes:
                with _Forwarded(self, method, context) as forwarded:
                    return forwarded.answer(lambda options: unary(request, **options))

            return grpc.unary_unary_rpc_method_handler(unary_unary)
        if not client_streaming:
            stream = channel.unary_stream(method, **shape)

            def unary_stream(request: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
                with _Forwarded(self, method, context) as forwarded:
                    yield from forwarded.responses(forwarded.start(lambda options: stream(request, **options)))

            return grpc.unary_stream_rpc_method_handler(unary_stream)
        if not server_streaming:
            upload = channel.stream_unary(method, **shape)

            def stream_unary(requests: Iterator[bytes], context: grpc.ServicerContext) -> bytes:
                with _Forwarded(self, method, context) as forwarded:
                    call = forwarded.start(lambda options: upload(**options))
                    forwarded.send(call, requests)
                    return forwarded.answer(lambda _: call)

            return grpc.stream_unary_rpc_method_handler(stream_unary)
        both = channel.stream_stream(method, **shape)

        def stream_stream(requests: Iterator[bytes], context: grpc.ServicerContext) -> Iterator[bytes]:
            with _Forwarded(self, method, context) as forwarded:
                call = forwarded.start(lambda options: both(**options))
                # The requests are read in a thread of their own, as the responses may come before they end; it
                # ends with them, or when this call ends (its requests then break off).
                threading.Thread(target=forwarded.send, args=(call, requests), daemon=True).start()
                yield from forwarded.responses(call)

        return grpc.stream_stream_rpc_method_handler(stream_stream)

    def close(self) -> None:
        self._relay.close()


class _Forwarded:
    """One served call forwarded on the relay: its metadata and deadline, its client span, and its cancellation
    when the caller goes; a service's refusal is the caller's, with the same code and details."""

    def __init__(self, handler: ForwardingHandler, method: str, context: grpc.ServicerContext) -> None:
        self._relay = handler._relay
        self._context = context
        metadata = [(k, v) for k, v in context.invocation_metadata() if k in handler._forwarded]
        self._span: ClientSpan
        self._span, metadata = handler._telemetry.client_span(method, metadata)
        self._options = {"metadata": metadata, "timeout": _timeout(context)}
        self._calls: list[Any] = []
        context.add_callback(self._cancel)

    def __enter__(self) -> _Forwarded:
        return self

    def __exit__(self, kind: Any, error: BaseException | None, traceback: Any) -> None:
        self._cancel()  # a no-op for calls that ended; ends one whose caller went before it was made
        if error is None:
            self._span.end(grpc.StatusCode.OK)
        elif isinstance(error, GeneratorExit | grpc.RpcError):  # the caller went (or its requests broke off)
            self._span.end(grpc.StatusCode.CANCELLED)
        else:  # a service's refusal ended the span already (`_relayed`); anything else grpc reports as UNKNOWN
            self._span.end(grpc.StatusCode.UNKNOWN, str(error))

    def _cancel(self) -> None:
        for call in self._calls:
            self._relay.call_soon(call.cancel)

    def start(self, make: Callable[[dict[str, Any]], T]) -> T:
        """The call `make` makes with this call's options, made on the relay's loop (asyncio calls must be)."""

        async def made() -> T:
            return self._made(make)

        return self._relay.run(made())

    def answer(self, make: Callable[[dict[str, Any]], Any]) -> Any:
        """What the call `make` makes (or has made) answers, in one trip to the relay."""

        async def answered() -> Any:
            return await self._made(make)

        return self._relayed(lambda: self._relay.run(answered()))

    def _made(self, make: Callable[[dict[str, Any]], T]) -> T:
        call = make(self._options)
        if call not in self._calls:
            self._calls.append(call)
        return call

    def responses(self, call: Any) -> Iterator[bytes]:
        """The messages of a streaming call, read one at a time: the service sends no faster than the caller reads."""
        while True:
            message = self._relayed(lambda: self._relay.run(call.read()))
            if message is grpc.aio.EOF:
                return
            yield message

    def send(self, call: Any, requests: Iterator[bytes]) -> None:
        """Writes the caller's messages to the call, then says it is done writing."""
        try:
            for request in requests:
                self._relay.run(call.write(request))
            self._relay.run(call.done_writing())
        except (grpc.RpcError, asyncio.InvalidStateError, concurrent.futures.CancelledError):
            pass  # the call ended (its reader reports why) or the caller went

    def _relayed(self, wait: Callable[[], T]) -> T:
        try:
            return wait()
        except grpc.RpcError as exc:
            self._span.end(exc.code(), exc.details())
            self._context.abort(exc.code(), exc.details() or "")  # type: ignore[attr-defined]
            raise
        except concurrent.futures.CancelledError:
            self._span.end(grpc.StatusCode.CANCELLED)
            self._context.abort(grpc.StatusCode.CANCELLED, "the call was cancelled")  # type: ignore[attr-defined]
            raise


def _timeout(context: grpc.ServicerContext) -> float | None:
    """The caller's remaining deadline, or None for a call without one.

    grpc reports a call without a deadline as about 9e18 seconds remaining, which a new call cannot take.
    """
    remaining = context.time_remaining()
    return remaining if 0 < remaining < _NO_DEADLINE_S else None


def method_shapes(*service_descriptors: Any) -> dict[str, tuple[bool, bool]]:
    """Full method name -> (client streaming, server streaming), from generated service descriptors."""
    shapes = {}
    for descriptor in service_descriptors:
        for method in descriptor.methods:
            shapes[f"/{descriptor.full_name}/{method.name}"] = (method.client_streaming, method.server_streaming)
    return shapes
