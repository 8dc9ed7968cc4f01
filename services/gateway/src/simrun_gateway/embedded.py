"""The gateway server: every service in one process (the embedded default), or some forwarded to their addresses."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from simrun.v1 import (
    envbuilder_pb2,
    gateway_pb2,
    gateway_pb2_grpc,
    learner_pb2,
    learner_pb2_grpc,
    planner_pb2,
    planner_pb2_grpc,
    snapshot_pb2,
    tracker_pb2,
    tracker_pb2_grpc,
)
from simrun_core.config import ServerConfig, ensure_local_tokens, private_dir
from simrun_core.errors import FailedPrecondition
from simrun_core.homelock import HomeLock
from simrun_core.identity import TokenRegistry
from simrun_core.rpc.server import BoundServer, Registration, build_server, check_transport
from simrun_core.rpc.serving import serve as serve_until_stopped
from simrun_core.telemetry import Telemetry, process_telemetry
from simrun_envbuilder.builder import EnvironmentBuilder
from simrun_envbuilder.convert import settings_from_config
from simrun_envbuilder.server import register as register_environments
from simrun_learner.learner import ResourceLearner
from simrun_learner.servicer import ResourceLearnerService
from simrun_planner import PlanError
from simrun_planner.servicer import PlannerService
from simrun_runtime.layout import StoreLayout
from simrun_snapshot.server import register as register_snapshots
from simrun_tracker.server import build_tracker, check_pod_folders
from simrun_tracker.servicer import RunTrackerServicer
from simrun_tracker.tracker import RunTracker

from simrun_gateway.proxy import ForwardingHandler, method_shapes
from simrun_gateway.servicer import GatewayServicer

log = logging.getLogger(__name__)

SERVICE_NAME = "simrun-gateway"
"""The gateway's OpenTelemetry service name (every service embedded in it shares its process), unless
`OTEL_SERVICE_NAME` names it."""

_DESCRIPTORS = {
    "planner": planner_pb2.DESCRIPTOR.services_by_name["PlannerService"],
    "learner": learner_pb2.DESCRIPTOR.services_by_name["ResourceLearnerService"],
    "snapshot": snapshot_pb2.DESCRIPTOR.services_by_name["SnapshotService"],
    "tracker": tracker_pb2.DESCRIPTOR.services_by_name["RunTrackerService"],
    "envbuilder": envbuilder_pb2.DESCRIPTOR.services_by_name["EnvironmentBuilderService"],
}


@dataclass
class EmbeddedServer:
    """A running gateway server and the parts it serves in process."""

    server: BoundServer
    config: ServerConfig
    token: str
    """The owner's token made on first start; empty when the config names its own tokens file."""
    tracker: RunTracker | None = None
    learner: ResourceLearner | None = None
    environments: EnvironmentBuilder | None = None
    closers: list[Any] = field(default_factory=list)
    telemetry: Telemetry | None = None

    @property
    def port(self) -> int:
        return self.server.port

    @property
    def address(self) -> str:
        host = self.config.address.rsplit(":", 1)[0]
        return f"{host}:{self.port}"

    def stop(self, grace_s: float = 2.0) -> None:
        """Stops serving, then the tracker (its pods stop; a new server starts them again) and the learner."""
        self.server.stop(grace_s)
        for closer in self.closers:
            closer()


def start_embedded(
    config: ServerConfig, *, drive_runs: bool = True, telemetry: Telemetry | None = None
) -> EmbeddedServer:
    """Starts the gateway with every service not given an address in `config.services` served in process.

    Args:
        config: the server's configuration.
        drive_runs: start the tracker's driver; off, runs are recorded and not run (the SubmitRun benchmark).
        telemetry: where the server's spans go; the process's own (the OpenTelemetry variables) by default.

    Raises:
        InvalidArgument: a bad tokens file, or plaintext beyond loopback without `insecure: true`.
        FailedPrecondition: another server uses the home or the store.
    """
    check_transport(config.address, config.tls, config.insecure)
    if not config.services.tracker:
        check_pod_folders(config)
    private_dir(config.home, config.share_group)
    store = StoreLayout(config.store)
    private_dir(store.root, config.share_group)
    lock = HomeLock(config.home, *([store.root] if not config.services.tracker else []))
    try:
        return _start(config, store, lock, drive_runs, telemetry)
    except BaseException:
        lock.release()
        raise


def _start(
    config: ServerConfig, store: StoreLayout, lock: HomeLock, drive_runs: bool, telemetry: Telemetry | None
) -> EmbeddedServer:
    if config.tokens_file is not None:
        tokens, token = TokenRegistry.load(config.tokens_file), ""
    else:
        tokens_file, token = ensure_local_tokens(config.home, config.share_group)
        tokens = TokenRegistry.load(tokens_file)
    telemetry = telemetry or process_telemetry(SERVICE_NAME)
    remote = {name: address for name, address in config.services.model_dump().items() if address}
    registrations: list[Registration] = [
        lambda s: gateway_pb2_grpc.add_GatewayServiceServicer_to_server(GatewayServicer(), s)
    ]
    names = [gateway_pb2.DESCRIPTOR.services_by_name["GatewayService"].full_name]
    closers: list[Any] = []
    learner = tracker = None
    if "planner" not in remote:
        registrations.append(lambda s: planner_pb2_grpc.add_PlannerServiceServicer_to_server(PlannerService(), s))
    if "learner" not in remote:
        learner = ResourceLearner(store.observations)
        registrations.append(
            lambda s: learner_pb2_grpc.add_ResourceLearnerServiceServicer_to_server(ResourceLearnerService(learner), s)
        )
    if "snapshot" not in remote:
        registrations.append(register_snapshots(store.root, config.limits, config.read_policy))
    environments: EnvironmentBuilder | None = None
    if "envbuilder" not in remote:
        environments = EnvironmentBuilder(settings_from_config(config))
        registrations.append(register_environments(environments, config.read_policy))
    if "tracker" not in remote:
        tracker = build_tracker(config, store, learner, environments, telemetry)
        closers.append(tracker.close)
        registrations.append(
            lambda s: tracker_pb2_grpc.add_RunTrackerServiceServicer_to_server(RunTrackerServicer(tracker), s)
        )
    if learner is not None:
        closers.append(learner.close)
    if environments is not None:
        closers.append(environments.close)
    if remote:
        forwarding = ForwardingHandler(
            {_DESCRIPTORS[name].full_name: address for name, address in remote.items()},
            method_shapes(*(_DESCRIPTORS[name] for name in remote)),
            telemetry,
            tls=config.tls,
        )
        registrations.append(lambda s: s.add_generic_rpc_handlers((forwarding,)))
        closers.append(forwarding.close)
    names += [d.full_name for name, d in _DESCRIPTORS.items() if name not in remote]
    try:
        server = build_server(
            config.address,
            registrations,
            names,
            tokens=tokens,
            translate={PlanError: FailedPrecondition},
            max_concurrent_calls=config.max_concurrent_calls,
            calls_per_identity=config.limits.calls_per_identity,
            tls=config.tls,
            insecure=config.insecure,
            telemetry=telemetry,
        ).start()
    except BaseException:
        for closer in closers:
            closer()
        raise
    closers.append(lock.release)
    if tracker is not None and drive_runs:
        tracker.start()
    return EmbeddedServer(server, config, token, tracker, learner, environments, closers, telemetry)


def serve(config: ServerConfig, ready: Any = None) -> None:
    """Serves until SIGINT or SIGTERM, then stops the pods and the services, last the telemetry."""
    telemetry = process_telemetry(SERVICE_NAME)
    embedded = start_embedded(config, telemetry=telemetry)
    serve_until_stopped(embedded, telemetry=telemetry, ready=None if ready is None else lambda: ready(embedded))
