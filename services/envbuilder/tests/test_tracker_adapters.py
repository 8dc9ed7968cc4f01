"""The tracker's environment port over the builder: in process and over gRPC, with the port's states and messages."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator

import pytest
from simrun_core.errors import InvalidArgument, NotFound
from simrun_envbuilder.builder import EnvironmentBuilder
from simrun_envbuilder.server import create_server
from simrun_tracker.environments import GrpcEnvironments, InProcessEnvironments
from simrun_tracker.ports import DEFAULT_ENVIRONMENT, EnvironmentPort, EnvironmentState, LocalInterpreters


@pytest.fixture(params=["in-process", "grpc"])
def port(
    request: pytest.FixtureRequest, builder: EnvironmentBuilder
) -> Iterator[InProcessEnvironments | GrpcEnvironments]:
    if request.param == "in-process":
        yield InProcessEnvironments(builder)
        return
    server = create_server(builder, "127.0.0.1:0").start()
    adapter = GrpcEnvironments(f"127.0.0.1:{server.port}", builder.store)
    try:
        yield adapter
    finally:
        adapter.close()
        server.stop(None)


def wait(port: EnvironmentPort, environment_id: str):  # type: ignore[no-untyped-def]
    import time

    deadline = time.monotonic() + 100
    while time.monotonic() < deadline:
        environment = port.get(environment_id)
        if environment.state is not EnvironmentState.BUILDING:
            return environment
        assert environment.message, "a building environment says what it is doing"
        time.sleep(0.05)
    raise AssertionError("still building")


def test_the_port_resolves_builds_and_gives_a_runs_overlay(port, kit, builder: EnvironmentBuilder) -> None:
    port_: EnvironmentPort = port  # the adapters are the tracker's ports
    interpreters: LocalInterpreters = port
    ref = kit.snapshot("tinymodel", kit.model_files(code="mine"))
    environment = port_.resolve([ref])
    assert environment.state is EnvironmentState.BUILDING and environment.message
    ready = wait(port, environment.environment_id)
    assert ready.state is EnvironmentState.READY and ready.lock_hash and ready.python_version
    run = builder.store.run("run-1")
    run.root.mkdir(parents=True)
    run.record.write_text(json.dumps({"run_id": "run-1", "state": "running", "snapshots": [ref.model_dump()]}))
    python = interpreters.interpreter(environment.environment_id, run_id="run-1")
    out = subprocess.run([python, "-c", "import tinymodel; print(tinymodel.CODE)"], capture_output=True, text=True)
    assert out.stdout.strip() == "mine", out.stderr
    assert run.environment_lock.read_bytes() == builder.lock_of(environment.environment_id)
    describer = interpreters.interpreter(environment.environment_id, snapshots=[ref])
    assert describer == python  # the same snapshots share one overlay


def test_the_port_refuses_and_reports(port, kit) -> None:
    with pytest.raises(InvalidArgument, match="nosuchpackage"):
        port.resolve([kit.snapshot("tinymodel", kit.model_files(dependencies=("nosuchpackage",)))])
    with pytest.raises(NotFound):
        port.get("0" * 32)
    plain = port.resolve([kit.snapshot("plain", {"a.py": ""})])
    assert plain.environment_id == DEFAULT_ENVIRONMENT and plain.state is EnvironmentState.READY
