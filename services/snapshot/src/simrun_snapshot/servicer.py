"""The SnapshotService servicer: decodes a request, makes one call on the store, encodes the answer."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
from simrun.v1 import snapshot_pb2, snapshot_pb2_grpc
from simrun_core.paging import page
from simrun_core.snapshots import convert
from simrun_core.snapshots.store import SnapshotStore

DEFAULT_PAGE_SIZE = 100


class SnapshotServicer(snapshot_pb2_grpc.SnapshotServiceServicer):
    """Serves the snapshots of one store."""

    def __init__(self, store: SnapshotStore) -> None:
        self._store = store

    def FindMissingContents(
        self, request: snapshot_pb2.FindMissingContentsRequest, context: grpc.ServicerContext
    ) -> snapshot_pb2.FindMissingContentsResponse:
        missing = self._store.find_missing(request.name, convert.files_from_proto(request.files))
        return snapshot_pb2.FindMissingContentsResponse(missing_sha256=missing)

    def UploadSnapshot(
        self, request_iterator: Iterator[snapshot_pb2.UploadSnapshotRequest], context: grpc.ServicerContext
    ) -> snapshot_pb2.UploadSnapshotResponse:
        upload = convert.upload_from_requests(request_iterator)
        result = self._store.receive_upload(
            upload.name, upload.files, upload.provenance, upload.tar_size, upload.chunks
        )
        return snapshot_pb2.UploadSnapshotResponse(
            snapshot=convert.snapshot_to_proto(result.snapshot), existed=result.existed
        )

    def GetSnapshot(
        self, request: snapshot_pb2.GetSnapshotRequest, context: grpc.ServicerContext
    ) -> snapshot_pb2.GetSnapshotResponse:
        snapshot = self._store.get(request.name, request.snapshot_id)
        return snapshot_pb2.GetSnapshotResponse(snapshot=convert.snapshot_to_proto(snapshot))

    def ListSnapshots(
        self, request: snapshot_pb2.ListSnapshotsRequest, context: grpc.ServicerContext
    ) -> snapshot_pb2.ListSnapshotsResponse:
        snapshots, next_token = page(
            self._store.list_snapshots(request.name),
            request.page_size,
            request.page_token,
            f"snapshots:{request.name}",
            DEFAULT_PAGE_SIZE,
        )
        return snapshot_pb2.ListSnapshotsResponse(
            snapshots=[convert.snapshot_to_proto(s) for s in snapshots], next_page_token=next_token
        )
