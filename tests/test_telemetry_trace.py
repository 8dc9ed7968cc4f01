"""One trace per call across real servers: the client (and the CLI, a real process) above the gateway, the gateway
above the tracker running apart. Every server gets its own injected SDK provider; nothing sets the global one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest
from e2e_support import TOKENS
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from simrun.v1 import tracker_pb2, tracker_pb2_grpc
from simrun_client.client import Client
from simrun_core.config import NodeConfig, ServerConfig, ServiceAddresses
from simrun_core.errors import NotFound
from simrun_core.identity import TokenRegistry
from simrun_core.rpc.server import BoundServer, build_server
from simrun_core.telemetry import Telemetry
from simrun_gateway.embedded import EmbeddedServer, start_embedded
from simrun_learner.learner import ResourceLearner
from simrun_runtime.layout import StoreLayout
from simrun_tracker.server import SERVICE_NAME as TRACKER_SERVICE
from simrun_tracker.server import build_tracker
from simrun_tracker.servicer import RunTrackerServicer

SUBMIT = "/simrun.v1.RunTrackerService/SubmitRun"
GET_RUN = "/simrun.v1.RunTrackerService/GetRun"


def sdk(exporter: InMemorySpanExporter, service: str) -> Telemetry:
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return Telemetry.with_provider(provider)


def service_of(span: ReadableSpan) -> str:
    return str(span.resource.attributes["service.name"])


def one(spans: list[ReadableSpan], name: str, service: str, kind: SpanKind) -> ReadableSpan:
    (found,) = [s for s in spans if s.name == name and service_of(s) == service and s.kind == kind]
    return found


def parent_of(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture(params=["traced"])
def gateway_telemetry(request: pytest.FixtureRequest, exporter: InMemorySpanExporter) -> Telemetry:
    named = {"off": Telemetry.off(), "no-op": Telemetry.noop()}
    return sdk(exporter, "simrun-gateway") if request.param == "traced" else named[request.param]


@pytest.fixture
def tracker_apart(
    tmp_path: Path, tokens_file: Path, exporter: InMemorySpanExporter, gateway_telemetry: Telemetry
) -> Iterator[EmbeddedServer]:
    """The tracker in a server of its own (not driving runs: the calls are what is traced), the gateway in front."""
    tokens = TokenRegistry.load(tokens_file)
    store = StoreLayout(tmp_path / "store")
    store.root.mkdir()
    learner = ResourceLearner(store.observations)
    config = ServerConfig(
        home=tmp_path, store=store.root, tokens_file=tokens_file, nodes=[NodeConfig(name="n", cores=2, memory_gb=4)]
    )
    tracker = build_tracker(config, store, learner)
    servicer = RunTrackerServicer(tracker)
    tracker_server: BoundServer = build_server(
        "127.0.0.1:0",
        [lambda s: tracker_pb2_grpc.add_RunTrackerServiceServicer_to_server(servicer, s)],
        [TRACKER_SERVICE],
        tokens=tokens,
        telemetry=sdk(exporter, "simrun-tracker"),
    ).start()
    gateway = start_embedded(
        ServerConfig(
            home=tmp_path,
            store=store.root,
            address="127.0.0.1:0",
            tokens_file=tokens_file,
            services=ServiceAddresses(tracker=f"127.0.0.1:{tracker_server.port}"),
        ),
        telemetry=gateway_telemetry,
    )
    yield gateway
    gateway.stop()
    tracker_server.stop()
    tracker.close()
    learner.close()


def test_one_trace_from_the_client_through_the_gateway_to_the_tracker(tracker_apart, exporter, example_model):
    client_telemetry = sdk(exporter, "simrun-client")
    with Client(tracker_apart.address, TOKENS["person"], telemetry=client_telemetry) as client:
        run = client.submit(example_model / "pi.yaml")
    spans = list(exporter.get_finished_spans())
    root = one(spans, "simrun_client.submit", "simrun-client", SpanKind.INTERNAL)
    assert root.attributes["simrun.run_id"] == run.run_id
    assert {s.context.trace_id for s in spans} == {root.context.trace_id}  # the upload too
    sent = one(spans, SUBMIT, "simrun-client", SpanKind.CLIENT)
    at_gateway = one(spans, SUBMIT, "simrun-gateway", SpanKind.SERVER)
    forwarded = one(spans, SUBMIT, "simrun-gateway", SpanKind.CLIENT)
    at_tracker = one(spans, SUBMIT, "simrun-tracker", SpanKind.SERVER)
    assert parent_of(sent) == root.context.span_id
    assert parent_of(at_gateway) == sent.context.span_id
    assert parent_of(forwarded) == at_gateway.context.span_id
    assert parent_of(at_tracker) == forwarded.context.span_id  # not the client's: raw headers are not forwarded
    assert at_tracker.attributes["rpc.grpc.status_code"] == 0


def test_a_forwarded_stream_is_traced_with_the_services_status(tracker_apart, exporter):
    watch = "/simrun.v1.RunTrackerService/WatchRun"
    with Client(tracker_apart.address, TOKENS["person"]) as client, pytest.raises(NotFound, match="no-such-run"):
        list(client.watch("no-such-run", timeout_s=10))
    spans = list(exporter.get_finished_spans())
    at_gateway = one(spans, watch, "simrun-gateway", SpanKind.SERVER)
    forwarded = one(spans, watch, "simrun-gateway", SpanKind.CLIENT)
    at_tracker = one(spans, watch, "simrun-tracker", SpanKind.SERVER)
    assert parent_of(forwarded) == at_gateway.context.span_id
    assert parent_of(at_tracker) == forwarded.context.span_id
    assert forwarded.attributes["rpc.grpc.status_code"] == at_tracker.attributes["rpc.grpc.status_code"] == 5


@pytest.mark.parametrize("gateway_telemetry", ["off", "no-op"], indirect=True)
def test_a_gateway_that_records_nothing_passes_the_callers_context_on(tracker_apart, exporter):
    with Client(tracker_apart.address, TOKENS["person"], telemetry=sdk(exporter, "simrun-client")) as client:
        client.list_runs()
    spans = list(exporter.get_finished_spans())
    sent = one(spans, "/simrun.v1.RunTrackerService/ListRuns", "simrun-client", SpanKind.CLIENT)
    at_tracker = one(spans, "/simrun.v1.RunTrackerService/ListRuns", "simrun-tracker", SpanKind.SERVER)
    assert {service_of(s) for s in spans} == {"simrun-client", "simrun-tracker"}
    assert parent_of(at_tracker) == sent.context.span_id


def test_a_call_without_a_token_is_traced_with_status_16_and_goes_no_further(tracker_apart, exporter):
    channel = grpc.insecure_channel(tracker_apart.address)
    with channel, pytest.raises(grpc.RpcError) as caught:
        tracker_pb2_grpc.RunTrackerServiceStub(channel).GetRun(tracker_pb2.GetRunRequest(run_id="r"))
    assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
    (span,) = exporter.get_finished_spans()
    assert (span.name, service_of(span), span.kind) == (GET_RUN, "simrun-gateway", SpanKind.SERVER)
    assert span.attributes["rpc.grpc.status_code"] == 16


class Collector(trace_service_pb2_grpc.TraceServiceServicer):
    """An OTLP trace receiver on loopback, as a collector would be: keeps every span it is sent."""

    def __init__(self) -> None:
        self.requests: list[trace_service_pb2.ExportTraceServiceRequest] = []
        self.received = threading.Event()

    def Export(self, request: Any, context: grpc.ServicerContext) -> trace_service_pb2.ExportTraceServiceResponse:
        self.requests.append(request)
        self.received.set()
        return trace_service_pb2.ExportTraceServiceResponse()

    def spans(self) -> list[tuple[str, Any]]:
        found = []
        for request in self.requests:
            for resource_spans in request.resource_spans:
                attributes = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
                for scope in resource_spans.scope_spans:
                    found.extend((attributes["service.name"], span) for span in scope.spans)
        return found


@pytest.fixture
def collector() -> Iterator[tuple[Collector, int]]:
    receiver = Collector()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(receiver, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield receiver, port
    server.stop(None)


def test_the_cli_exports_its_own_spans_above_the_servers(tokens_file, collector, exporter, tmp_path):
    receiver, port = collector
    # The embedded server's spans go to the in-memory exporter; the CLI, a real process, exports over OTLP.
    config = ServerConfig(home=tmp_path, store=tmp_path / "store", address="127.0.0.1:0", tokens_file=tokens_file)
    gateway = start_embedded(config, drive_runs=False, telemetry=sdk(exporter, "simrun-gateway"))
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
        env.update(
            OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{port}",
            OTEL_EXPORTER_OTLP_INSECURE="true",
            SIMRUN_HOME=str(tmp_path / "cli-home"),
            SIMRUN_TOKEN=TOKENS["person"],
        )
        simrun = Path(sys.executable).parent / "simrun"
        result = subprocess.run(
            [str(simrun), "list", "--endpoint", gateway.address, "--json"],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
            check=False,
        )
        assert result.returncode == 0, result.stderr
    finally:
        gateway.stop()
    assert receiver.received.is_set()
    cli_spans = receiver.spans()
    assert {service for service, _ in cli_spans} == {"simrun-cli"}
    (command,) = [span for _, span in cli_spans if span.name == "simrun list"]
    (call,) = [span for _, span in cli_spans if span.name == "/simrun.v1.RunTrackerService/ListRuns"]
    assert call.parent_span_id == command.span_id
    served = one(
        list(exporter.get_finished_spans()), "/simrun.v1.RunTrackerService/ListRuns", "simrun-gateway", SpanKind.SERVER
    )
    assert served.context.trace_id == int.from_bytes(command.trace_id, "big")
    assert served.parent.span_id == int.from_bytes(call.span_id, "big")


def test_a_run_continues_its_submissions_trace_down_to_each_pod(tmp_path, tokens_file, exporter, e2e_model):
    """The driver's steps and each pod attempt (a span from its worker report) are in the submission's trace;
    the local pods get TRACEPARENT (their reports carry it back); `simrun status --json` gives the trace id."""
    from click.testing import CliRunner
    from e2e_support import wait_final, write_workflow
    from simrun_cli.main import cli
    from simrun_runtime.layout import StoreLayout
    from simrun_runtime.record import RunRecord
    from simrun_runtime.reports import load_reports

    config = ServerConfig(
        home=tmp_path / "home",
        store=tmp_path / "store",
        address="127.0.0.1:0",
        tokens_file=tokens_file,
        nodes=[NodeConfig(name="node-a", cores=2, memory_gb=8)],
        grace_s=5,
    )
    server = start_embedded(config, telemetry=sdk(exporter, "simrun-gateway"))
    try:
        workflow = write_workflow(
            e2e_model,
            "tasks:\n  values:\n    type: e2etasks.tasks:Slow\n    settings: {units: 4, seconds: 0.05}\n"
            "  total:\n    type: e2etasks.tasks:Sum\n    inputs: {values: values.values}\n",
        )
        with Client(server.address, TOKENS["person"], telemetry=sdk(exporter, "simrun-client")) as client:
            run = client.submit(workflow)
            final = wait_final(client, run.run_id)
            again = client.submit(workflow)  # every task reused: a span each, no pod
            assert wait_final(client, again.run_id).state == 4
        assert final.state == 4, final.message
        status = CliRunner().invoke(
            cli, ["status", run.run_id, "--json", "--endpoint", server.address, "--token", TOKENS["person"]]
        )
        assert status.exit_code == 0, status.output
    finally:
        server.stop()
    spans = list(exporter.get_finished_spans())
    (root,) = [s for s in spans if s.name == "simrun_client.submit" and s.attributes["simrun.run_id"] == run.run_id]
    trace_id = root.context.trace_id
    assert json.loads(status.output)["trace_id"] == f"{trace_id:032x}" == final.trace_id
    in_trace = [s for s in spans if s.context.trace_id == trace_id]
    submitted = one(in_trace, SUBMIT, "simrun-gateway", SpanKind.SERVER)
    by_name = {s.name: s for s in in_trace if service_of(s) == "simrun-gateway" and s.kind == SpanKind.INTERNAL}
    assert parent_of(by_name["planning"]) == submitted.context.span_id
    assert parent_of(by_name[f"environment {final.environment}"]) == submitted.context.span_id
    store = StoreLayout(config.store)
    record = RunRecord.load(store.run(run.run_id))
    for task_id, workers in (("values", {"w0"}), ("total", {"w0"})):
        task_span = by_name[f"task {task_id}"]
        assert parent_of(task_span) == submitted.context.span_id
        assert task_span.attributes["simrun.state"] == "succeeded"
        reports = load_reports(store.run(run.run_id).task(task_id))
        # The pod's TRACEPARENT (its contract) came back in its report: the task's span.
        assert {r.traceparent for r in reports} == {record.tasks[task_id].traceparent}
        pods = [s for s in in_trace if s.name.startswith("pod ") and s.attributes["simrun.task_id"] == task_id]
        assert {s.attributes["simrun.worker"] for s in pods} == workers
        for pod in pods:
            assert parent_of(pod) == task_span.context.span_id
            assert pod.attributes["simrun.exit_code"] == 0 and pod.attributes["simrun.ended"] == "done"
            assert pod.start_time >= task_span.start_time - 1_000_000_000
    reused = [s for s in spans if s.attributes.get("simrun.run_id") == again.run_id and s.name.startswith("task ")]
    assert {s.name for s in reused} == {"task values", "task total"}
    assert {s.attributes["simrun.reused_from.run_id"] for s in reused} == {run.run_id}
    assert not [s for s in spans if s.attributes.get("simrun.run_id") == again.run_id and s.name.startswith("pod ")]
    values_pod = next(s for s in in_trace if s.name == "pod w0" and s.attributes["simrun.task_id"] == "values")
    assert values_pod.attributes["simrun.units"] == 4
    assert values_pod.attributes["simrun.peak_memory_gb"] >= 0


def test_a_restarted_server_continues_the_runs_trace(tmp_path, tokens_file, e2e_model):
    """The trace context is in run.json: spans recorded by the next server are in the submission's trace."""
    import time

    from e2e_support import wait_final, write_workflow

    config = ServerConfig(
        home=tmp_path / "home",
        store=tmp_path / "store",
        address="127.0.0.1:0",
        tokens_file=tokens_file,
        nodes=[NodeConfig(name="node-a", cores=2, memory_gb=8)],
        grace_s=5,
    )
    workflow = write_workflow(
        e2e_model, "tasks:\n  values:\n    type: e2etasks.tasks:Slow\n    settings: {units: 12, seconds: 0.3}\n"
    )
    before, after = InMemorySpanExporter(), InMemorySpanExporter()
    first = start_embedded(config, telemetry=sdk(before, "simrun-gateway"))
    try:
        with Client(first.address, TOKENS["person"], telemetry=sdk(before, "simrun-client")) as client:
            run = client.submit(workflow)
            deadline = time.monotonic() + 60
            while client.get_run(run.run_id).tasks[0].units_done < 2:
                assert time.monotonic() < deadline
                time.sleep(0.05)
    finally:
        first.stop()
    root = one(list(before.get_finished_spans()), "simrun_client.submit", "simrun-client", SpanKind.INTERNAL)
    second = start_embedded(config, telemetry=sdk(after, "simrun-gateway"))
    try:
        with Client(second.address, TOKENS["person"], telemetry=Telemetry.off()) as client:
            final = wait_final(client, run.run_id)
    finally:
        second.stop()
    assert final.state == 4, final.message
    assert final.trace_id == f"{root.context.trace_id:032x}"
    spans = [s for s in after.get_finished_spans() if s.name in ("task values", "pod w0")]
    assert {s.name for s in spans} == {"task values", "pod w0"}
    assert {s.context.trace_id for s in spans} == {root.context.trace_id}


def test_an_agents_tool_call_is_the_root_of_its_runs_trace(tmp_path, tokens_file, e2e_model):
    """The MCP bridge records a span per tool call (`simrun-mcp`) above the client's calls, so a run an agent
    submits through it has the tool call as the root of its trace; a refused call is an error span."""
    import anyio
    from e2e_support import TOKENS, write_workflow
    from mcp import Client as MCPClient
    from simrun_mcp.server import connect

    exporter = InMemorySpanExporter()
    server = start_embedded(
        ServerConfig(
            home=tmp_path / "home",
            store=tmp_path / "home" / "store",
            address="127.0.0.1:0",
            tokens_file=tokens_file,
            nodes=[NodeConfig(name="node-a", cores=2, memory_gb=8)],
        ),
        drive_runs=False,
    )
    workflow = write_workflow(
        e2e_model, "tasks: {values: {type: 'e2etasks.tasks:Slow', settings: {units: 2, seconds: 0.05}}}"
    )
    mcp_server, bridge = connect(server.address, TOKENS["agent"], [e2e_model], telemetry=sdk(exporter, "simrun-mcp"))

    async def session() -> tuple[str, bool]:
        async with MCPClient(mcp_server) as client:
            submitted = await client.call_tool("submit_run", {"workflow_path": str(workflow)})
            refused = await client.call_tool("get_run", {"run_id": "no-such-run"})
            return submitted.structured_content["run_id"], refused.is_error

    try:
        run_id, refused = anyio.run(session)
        with Client(server.address, TOKENS["agent"]) as reader:
            trace_id = reader.get_run(run_id).trace_id
    finally:
        bridge.client.close()
        server.stop()
    spans = exporter.get_finished_spans()
    submit = next(s for s in spans if s.name == "tool submit_run")
    assert submit.parent is None and service_of(submit) == "simrun-mcp"
    assert trace_id == f"{submit.context.trace_id:032x}"  # the run's trace starts at the agent's tool call
    client_submit = next(s for s in spans if s.name == "simrun_client.submit")
    assert client_submit.parent.span_id == submit.context.span_id
    calls = [s for s in spans if s.name == "/simrun.v1.RunTrackerService/SubmitRun"]
    assert [c.parent.span_id for c in calls] == [client_submit.context.span_id] and calls[0].kind is SpanKind.CLIENT
    failed = next(s for s in spans if s.name == "tool get_run")
    assert refused and not failed.status.is_ok and "no run" in (failed.status.description or "")
