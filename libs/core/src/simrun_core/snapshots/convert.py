"""Converts between the snapshot service's messages and its domain values."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC

from google.protobuf.timestamp_pb2 import Timestamp
from simrun.v1 import common_pb2, snapshot_pb2
from simrun_runtime.record import Provenance

from simrun_core.errors import InvalidArgument
from simrun_core.messages import provenance_from_proto, provenance_to_proto
from simrun_core.snapshots.model import FileEntry, Snapshot


def file_from_proto(message: common_pb2.FileEntry) -> FileEntry:
    return FileEntry(message.path, message.sha256, message.size, message.executable, message.symlink_target)


def files_from_proto(messages: Iterable[common_pb2.FileEntry]) -> list[FileEntry]:
    return [file_from_proto(m) for m in messages]


def file_to_proto(entry: FileEntry) -> common_pb2.FileEntry:
    return common_pb2.FileEntry(
        path=entry.path,
        sha256=entry.sha256,
        size=entry.size,
        executable=entry.executable,
        symlink_target=entry.symlink_target,
    )


def snapshot_to_proto(snapshot: Snapshot) -> common_pb2.Snapshot:
    create_time = Timestamp()
    create_time.FromDatetime(snapshot.create_time)
    return common_pb2.Snapshot(
        name=snapshot.name,
        snapshot_id=snapshot.snapshot_id,
        path=snapshot.path,
        provenance=provenance_to_proto(snapshot.provenance),
        file_count=snapshot.file_count,
        total_bytes=snapshot.total_bytes,
        create_time=create_time,
    )


def snapshot_from_proto(message: common_pb2.Snapshot) -> Snapshot:
    return Snapshot(
        name=message.name,
        snapshot_id=message.snapshot_id,
        path=message.path,
        provenance=provenance_from_proto(message.provenance),
        file_count=message.file_count,
        total_bytes=message.total_bytes,
        create_time=message.create_time.ToDatetime(tzinfo=UTC),
    )


@dataclass(frozen=True)
class Upload:
    """An upload's header as domain values, and the chunks of its tar still to be read."""

    name: str
    files: list[FileEntry]
    provenance: Provenance
    tar_size: int
    chunks: Iterator[bytes]


def upload_from_requests(requests: Iterable[snapshot_pb2.UploadSnapshotRequest]) -> Upload:
    """Splits an upload stream into its header, first and once, and the tar chunks that follow."""
    stream = iter(requests)
    first = next(stream, None)
    if first is None or first.WhichOneof("part") != "header":
        raise InvalidArgument("an upload starts with its header")
    header = first.header
    return Upload(
        name=header.name,
        files=files_from_proto(header.files),
        provenance=provenance_from_proto(header.provenance),
        tar_size=header.tar_size,
        chunks=_chunks(stream),
    )


def _chunks(stream: Iterator[snapshot_pb2.UploadSnapshotRequest]) -> Iterator[bytes]:
    for request in stream:
        if request.WhichOneof("part") != "tar_chunk":
            raise InvalidArgument("an upload has one header, before the tar chunks")
        yield request.tar_chunk
