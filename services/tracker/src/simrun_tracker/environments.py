"""The environment port: the environment builder in this process, or its service at an address.

Both adapters are also the tracker's `LocalInterpreters`: the interpreter of a READY environment on this machine,
for describing types (with the submission's snapshots, so its libraries import too) or for a run's pods (the
overlay of the run's snapshots). A run records the environment's id, never a path, and keeps the lock as its
`environment.lock`.
"""

from __future__ import annotations

import json
import os
import sys
import uuid
from typing import Any

import grpc
from simrun.v1 import common_pb2, envbuilder_pb2, envbuilder_pb2_grpc
from simrun_core.config import TlsConfig
from simrun_core.errors import FailedPrecondition
from simrun_core.rpc.channel import open_channel
from simrun_core.rpc.errors import to_domain_error
from simrun_core.rpc.tls import service_credentials
from simrun_core.telemetry import Telemetry
from simrun_envbuilder import builder as domain
from simrun_envbuilder.builder import EnvironmentBuilder
from simrun_envbuilder.overlays import Overlays
from simrun_runtime.layout import StoreLayout
from simrun_runtime.record import SnapshotRef

from simrun_tracker.ports import DEFAULT_ENVIRONMENT, Environment, EnvironmentState

_STATES = {
    domain.EnvironmentState.BUILDING: EnvironmentState.BUILDING,
    domain.EnvironmentState.READY: EnvironmentState.READY,
    domain.EnvironmentState.FAILED: EnvironmentState.FAILED,
}
_PROTO_STATES = {
    common_pb2.ENVIRONMENT_STATE_BUILDING: EnvironmentState.BUILDING,
    common_pb2.ENVIRONMENT_STATE_READY: EnvironmentState.READY,
    common_pb2.ENVIRONMENT_STATE_FAILED: EnvironmentState.FAILED,
}

assert DEFAULT_ENVIRONMENT == domain.DEFAULT_ENVIRONMENT


def _from_domain(environment: domain.Environment) -> Environment:
    return Environment(
        environment_id=environment.environment_id,
        state=_STATES[environment.state],
        message=environment.message,
        python_version=environment.python_version,
        image=environment.image,
        lock_hash=environment.lock_sha256,
        note=environment.note,
    )


def _write_run_lock(store: StoreLayout, run_id: str, lock: bytes) -> None:
    run = store.run(run_id)
    target = run.environment_lock
    if not lock or target.exists() or not run.root.is_dir():
        return
    temp = target.with_name(f".{target.name}.{uuid.uuid4().hex}")
    temp.write_bytes(lock)
    os.replace(temp, target)


class InProcessEnvironments:
    """Calls the environment builder's domain directly: the embedded server's environment port."""

    def __init__(self, builder: EnvironmentBuilder, owned: bool = False) -> None:
        self._builder = builder
        self._owned = owned

    def resolve(self, snapshots: list[SnapshotRef]) -> Environment:
        return _from_domain(self._builder.resolve(snapshots))

    def get(self, environment_id: str) -> Environment:
        return _from_domain(self._builder.get(environment_id))

    def interpreter(
        self, environment_id: str, run_id: str | None = None, snapshots: list[SnapshotRef] | None = None
    ) -> str:
        return self._builder.interpreter(environment_id, run_id, snapshots)

    def write_run_lock(self, run_id: str, environment_id: str) -> None:
        """Writes `runs/<id>/environment.lock` once (the overlay of a run's pods writes it too)."""
        self._builder.write_run_lock(run_id, environment_id)

    def close(self) -> None:
        """Closes the builder only when this port made it (a tracker alone); else it belongs to the server."""
        if self._owned:
            self._builder.close()


class GrpcEnvironments:
    """Calls the environment builder service at an address: the environment port of a tracker that runs alone.

    The interpreters are still local (a local executor runs on the builder's machine): the overlays of runs are
    made here beside the shared venv the service names, in its environment's folder, where the builder sees them
    and never removes an environment a live run uses.
    """

    def __init__(
        self,
        address: str,
        store: StoreLayout,
        token: str = "",
        timeout_s: float = 600.0,
        *,
        tls: TlsConfig | None = None,
        telemetry: Telemetry | None = None,
    ) -> None:
        # The one channel factory of the services: traced, the token on every call, TLS verified against `tls.ca`.
        self._channel = open_channel(
            address, token=token or None, telemetry=telemetry, credentials=service_credentials(tls)
        )
        self._stub = envbuilder_pb2_grpc.EnvironmentBuilderServiceStub(self._channel)
        self._store = store
        self._overlays = Overlays(store)
        # A lock can take minutes on a cold cache; a get answers at once.
        self._timeout_s = timeout_s

    def _call(self, method: Any, request: Any, timeout_s: float | None = None) -> Any:
        try:
            return method(request, timeout=timeout_s or self._timeout_s)
        except grpc.RpcError as exc:
            raise to_domain_error(exc) from None

    def resolve(self, snapshots: list[SnapshotRef]) -> Environment:
        request = envbuilder_pb2.CreateEnvironmentRequest(
            snapshots=[common_pb2.Snapshot(name=s.name, snapshot_id=s.snapshot_id, path=s.path) for s in snapshots]
        )
        return self._to_port(self._call(self._stub.CreateEnvironment, request).environment)

    def get(self, environment_id: str) -> Environment:
        request = envbuilder_pb2.GetEnvironmentRequest(environment_id=environment_id)
        return self._to_port(self._call(self._stub.GetEnvironment, request, 30.0).environment)

    def interpreter(
        self, environment_id: str, run_id: str | None = None, snapshots: list[SnapshotRef] | None = None
    ) -> str:
        if environment_id == DEFAULT_ENVIRONMENT:
            return sys.executable
        response = self._call(
            self._stub.GetEnvironment,
            envbuilder_pb2.GetEnvironmentRequest(environment_id=environment_id, include_lock=run_id is not None),
            30.0,
        )
        environment = response.environment
        if environment.state != common_pb2.ENVIRONMENT_STATE_READY or not environment.interpreter:
            raise FailedPrecondition(f"environment {environment_id} is not ready on this machine")
        if run_id is not None:
            _write_run_lock(self._store, run_id, response.lock.encode())
            snapshots = _run_snapshots(self._store, run_id)
        if not snapshots:
            return environment.interpreter
        return str(self._overlays.interpreter(environment_id, environment.interpreter, snapshots, run_id))

    def write_run_lock(self, run_id: str, environment_id: str) -> None:
        if environment_id == DEFAULT_ENVIRONMENT:
            return
        request = envbuilder_pb2.GetEnvironmentRequest(environment_id=environment_id, include_lock=True)
        _write_run_lock(self._store, run_id, self._call(self._stub.GetEnvironment, request, 30.0).lock.encode())

    def close(self) -> None:
        self._channel.close()

    @staticmethod
    def _to_port(message: common_pb2.Environment) -> Environment:
        return Environment(
            environment_id=message.environment_id,
            state=_PROTO_STATES[message.state],
            message=message.message,
            python_version=message.python_version,
            image=message.image,
            lock_hash=message.lock_sha256,
            note=message.note,
        )


def _run_snapshots(store: StoreLayout, run_id: str) -> list[SnapshotRef]:
    data = json.loads(store.run(run_id).record.read_text())
    return [SnapshotRef.model_validate(s) for s in data.get("snapshots", [])]
