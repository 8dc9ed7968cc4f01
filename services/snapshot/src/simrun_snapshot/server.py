"""Builds the snapshot service's gRPC server over a store."""

from __future__ import annotations

from pathlib import Path

import grpc
from simrun.v1 import snapshot_pb2, snapshot_pb2_grpc
from simrun_core.config import Limits, ReadPolicy, TlsConfig
from simrun_core.identity import TokenRegistry
from simrun_core.rpc.server import BoundServer, Registration, build_server
from simrun_core.snapshots.store import SnapshotStore
from simrun_core.telemetry import Telemetry

from simrun_snapshot.servicer import SnapshotServicer

SERVICE_NAME = snapshot_pb2.DESCRIPTOR.services_by_name["SnapshotService"].full_name


def register(store_root: Path, limits: Limits | None = None, policy: ReadPolicy | None = None) -> Registration:
    """A registration that adds the SnapshotService over `store_root` to a server (for `simrun server`)."""

    def add(server: grpc.Server) -> None:
        servicer = SnapshotServicer(SnapshotStore(store_root, limits), policy)
        snapshot_pb2_grpc.add_SnapshotServiceServicer_to_server(servicer, server)

    return add


def create_server(
    store_root: Path,
    address: str,
    tokens: TokenRegistry | None = None,
    limits: Limits | None = None,
    tls: TlsConfig | None = None,
    insecure: bool = False,
    *,
    telemetry: Telemetry | None = None,
) -> BoundServer:
    """The snapshot service with the production interceptors and health, bound to `address`, not yet started;
    its spans go to `telemetry` (the process's own by default)."""
    return build_server(
        address,
        [register(Path(store_root), limits)],
        [SERVICE_NAME],
        tokens=tokens,
        tls=tls,
        insecure=insecure,
        telemetry=telemetry,
    )
