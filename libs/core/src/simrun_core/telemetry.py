"""OpenTelemetry for simrun's processes: which tracer provider a process uses, and the W3C trace context carriers.

A process (a service, `simrun server`, the CLI, a script using `simrun_client`) makes one `Telemetry` and passes it
to the server factory and the channel factory, which put the gRPC instrumentation's interceptors on every server
and channel. The SDK's provider is made only when an exporter is configured by the standard variables
(`OTEL_EXPORTER_OTLP_ENDPOINT`, `OTEL_TRACES_EXPORTER`); otherwise the API's global provider is used, which is a
no-op unless the host program installed one, so nothing leaves the process and almost nothing is spent.
`OTEL_SDK_DISABLED=true` turns the instrumentation off altogether. The global provider is never set here: it can be
set once per process and `simrun server` runs every service in one, so providers are injected.

Runs outlive requests, so a trace context is also carried as a W3C `traceparent` string: kept in `run.json`,
given to pods as `TRACEPARENT` (the environment carrier; OpenTelemetry ships it only as a private module).
"""

from __future__ import annotations

import functools
import logging
import os
import re
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple

import grpc
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer, TracerProvider
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from simrun_core.errors import InvalidArgument
from simrun_core.telemetry_env import configured_exporters, disabled

log = logging.getLogger(__name__)

INSTRUMENTATION_NAME = "simrun"
TRACEPARENT = "TRACEPARENT"
"""The environment variable of a pod's trace context (W3C `traceparent` in an environment carrier)."""

_TRACEPARENT_RE = re.compile(r"^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$")
_PROPAGATOR = TraceContextTextMapPropagator()


class TelemetryError(InvalidArgument):
    """The telemetry variables ask for an exporter this installation does not have or simrun does not know."""


@dataclass(frozen=True)
class Telemetry:
    """The tracer provider of one process, and how its servers and channels are instrumented.

    Three ways, from cheapest: off (no interceptor at all); pass-through (a no-op provider: no span is made, a
    server only attaches a caller's trace context while it serves the call, so what it records, such as a run's
    context, joins the caller's trace); recording (spans for every call on servers and channels).

    Attributes:
        provider: where spans go; the API's global provider unless an exporter is configured.
        instrumented: False only when telemetry is off (`OTEL_SDK_DISABLED=true`, or `Telemetry.off()`).
        recording: spans are made (an SDK provider, or a global one the host program installed).
        owns_provider: the provider was made here (the SDK's), so `shutdown` flushes and closes it.
    """

    provider: TracerProvider
    instrumented: bool = True
    recording: bool = True
    owns_provider: bool = False
    _tracers: dict[str, Tracer] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def off(cls) -> Telemetry:
        """No interceptors and no spans: the baseline of the benchmark, and `OTEL_SDK_DISABLED=true`."""
        return cls(trace.NoOpTracerProvider(), instrumented=False, recording=False)

    @classmethod
    def noop(cls) -> Telemetry:
        """The API's no-op provider: trace context passes through, nothing is recorded."""
        return cls(trace.NoOpTracerProvider(), recording=False)

    @classmethod
    def with_provider(cls, provider: TracerProvider) -> Telemetry:
        """An injected provider (tests give an SDK provider with an in-memory exporter)."""
        return cls(provider, recording=_records(provider))

    @classmethod
    def from_environ(cls, service_name: str, environ: Mapping[str, str] | None = None) -> Telemetry:
        """The telemetry the standard OpenTelemetry variables ask for, named `service_name` unless
        `OTEL_SERVICE_NAME` names it. Without an exporter configured: the global provider, which records only if
        the host program installed one before this call (else pass-through).

        Raises:
            TelemetryError: `OTEL_TRACES_EXPORTER` names an exporter that is not installed.
        """
        env = os.environ if environ is None else environ
        if disabled(env):
            return cls.off()
        exporters = configured_exporters(env)
        if not exporters:
            return cls.with_provider(trace.get_tracer_provider())
        return cls(_sdk_provider(service_name, exporters, env), owns_provider=True)

    def tracer(self, name: str = INSTRUMENTATION_NAME) -> Tracer:
        tracer = self._tracers.get(name)
        if tracer is None:
            tracer = self._tracers[name] = self.provider.get_tracer(name)
        return tracer

    def server_interceptors(self) -> list[grpc.ServerInterceptor]:
        """The interceptors a server puts first, so their span wraps authentication and error mapping; health
        checks are not traced (probes call them every few seconds)."""
        if not self.instrumented:
            return []
        if not self.recording:
            return [_CallerContext()]
        # Imported here: the instrumentation package takes long to import, and clients never need it.
        from opentelemetry.instrumentation.grpc import server_interceptor

        return [server_interceptor(tracer_provider=self.provider, filter_=_not_health)]

    def instrument_channel(self, channel: grpc.Channel) -> grpc.Channel:
        """`channel` with a client span per call and its trace context in the call's metadata (when recording;
        a pass-through proxy forwards its caller's trace headers itself)."""
        if not self.recording:
            return channel
        return grpc.intercept_channel(channel, _ClientTracing(self.tracer("simrun.grpc.client")))

    def client_span(self, method: str, metadata: Sequence[tuple[str, str]]) -> tuple[ClientSpan, list[tuple[str, str]]]:
        """A client span of a call to `method` made by hand, a child of the current context, and the call's
        `metadata` carrying it; when not recording, no span and `metadata` as it is."""
        if not self.recording:
            return ClientSpan(None), list(metadata)
        span, traced = _start_client_span(self.tracer("simrun.grpc.client"), method, metadata)
        return ClientSpan(span), traced

    @contextmanager
    def span(
        self,
        name: str,
        *,
        parent: str | None = None,
        attributes: Mapping[str, Any] | None = None,
        kind: SpanKind = SpanKind.INTERNAL,
    ) -> Iterator[Span]:
        """A span around a block, made current; under `parent` (a `traceparent`) when given, else the current one.
        Not recording, a block without `parent` runs in the current span: a no-op span would carry its context."""
        if not self.recording and not parent:
            yield trace.get_current_span()
            return
        context = context_from_traceparent(parent) if parent else None
        with self.tracer().start_as_current_span(
            name, context=context, kind=kind, attributes=dict(attributes or {})
        ) as current:
            yield current

    def record_span(
        self,
        name: str,
        *,
        parent: str | None,
        start: datetime,
        end: datetime | None,
        attributes: Mapping[str, Any] | None = None,
        error: str | None = None,
    ) -> None:
        """Records a span that happened elsewhere or earlier (a pod attempt from its worker report) under `parent`."""
        context = context_from_traceparent(parent) if parent else None
        if parent and context is None:
            return
        span = self.tracer().start_span(
            name, context=context, attributes=dict(attributes or {}), start_time=_epoch_ns(start)
        )
        if error is not None:
            span.set_status(Status(StatusCode.ERROR, error))
        span.end(end_time=_epoch_ns(end or start))

    def flush(self) -> None:
        """Exports the spans ended so far (a short-lived command calls it before it exits)."""
        if self.owns_provider:
            self.provider.force_flush()  # type: ignore[attr-defined]

    def shutdown(self) -> None:
        """Flushes and closes the provider made here; a borrowed global provider belongs to its host."""
        if self.owns_provider:
            self.provider.shutdown()  # type: ignore[attr-defined]


def _global_propagator() -> Any:
    """The process's propagator (`OTEL_PROPAGATORS`), imported at its first use: loading it reads every installed
    package's entry points, a fifth of a CLI command's start when the command traces nothing."""
    from opentelemetry import propagate

    return propagate.get_global_textmap()


def _records(provider: TracerProvider) -> bool:
    """Whether spans of `provider` may be recorded: not the no-op, nor the global proxy before a provider is set."""
    return not isinstance(provider, trace.NoOpTracerProvider | trace.ProxyTracerProvider)


class _CallerContext(grpc.ServerInterceptor):
    """Pass-through: a call that carries a trace context is served with it attached; others are not wrapped."""

    def intercept_service(self, continuation: Any, handler_call_details: Any) -> Any:
        handler = continuation(handler_call_details)
        metadata = handler_call_details.invocation_metadata or ()
        carrier = {key: value for key, value in metadata if key in ("traceparent", "tracestate")}
        if handler is None or "traceparent" not in carrier:
            return handler
        context = _global_propagator().extract(carrier)

        def attached(behavior: Any) -> Any:
            def serve(request: Any, servicer_context: Any) -> Any:
                token = otel_context.attach(context)
                try:
                    return behavior(request, servicer_context)
                finally:
                    otel_context.detach(token)

            def serve_stream(request: Any, servicer_context: Any) -> Any:
                token = otel_context.attach(context)
                try:
                    yield from behavior(request, servicer_context)
                finally:
                    otel_context.detach(token)

            return serve_stream if handler.response_streaming else serve

        serializers = {
            "request_deserializer": handler.request_deserializer,
            "response_serializer": handler.response_serializer,
        }
        if handler.unary_unary:
            return grpc.unary_unary_rpc_method_handler(attached(handler.unary_unary), **serializers)
        if handler.unary_stream:
            return grpc.unary_stream_rpc_method_handler(attached(handler.unary_stream), **serializers)
        if handler.stream_unary:
            return grpc.stream_unary_rpc_method_handler(attached(handler.stream_unary), **serializers)
        return grpc.stream_stream_rpc_method_handler(attached(handler.stream_stream), **serializers)


class _CallDetails(NamedTuple):
    method: str
    timeout: float | None
    metadata: Any
    credentials: Any
    wait_for_ready: bool | None
    compression: Any


_HEALTH_PREFIX = "/grpc.health.v1.Health/"


class _ClientTracing(
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
    grpc.StreamUnaryClientInterceptor,
    grpc.StreamStreamClientInterceptor,
):
    """A client span per call, ended when the call is done, its context injected into the call's metadata.

    The instrumentation package's own client interceptor turns a streaming call into a bare generator, which has
    no `cancel()`: a client that stops reading a stream early could not end it. grpc's interceptors keep the call
    object, so spans end from its done callback with the same attributes (the RPC semantic conventions).
    """

    def __init__(self, tracer: Tracer) -> None:
        self._tracer = tracer

    def _call(self, continuation: Any, details: Any, request: Any) -> Any:
        method: str = details.method
        if method.startswith(_HEALTH_PREFIX):
            return continuation(details, request)
        span, metadata = _start_client_span(self._tracer, method, details.metadata or ())
        traced = _CallDetails(
            method, details.timeout, metadata, details.credentials, details.wait_for_ready, details.compression
        )
        try:
            call = continuation(traced, request)
        except BaseException as exc:
            span.set_status(Status(StatusCode.ERROR, str(exc)))
            span.end()
            raise
        call.add_done_callback(lambda done: _end_client_span(span, done.code(), done.details()))
        return call

    def intercept_unary_unary(self, continuation: Any, client_call_details: Any, request: Any) -> Any:
        return self._call(continuation, client_call_details, request)

    def intercept_unary_stream(self, continuation: Any, client_call_details: Any, request: Any) -> Any:
        return self._call(continuation, client_call_details, request)

    def intercept_stream_unary(self, continuation: Any, client_call_details: Any, request_iterator: Any) -> Any:
        return self._call(continuation, client_call_details, request_iterator)

    def intercept_stream_stream(self, continuation: Any, client_call_details: Any, request_iterator: Any) -> Any:
        return self._call(continuation, client_call_details, request_iterator)


def _start_client_span(tracer: Tracer, method: str, metadata: Any) -> tuple[Span, list[tuple[str, str]]]:
    """A client span of a call to `method`, and `metadata` with its context in place of any the caller put there
    (a proxy relaying its caller's)."""
    service, _, name = method.lstrip("/").partition("/")
    span = tracer.start_span(
        method, kind=SpanKind.CLIENT, attributes={"rpc.system": "grpc", "rpc.service": service, "rpc.method": name}
    )
    carrier: dict[str, str] = {}
    propagator = _global_propagator()
    propagator.inject(carrier, context=trace.set_span_in_context(span))
    fields = propagator.fields
    traced = [(k, v) for k, v in metadata if k not in fields]
    traced.extend(carrier.items())
    return span, traced


def _end_client_span(span: Span, code: grpc.StatusCode | None, details: str | None) -> None:
    if code is not None:
        span.set_attribute("rpc.grpc.status_code", code.value[0])
        if code != grpc.StatusCode.OK:
            span.set_status(Status(StatusCode.ERROR, f"{code.name}: {details or ''}"))
    span.end()


@dataclass
class ClientSpan:
    """The client span of a call made on a channel the telemetry does not instrument (the gateway relays streams
    on an asyncio channel); its maker ends it with the call's status. Without recording it is no span at all."""

    span: Span | None

    def end(self, code: grpc.StatusCode | None, details: str | None = None) -> None:
        if self.span is not None:
            _end_client_span(self.span, code, details)
            self.span = None


def _not_health(details: Any) -> bool:
    """The instrumentation's filter: trace every call but the health checks."""
    return not str(getattr(details, "method", "")).startswith(_HEALTH_PREFIX)


def _epoch_ns(moment: datetime) -> int:
    return int(moment.timestamp() * 1_000_000_000)


def _sdk_provider(service_name: str, exporters: list[str], env: Mapping[str, str]) -> TracerProvider:
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider as SdkTracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

    resource = Resource.create({"service.name": env.get("OTEL_SERVICE_NAME", "").strip() or service_name})
    provider = SdkTracerProvider(resource=resource)
    for name in exporters:
        if name == "console":
            from opentelemetry.sdk.trace.export import ConsoleSpanExporter

            # stderr: a command's stdout (its --json) stays what programs read.
            provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter(out=sys.stderr)))
        elif name == "otlp":
            provider.add_span_processor(BatchSpanProcessor(_otlp_exporter(env)))
        else:
            raise TelemetryError(f"OTEL_TRACES_EXPORTER={name!r} is not supported: use otlp, console or none")
    return provider


def _otlp_exporter(env: Mapping[str, str]) -> Any:
    protocol = (
        env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "").strip()
        or env.get("OTEL_EXPORTER_OTLP_PROTOCOL", "").strip()
        or "grpc"
    )
    try:
        if protocol == "grpc":
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        elif protocol.startswith("http"):
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter  # type: ignore[assignment]
        else:
            raise TelemetryError(
                f"OTEL_EXPORTER_OTLP_PROTOCOL={protocol!r} is not supported: use grpc or http/protobuf"
            )
    except ImportError:
        raise TelemetryError(
            "an OTLP exporter is configured but not installed: install simrun-core[otlp] "
            "(or unset OTEL_EXPORTER_OTLP_ENDPOINT / OTEL_TRACES_EXPORTER)"
        ) from None
    return OTLPSpanExporter()


@functools.cache
def process_telemetry(service_name: str) -> Telemetry:
    """The telemetry of this process for `service_name`, made once from the environment (every channel of a
    client shares its provider, and so its exporter)."""
    return Telemetry.from_environ(service_name)


def current_traceparent() -> str | None:
    """The W3C `traceparent` of the current span, or None when there is no valid one (nothing traced)."""
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier)
    return carrier.get("traceparent")


def traceparent_of(span: Span) -> str | None:
    """The W3C `traceparent` of `span`, or None for an invalid (no-op) span."""
    context = span.get_span_context()
    if not context.is_valid:
        return None
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"


def context_from_traceparent(traceparent: str) -> Context | None:
    """A context whose parent is the remote span `traceparent` names; None for a malformed value."""
    value = traceparent.strip().lower()
    if not _TRACEPARENT_RE.match(value):
        return None
    context = _PROPAGATOR.extract({"traceparent": value})
    if not trace.get_current_span(context).get_span_context().is_valid:
        return None
    return context


def trace_id_of(traceparent: str | None) -> str:
    """The trace id (32 hex digits) of a `traceparent`, or "" without one: what a user looks up in a backend."""
    if not traceparent or context_from_traceparent(traceparent) is None:
        return ""
    return traceparent.strip().lower().split("-")[1]


def within_trace(traceparent: str | None, trace_of: str | None) -> str | None:
    """`traceparent` if it names a span of the same trace as `trace_of`, else None: a pod's report is written where
    the pod's code may write, so its `traceparent` may hang a span under the run's trace only, never another's."""
    trace_id = trace_id_of(traceparent)
    return traceparent if trace_id and trace_id == trace_id_of(trace_of) else None
