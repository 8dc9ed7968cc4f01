"""Telemetry through real servers and channels on loopback, with injected SDK providers and in-memory exporters."""

from __future__ import annotations

import gc
import importlib.util
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from simrun.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc
from simrun_core.errors import InvalidArgument
from simrun_core.identity import TokenRegistry
from simrun_core.rpc.channel import open_channel
from simrun_core.rpc.server import BoundServer, build_server
from simrun_core.rpc.serving import serve
from simrun_core.telemetry import (
    Telemetry,
    TelemetryError,
    context_from_traceparent,
    current_traceparent,
    trace_id_of,
    traceparent_of,
)

TOKENS = TokenRegistry.from_mapping({"owner": "alice", "tokens": {"t-alice": {"name": "alice"}}})
GATEWAY = gateway_pb2.DESCRIPTOR.services_by_name["GatewayService"].full_name


def sdk(exporter: InMemorySpanExporter, service: str) -> Telemetry:
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return Telemetry.with_provider(provider)


class Gateway(gateway_pb2_grpc.GatewayServiceServicer):
    """GetIdentity answers, remembering the span it was served in."""

    def __init__(self) -> None:
        self.spans: list[Any] = []

    def GetIdentity(self, request: Any, context: grpc.ServicerContext) -> gateway_pb2.GetIdentityResponse:
        self.spans.append(trace.get_current_span())
        return gateway_pb2.GetIdentityResponse(identity=common_pb2.Identity(name="alice"))


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


def start(servicer: Gateway, telemetry: Telemetry) -> BoundServer:
    return build_server(
        "127.0.0.1:0",
        [lambda s: gateway_pb2_grpc.add_GatewayServiceServicer_to_server(servicer, s)],
        [GATEWAY],
        tokens=TOKENS,
        max_concurrent_calls=8,
        telemetry=telemetry,
    ).start()


@pytest.fixture
def traced(exporter: InMemorySpanExporter) -> Iterator[tuple[BoundServer, Gateway]]:
    servicer = Gateway()
    server = start(servicer, sdk(exporter, "server"))
    yield server, servicer
    server.stop(None)


def test_a_server_span_is_the_child_of_the_client_span(traced, exporter):
    server, _ = traced
    client = sdk(exporter, "client")
    with open_channel(f"127.0.0.1:{server.port}", token="t-alice", telemetry=client) as channel:
        gateway_pb2_grpc.GatewayServiceStub(channel).GetIdentity(gateway_pb2.GetIdentityRequest())
    spans = {span.kind: span for span in exporter.get_finished_spans()}
    assert set(spans) == {SpanKind.CLIENT, SpanKind.SERVER}
    client_span, server_span = spans[SpanKind.CLIENT], spans[SpanKind.SERVER]
    assert client_span.resource.attributes["service.name"] == "client"
    assert server_span.resource.attributes["service.name"] == "server"
    assert server_span.context.trace_id == client_span.context.trace_id
    assert server_span.parent is not None and server_span.parent.span_id == client_span.context.span_id
    assert server_span.name == f"/{GATEWAY}/GetIdentity"


def test_a_call_without_a_token_records_status_16(traced, exporter):
    server, servicer = traced
    channel = open_channel(f"127.0.0.1:{server.port}", telemetry=sdk(exporter, "client"))
    with channel, pytest.raises(grpc.RpcError) as caught:
        gateway_pb2_grpc.GatewayServiceStub(channel).GetIdentity(gateway_pb2.GetIdentityRequest())
    assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert servicer.spans == []  # refused before the servicer
    spans = {span.kind: span for span in exporter.get_finished_spans()}
    assert spans[SpanKind.SERVER].attributes["rpc.grpc.status_code"] == 16
    # The semantic conventions: a refused call is an error of the caller's, not of the server's.
    assert spans[SpanKind.CLIENT].status.status_code == StatusCode.ERROR
    assert spans[SpanKind.CLIENT].attributes["rpc.grpc.status_code"] == 16


def test_health_checks_are_not_traced(traced, exporter):
    server, _ = traced
    with open_channel(f"127.0.0.1:{server.port}", telemetry=sdk(exporter, "client")) as channel:
        response = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=GATEWAY))
    assert response.status == health_pb2.HealthCheckResponse.SERVING
    assert exporter.get_finished_spans() == ()


def test_with_nothing_configured_no_span_is_recorded():
    # The API's global provider: a no-op here, since no test sets it (a host program may).
    telemetry = Telemetry.from_environ("simrun-test", {})
    assert telemetry.instrumented and not telemetry.recording and not telemetry.owns_provider
    servicer = Gateway()
    server = start(servicer, telemetry)
    try:
        with open_channel(f"127.0.0.1:{server.port}", token="t-alice", telemetry=telemetry) as channel:
            gateway_pb2_grpc.GatewayServiceStub(channel).GetIdentity(gateway_pb2.GetIdentityRequest())
    finally:
        server.stop(None)
    (span,) = servicer.spans
    assert not span.is_recording()
    assert not span.get_span_context().is_valid


def test_a_noop_server_passes_the_callers_context_on(exporter):
    """A service with nothing configured keeps the caller's trace going: what it calls joins the same trace."""
    servicer = Gateway()
    server = start(servicer, Telemetry.noop())
    try:
        client = sdk(exporter, "client")
        with open_channel(f"127.0.0.1:{server.port}", token="t-alice", telemetry=client) as channel:
            gateway_pb2_grpc.GatewayServiceStub(channel).GetIdentity(gateway_pb2.GetIdentityRequest())
    finally:
        server.stop(None)
    (client_span,) = exporter.get_finished_spans()
    (span,) = servicer.spans
    assert not span.is_recording()
    assert span.get_span_context().trace_id == client_span.context.trace_id


def test_telemetry_off_adds_no_interceptor():
    off = Telemetry.off()
    assert off.server_interceptors() == []
    channel = grpc.insecure_channel("127.0.0.1:1")
    assert off.instrument_channel(channel) is channel
    channel.close()
    assert not Telemetry.from_environ("x", {"OTEL_SDK_DISABLED": "true"}).instrumented


def test_the_sdk_is_installed_only_when_an_exporter_is_configured():
    assert not Telemetry.from_environ("x", {}).owns_provider
    assert not Telemetry.from_environ("x", {"OTEL_TRACES_EXPORTER": "none"}).owns_provider
    console = Telemetry.from_environ("simrun-x", {"OTEL_TRACES_EXPORTER": "console"})
    assert console.owns_provider
    assert console.provider.resource.attributes["service.name"] == "simrun-x"  # type: ignore[attr-defined]
    named = Telemetry.from_environ("simrun-x", {"OTEL_TRACES_EXPORTER": "console", "OTEL_SERVICE_NAME": "mine"})
    assert named.provider.resource.attributes["service.name"] == "mine"  # type: ignore[attr-defined]
    console.shutdown()
    named.shutdown()
    with pytest.raises(TelemetryError, match="OTEL_TRACES_EXPORTER='zipkin' is not supported"):
        Telemetry.from_environ("x", {"OTEL_TRACES_EXPORTER": "zipkin"})
    assert issubclass(TelemetryError, InvalidArgument)  # a bad variable is bad input: exit 2, one line


def test_an_otlp_endpoint_needs_the_otlp_extra():
    environ = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317"}
    try:
        installed = importlib.util.find_spec("opentelemetry.exporter.otlp.proto.grpc") is not None
    except ModuleNotFoundError:
        installed = False
    if not installed:
        with pytest.raises(TelemetryError, match=r"install simrun-core\[otlp\]"):
            Telemetry.from_environ("x", environ)
    else:
        telemetry = Telemetry.from_environ("x", environ)
        assert telemetry.owns_provider
        telemetry.shutdown()


def test_traceparent_round_trip(exporter):
    telemetry = sdk(exporter, "t")
    assert current_traceparent() is None  # nothing traced: nothing to carry
    with telemetry.span("outer") as span:
        carried = current_traceparent()
        assert carried == traceparent_of(span)
    assert carried is not None
    context = context_from_traceparent(carried)
    assert context is not None
    assert trace.get_current_span(context).get_span_context().span_id == span.get_span_context().span_id
    assert trace_id_of(carried) == f"{span.get_span_context().trace_id:032x}"
    for bad in ("", "nonsense", "00-" + "0" * 32 + "-" + "0" * 16 + "-01", "00-abc-def-01"):
        assert context_from_traceparent(bad) is None
        assert trace_id_of(bad) == ""
    with telemetry.span("child", parent=carried):
        pass
    child = exporter.get_finished_spans()[-1]
    assert child.parent.span_id == span.get_span_context().span_id


def test_a_span_recorded_afterwards_keeps_its_times_and_parent(exporter):
    telemetry = sdk(exporter, "t")
    with telemetry.span("run") as run:
        parent = traceparent_of(run)
    start = datetime(2026, 1, 1, tzinfo=UTC)
    telemetry.record_span(
        "pod", parent=parent, start=start, end=start + timedelta(seconds=3), attributes={"a": 1}, error="exit 1"
    )
    telemetry.record_span("lost", parent="garbage", start=start, end=None)  # a bad parent records nothing
    pod = exporter.get_finished_spans()[-1]
    assert pod.name == "pod" and pod.attributes["a"] == 1
    assert pod.context.trace_id == run.get_span_context().trace_id
    assert pod.parent.span_id == run.get_span_context().span_id
    assert (pod.end_time - pod.start_time) == 3_000_000_000
    assert pod.status.status_code == StatusCode.ERROR


def test_serve_stops_the_server_then_the_cleanups_then_the_telemetry(exporter):
    order: list[str] = []

    class Server:
        def stop(self, grace_s: float = 2.0) -> None:
            order.append(f"server {grace_s}")

    class Flushing(Telemetry):
        def shutdown(self) -> None:
            order.append("telemetry")

    stop = threading.Event()
    threading.Timer(0.1, stop.set).start()
    before = signal.getsignal(signal.SIGTERM)
    serve(
        Server(),
        cleanup=[lambda: order.append("a"), lambda: 1 / 0, lambda: order.append("b")],
        telemetry=Flushing(trace.NoOpTracerProvider()),
        grace_s=1.5,
        stop_event=stop,
    )
    assert order == ["server 1.5", "a", "b", "telemetry"]  # a failing cleanup does not stop the others
    assert signal.getsignal(signal.SIGTERM) is before


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_service_main_stops_on_sigterm_and_sigint(tmp_path, sig):
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    process = subprocess.Popen(
        [sys.executable, "-m", "simrun_planner", "--address", "127.0.0.1:0", "--no-auth"],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        deadline = time.monotonic() + 30
        line = ""
        while "serving on port" not in line and time.monotonic() < deadline:
            line = process.stderr.readline()  # type: ignore[union-attr]
        assert "serving on port" in line
        process.send_signal(sig)
        assert process.wait(timeout=20) == 0
    finally:
        process.kill()
        process.wait()
        process.stderr.close()  # type: ignore[union-attr]


def test_a_pods_traceparent_counts_only_within_its_runs_trace():
    """A worker report lies where the pod's code may write: its traceparent may name a span of the run's trace
    (the task's, or one lost in a restart), never put the pod's span into another trace."""
    from simrun_core.telemetry import within_trace

    run = "00-" + "a" * 32 + "-" + "1" * 16 + "-01"
    task = "00-" + "a" * 32 + "-" + "2" * 16 + "-01"
    foreign = "00-" + "b" * 32 + "-" + "3" * 16 + "-01"
    assert within_trace(task, run) == task
    assert within_trace(foreign, run) is None
    assert within_trace("garbage", run) is None and within_trace(None, run) is None
    assert within_trace(task, None) is None


def test_a_span_that_records_nothing_carries_the_context_it_runs_in():
    """Pass-through: a block inside a no-op span carries the caller's trace context on (the run's traceparent),
    whether the span is under the current context or under a given parent."""
    carried = "00-" + "ab" * 16 + "-" + "cd" * 8 + "-01"
    context = context_from_traceparent(carried)
    assert context is not None
    noop = Telemetry.noop()
    with noop.span("no parent"):
        assert current_traceparent() is None
    token = otel_context.attach(context)
    try:
        with noop.span("under the caller's context"):
            assert current_traceparent() == carried
    finally:
        otel_context.detach(token)
    with noop.span("under a parent", parent=carried):
        assert current_traceparent() == carried


def test_serve_puts_what_the_process_made_to_start_out_of_the_collectors_reach():
    """A full collection while serving walks only what serving made (`settle_heap`): the objects alive when
    serving began are frozen, so the pause a collection gives every call in flight stays short."""

    class Server:
        def stop(self, grace_s: float = 2.0) -> None:
            pass

    started: list[object] = [object()]  # alive before serving, tracked by the collector
    stop = threading.Event()
    seen: list[int] = []
    gc.unfreeze()
    try:
        serve(Server(), stop_event=stop, ready=lambda: (seen.append(gc.get_freeze_count()), stop.set()))
        assert seen and seen[0] > 0
        assert gc.is_tracked(started)
        assert not any(o is started for o in gc.get_objects())  # frozen: no generation holds it
    finally:
        gc.unfreeze()  # the test process goes on collecting as before
