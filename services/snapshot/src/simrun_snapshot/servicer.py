"""The SnapshotService servicer: decodes a request, makes one call on the store, encodes the answer."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import grpc
from simrun.v1 import snapshot_pb2, snapshot_pb2_grpc
from simrun_core.access import may_read_any
from simrun_core.config import ReadPolicy
from simrun_core.identity import Identity
from simrun_core.paging import page
from simrun_core.rpc.auth import caller_identity
from simrun_core.snapshots import convert
from simrun_core.snapshots.model import Snapshot
from simrun_core.snapshots.store import SnapshotStore
from simrun_runtime.record import Provenance

DEFAULT_PAGE_SIZE = 100


class SnapshotServicer(snapshot_pb2_grpc.SnapshotServiceServicer):
    """Serves the snapshots of one store."""

    def __init__(self, store: SnapshotStore, policy: ReadPolicy | None = None) -> None:
        self._store = store
        self._policy = policy or ReadPolicy()

    def _visible(self, identity: Identity | None, snapshot: Snapshot) -> bool:
        """Whether the read policy lets `identity` see a snapshot: one of its readers is someone it may read."""
        readers = self._store.readers(snapshot.name, snapshot.snapshot_id)
        if identity is None or readers is None:
            return True
        return may_read_any(identity, readers, self._policy)

    def _record(self, identity: Identity | None, snapshot: Snapshot) -> None:
        if identity is not None:
            self._store.add_reader(snapshot.name, snapshot.snapshot_id, (identity.name, identity.on_behalf_of))

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
        self._record(caller_identity(), result.snapshot)
        return snapshot_pb2.UploadSnapshotResponse(
            snapshot=convert.snapshot_to_proto(result.snapshot), existed=result.existed
        )

    def GetSnapshot(
        self, request: snapshot_pb2.GetSnapshotRequest, context: grpc.ServicerContext
    ) -> snapshot_pb2.GetSnapshotResponse:
        identity = caller_identity()
        snapshot = self._store.get(request.name, request.snapshot_id)
        if not self._visible(identity, snapshot):
            # Named by its content: the caller has it, but the first maker's branch and changes are not theirs.
            snapshot = replace(snapshot, provenance=Provenance())
        self._record(identity, snapshot)
        return snapshot_pb2.GetSnapshotResponse(snapshot=convert.snapshot_to_proto(snapshot))

    def ListSnapshots(
        self, request: snapshot_pb2.ListSnapshotsRequest, context: grpc.ServicerContext
    ) -> snapshot_pb2.ListSnapshotsResponse:
        identity = caller_identity()
        snapshots, next_token = page(
            [s for s in self._store.list_snapshots(request.name) if self._visible(identity, s)],
            request.page_size,
            request.page_token,
            f"snapshots:{request.name}",
            DEFAULT_PAGE_SIZE,
        )
        return snapshot_pb2.ListSnapshotsResponse(
            snapshots=[convert.snapshot_to_proto(s) for s in snapshots], next_page_token=next_token
        )
