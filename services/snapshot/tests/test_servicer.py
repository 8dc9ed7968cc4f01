"""The SnapshotService through a real server on port 0 with the production interceptors."""

from __future__ import annotations

import hashlib
import io
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from simrun.v1 import common_pb2, snapshot_pb2, snapshot_pb2_grpc
from simrun_core.identity import TokenRegistry
from simrun_core.rpc.auth import bearer_metadata
from simrun_core.snapshots.tarball import iter_tar
from simrun_snapshot.server import create_server

TOKEN = "s3cret"
CONTENTS = {"a.py": b"a = 1\n", "b/c.py": b"c = 3\n", "d.txt": b"a = 1\n"}


def file_entries(contents: dict[str, bytes]) -> list[common_pb2.FileEntry]:
    return [
        common_pb2.FileEntry(path=p, sha256=hashlib.sha256(d).hexdigest(), size=len(d)) for p, d in contents.items()
    ]


@pytest.fixture
def stub(tmp_path: Path) -> Iterator[snapshot_pb2_grpc.SnapshotServiceStub]:
    tokens = TokenRegistry.from_mapping({"owner": "alice", "tokens": {TOKEN: {"name": "alice"}}})
    server = create_server(tmp_path / "store", "127.0.0.1:0", tokens).start()
    channel = grpc.insecure_channel(f"127.0.0.1:{server.port}")
    try:
        yield snapshot_pb2_grpc.SnapshotServiceStub(channel)
    finally:
        channel.close()
        server.stop(None)


def upload(stub: snapshot_pb2_grpc.SnapshotServiceStub, contents: dict[str, bytes], send: set[str], name: str = "m"):
    members = [
        (sha, len(d), lambda d=d: io.BytesIO(d))
        for sha, d in {hashlib.sha256(d).hexdigest(): d for d in contents.values()}.items()
        if sha in send
    ]
    tar = b"".join(iter_tar(members)) if members else b""
    header = snapshot_pb2.UploadHeader(
        name=name,
        files=file_entries(contents),
        provenance=common_pb2.Provenance(branch="main", commit="c" * 40, dirty=False),
        tar_size=len(tar),
    )
    requests = [snapshot_pb2.UploadSnapshotRequest(header=header)]
    requests += [snapshot_pb2.UploadSnapshotRequest(tar_chunk=tar[i : i + 1000]) for i in range(0, len(tar), 1000)]
    return stub.UploadSnapshot(iter(requests), metadata=bearer_metadata(TOKEN))


def test_find_missing_upload_get_and_list(stub: snapshot_pb2_grpc.SnapshotServiceStub, tmp_path: Path) -> None:
    auth = bearer_metadata(TOKEN)
    missing = stub.FindMissingContents(
        snapshot_pb2.FindMissingContentsRequest(name="m", files=file_entries(CONTENTS)), metadata=auth
    ).missing_sha256
    assert len(missing) == 2
    first = upload(stub, CONTENTS, set(missing))
    assert not first.existed and first.snapshot.file_count == 3 and first.snapshot.provenance.branch == "main"
    assert (tmp_path / "store" / first.snapshot.path / "b/c.py").read_bytes() == b"c = 3\n"
    again = upload(stub, CONTENTS, set())
    assert again.existed and again.snapshot.snapshot_id == first.snapshot.snapshot_id
    changed = {**CONTENTS, "a.py": b"a = 2\n"}
    missing = stub.FindMissingContents(
        snapshot_pb2.FindMissingContentsRequest(name="m", files=file_entries(changed)), metadata=auth
    ).missing_sha256
    assert list(missing) == [hashlib.sha256(b"a = 2\n").hexdigest()]
    second = upload(stub, changed, set(missing))
    got = stub.GetSnapshot(
        snapshot_pb2.GetSnapshotRequest(name="m", snapshot_id=second.snapshot.snapshot_id), metadata=auth
    )
    assert got.snapshot == second.snapshot
    page = stub.ListSnapshots(snapshot_pb2.ListSnapshotsRequest(name="m", page_size=1), metadata=auth)
    assert [s.snapshot_id for s in page.snapshots] == [second.snapshot.snapshot_id] and page.next_page_token
    rest = stub.ListSnapshots(
        snapshot_pb2.ListSnapshotsRequest(name="m", page_size=1, page_token=page.next_page_token), metadata=auth
    )
    assert [s.snapshot_id for s in rest.snapshots] == [first.snapshot.snapshot_id] and not rest.next_page_token


def test_errors_have_their_status_codes(stub: snapshot_pb2_grpc.SnapshotServiceStub) -> None:
    auth = bearer_metadata(TOKEN)
    with pytest.raises(grpc.RpcError) as info:
        stub.GetSnapshot(snapshot_pb2.GetSnapshotRequest(name="m", snapshot_id="0" * 32), metadata=auth)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.RpcError) as info:
        stub.ListSnapshots(snapshot_pb2.ListSnapshotsRequest(name="m", page_size=-1), metadata=auth)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    bad = file_entries({"../x": b"x"})
    with pytest.raises(grpc.RpcError) as info:
        stub.FindMissingContents(snapshot_pb2.FindMissingContentsRequest(name="m", files=bad), metadata=auth)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "'..'" in info.value.details()
    with pytest.raises(grpc.RpcError) as info:
        upload(stub, {"a": b"x"}, set())
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    with pytest.raises(grpc.RpcError) as info:
        stub.UploadSnapshot(iter([snapshot_pb2.UploadSnapshotRequest(tar_chunk=b"x")]), metadata=auth)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "header" in info.value.details()
    with pytest.raises(grpc.RpcError) as info:
        stub.ListSnapshots(snapshot_pb2.ListSnapshotsRequest(name="m"))
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
