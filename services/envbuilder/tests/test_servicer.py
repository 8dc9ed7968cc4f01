"""The EnvironmentBuilderService through a real server on port 0 with the production interceptors."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest
from simrun.v1 import common_pb2, envbuilder_pb2, envbuilder_pb2_grpc
from simrun_envbuilder.builder import EnvironmentBuilder
from simrun_envbuilder.server import create_server


@pytest.fixture
def stub(builder: EnvironmentBuilder) -> Iterator[envbuilder_pb2_grpc.EnvironmentBuilderServiceStub]:
    server = create_server(builder, "127.0.0.1:0").start()
    channel = grpc.insecure_channel(f"127.0.0.1:{server.port}")
    try:
        yield envbuilder_pb2_grpc.EnvironmentBuilderServiceStub(channel)
    finally:
        channel.close()
        server.stop(None)


def snapshot_message(ref) -> common_pb2.Snapshot:  # type: ignore[no-untyped-def]
    return common_pb2.Snapshot(name=ref.name, snapshot_id=ref.snapshot_id, path="/etc")


def test_create_watch_get_and_list(stub, kit) -> None:
    ref = kit.snapshot("tinymodel", kit.model_files())
    created = stub.CreateEnvironment(envbuilder_pb2.CreateEnvironmentRequest(snapshots=[snapshot_message(ref)]))
    environment = created.environment
    assert environment.state == common_pb2.ENVIRONMENT_STATE_BUILDING and len(environment.inputs_digest) == 64
    updates = list(
        stub.WatchEnvironment(envbuilder_pb2.WatchEnvironmentRequest(environment_id=environment.environment_id))
    )
    assert updates[-1].environment.state == common_pb2.ENVIRONMENT_STATE_READY
    assert any("installing the locked packages" in line for u in updates for line in u.log_lines)
    got = stub.GetEnvironment(envbuilder_pb2.GetEnvironmentRequest(environment_id=environment.environment_id))
    assert got.environment.interpreter.endswith("/venv/bin/python") and got.environment.package_count >= 2
    assert got.environment.lock_sha256 == environment.lock_sha256
    listed = stub.ListEnvironments(envbuilder_pb2.ListEnvironmentsRequest(page_size=1))
    assert [e.environment_id for e in listed.environments] == [environment.environment_id]
    assert listed.next_page_token == ""


def test_status_codes(stub, kit) -> None:
    with pytest.raises(grpc.RpcError) as missing:
        stub.GetEnvironment(envbuilder_pb2.GetEnvironmentRequest(environment_id="f" * 32))
    assert missing.value.code() == grpc.StatusCode.NOT_FOUND
    unknown = common_pb2.Snapshot(name="nothere", snapshot_id="a" * 32)
    with pytest.raises(grpc.RpcError) as not_found:
        stub.CreateEnvironment(envbuilder_pb2.CreateEnvironmentRequest(snapshots=[unknown]))
    assert not_found.value.code() == grpc.StatusCode.NOT_FOUND
    bad = kit.snapshot("tinymodel", kit.model_files(dependencies=("nosuchpackage",)))
    with pytest.raises(grpc.RpcError) as refused:
        stub.CreateEnvironment(envbuilder_pb2.CreateEnvironmentRequest(snapshots=[snapshot_message(bad)]))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "nosuchpackage" in refused.value.details()
    with pytest.raises(grpc.RpcError) as escaping:
        stub.CreateEnvironment(
            envbuilder_pb2.CreateEnvironmentRequest(snapshots=[common_pb2.Snapshot(name="..", snapshot_id="a" * 32)])
        )
    assert escaping.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.RpcError) as paging:
        stub.ListEnvironments(envbuilder_pb2.ListEnvironmentsRequest(page_size=-1))
    assert paging.value.code() == grpc.StatusCode.INVALID_ARGUMENT
