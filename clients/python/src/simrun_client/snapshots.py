"""Snapshots of working trees, written into a mounted store or uploaded through the snapshot service."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import grpc
from simrun.v1 import snapshot_pb2, snapshot_pb2_grpc
from simrun_core.errors import NotFound, SimrunError
from simrun_core.snapshots import convert
from simrun_core.snapshots.model import Snapshot, sanitize_name, validate_name
from simrun_core.snapshots.store import LocalFiles, SnapshotStore
from simrun_core.snapshots.tarball import iter_tar, tar_size

from simrun_client.channel import call
from simrun_client.worktree import TreeScan, scan_tree


@dataclass(frozen=True)
class SnapshotResult:
    """A snapshot made of a working tree.

    Attributes:
        snapshot: the snapshot, with the tree's provenance now.
        existed: whether the store had it already, so nothing was written.
        files_read: files of the tree whose bytes the scan read (0 for an unchanged tree).
        contents_sent: contents the store lacked and got (copied from the tree or sent in the tar).
        bytes_sent: bytes of the uploaded tar; 0 with the store mounted.
    """

    snapshot: Snapshot
    existed: bool
    files_read: int
    contents_sent: int
    bytes_sent: int

    def to_json(self) -> dict[str, Any]:
        """The snapshot's fields as the API names them, and `existed`."""
        s = self.snapshot
        return {
            "name": s.name,
            "snapshot_id": s.snapshot_id,
            "path": s.path,
            "provenance": s.provenance.model_dump(mode="json"),
            "file_count": s.file_count,
            "total_bytes": s.total_bytes,
            "create_time": s.create_time.isoformat(),
            "existed": self.existed,
        }


def default_name(tree: Path) -> str:
    """The source name of a tree: its folder's name, with characters a name may not hold made `-`."""
    return sanitize_name(Path(tree).resolve().name)


def snapshot_to_store(
    tree: Path, store_root: Path, name: str | None = None, *, cache_dir: Path | None = None
) -> SnapshotResult:
    """Snapshots the working tree at `tree` into the store mounted at `store_root`.

    Raises:
        InvalidArgument: not a git working tree, a symlink out of it, a bad name, a file changed while copied.
    """
    scan = scan_tree(tree, cache_dir)
    name = validate_name(name or default_name(scan.root))
    store = SnapshotStore(store_root)
    reused = store.reuse(name, scan.snapshot_id, scan.provenance)
    if reused is not None:
        return SnapshotResult(reused.snapshot, True, scan.files_read, 0, 0)
    result = store.write(name, scan.files, scan.provenance, LocalFiles(scan.root))
    return SnapshotResult(result.snapshot, result.existed, scan.files_read, result.contents_written, 0)


def upload_snapshot(
    tree: Path,
    target: grpc.Channel | snapshot_pb2_grpc.SnapshotServiceStub,
    name: str | None = None,
    *,
    cache_dir: Path | None = None,
    timeout_s: float | None = None,
) -> SnapshotResult:
    """Snapshots the working tree at `tree` through the snapshot service, sending only the contents it lacks.

    Args:
        tree: the working tree (its top level or a folder in it).
        target: a channel (see `open_channel`, which carries the token) or a SnapshotService stub.
        name: the source name; the tree's folder name by default.
        cache_dir: where the hashes of earlier scans are kept; `default_cache_dir()` by default.
        timeout_s: seconds each of the calls may take (the upload with its tar included); None for no limit.

    Raises:
        SimrunError: the typed error of the failed call, or of a bad tree.
    """
    stub = target if isinstance(target, snapshot_pb2_grpc.SnapshotServiceStub) else _stub(target)
    scan = scan_tree(tree, cache_dir)
    name = validate_name(name or default_name(scan.root))
    # A snapshot is named by its content: when the service has this one, asking by id is all it takes.
    try:
        found = call(
            stub.GetSnapshot,
            snapshot_pb2.GetSnapshotRequest(name=name, snapshot_id=scan.snapshot_id),
            timeout=timeout_s,
        )
    except NotFound:
        pass
    else:
        snapshot = dataclasses.replace(convert.snapshot_from_proto(found.snapshot), provenance=scan.provenance)
        return SnapshotResult(snapshot, True, scan.files_read, 0, 0)
    files = [convert.file_to_proto(e) for e in scan.files]
    missing = set(
        call(
            stub.FindMissingContents,
            snapshot_pb2.FindMissingContentsRequest(name=name, files=files),
            timeout=timeout_s,
        ).missing_sha256
    )
    first_path: dict[str, tuple[str, int]] = {}
    for entry in scan.files:
        if not entry.is_symlink and entry.sha256 in missing:
            first_path.setdefault(entry.sha256, (entry.path, entry.size))
    members = [(sha, size, _opener(scan, path)) for sha, (path, size) in sorted(first_path.items())]
    size = tar_size(m[1] for m in members) if members else 0
    header = snapshot_pb2.UploadHeader(
        name=name, files=files, provenance=convert.provenance_to_proto(scan.provenance), tar_size=size
    )
    failure: list[SimrunError] = []

    def requests() -> Iterator[snapshot_pb2.UploadSnapshotRequest]:
        yield snapshot_pb2.UploadSnapshotRequest(header=header)
        if not members:
            return
        try:
            for chunk in iter_tar(members):
                yield snapshot_pb2.UploadSnapshotRequest(tar_chunk=chunk)
        except SimrunError as exc:
            failure.append(exc)
            raise

    try:
        response = call(stub.UploadSnapshot, requests(), timeout=timeout_s)
    except SimrunError:
        if failure:
            raise failure[0] from None
        raise
    snapshot = convert.snapshot_from_proto(response.snapshot)
    return SnapshotResult(snapshot, response.existed, scan.files_read, len(members), size)


def _stub(channel: grpc.Channel) -> snapshot_pb2_grpc.SnapshotServiceStub:
    return snapshot_pb2_grpc.SnapshotServiceStub(channel)


def _opener(scan: TreeScan, path: str) -> Any:
    def open_content() -> BinaryIO:
        return open(scan.root / path, "rb")

    return open_content
