"""The tracker's client of the environment builder service: the services' one channel factory (traced, the token
on every call), so a tracker apart from its builder is traced and authenticated like its other calls."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from simrun_core.errors import NotFound, Unauthenticated
from simrun_core.identity import TokenRegistry
from simrun_core.telemetry import Telemetry
from simrun_envbuilder.builder import BuilderSettings, EnvironmentBuilder
from simrun_envbuilder.server import create_server
from simrun_runtime.layout import StoreLayout
from simrun_tracker.environments import GrpcEnvironments

TOKENS = TokenRegistry.from_mapping(
    {"owner": "alice", "tokens": {"t-alice": {"name": "alice"}, "t-tracker": {"name": "tracker", "service": True}}}
)


@pytest.fixture
def address(tmp_path: Path) -> Iterator[str]:
    builder = EnvironmentBuilder(BuilderSettings(root=tmp_path / "environments", store=tmp_path / "store"))
    server = create_server(builder, "127.0.0.1:0", TOKENS).start()
    try:
        yield f"127.0.0.1:{server.port}"
    finally:
        server.stop(None)
        builder.close()


def test_calls_to_the_builder_carry_the_tracker_s_token_and_are_traced(address: str, tmp_path: Path) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "simrun-tracker"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    port = GrpcEnvironments(
        address, StoreLayout(tmp_path / "store"), "t-tracker", telemetry=Telemetry.with_provider(provider)
    )
    try:
        with pytest.raises(NotFound):
            port.get("0123456789abcdef")
    finally:
        port.close()
    names = [span.name for span in exporter.get_finished_spans()]
    assert "/simrun.v1.EnvironmentBuilderService/GetEnvironment" in names, names


def test_without_a_token_the_builder_refuses_the_tracker(address: str, tmp_path: Path) -> None:
    port = GrpcEnvironments(address, StoreLayout(tmp_path / "store"))
    try:
        with pytest.raises(Unauthenticated):
            port.get("0123456789abcdef")
    finally:
        port.close()
