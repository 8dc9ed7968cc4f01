"""The run tracker's server factory, used by its `__main__`, by `simrun server` and by the tests."""

from __future__ import annotations

from simrun.v1 import tracker_pb2, tracker_pb2_grpc
from simrun_core.config import ServerConfig, TlsConfig
from simrun_core.errors import InvalidArgument
from simrun_core.identity import TokenRegistry
from simrun_core.rpc.server import BoundServer, build_server
from simrun_core.telemetry import Telemetry, process_telemetry
from simrun_envbuilder.builder import EnvironmentBuilder
from simrun_envbuilder.convert import settings_from_config
from simrun_learner.learner import ResourceLearner
from simrun_runtime.layout import StoreLayout

from simrun_tracker.describer import SubprocessDescriber
from simrun_tracker.environments import GrpcEnvironments, InProcessEnvironments
from simrun_tracker.executor import Executor, PodSpec
from simrun_tracker.guard import Guard
from simrun_tracker.learning import GrpcLearner, InProcessLearner
from simrun_tracker.local import LocalExecutor
from simrun_tracker.local.confinement import PodConfinement, check_visible_to_pods
from simrun_tracker.local.executor import Launcher
from simrun_tracker.ports import EnvironmentPort, LearnerPort, LocalInterpreters, ServerEnvironments
from simrun_tracker.servicer import RunTrackerServicer
from simrun_tracker.tracker import RunTracker

SERVICE_NAME = tracker_pb2.DESCRIPTOR.services_by_name["RunTrackerService"].full_name
TELEMETRY_NAME = "simrun-tracker"
"""The tracker's OpenTelemetry service name when it runs alone, unless `OTEL_SERVICE_NAME` names it."""


def local_launcher(interpreters: LocalInterpreters) -> Launcher:
    """How this machine runs a pod: its environment's interpreter (the run's overlay) and the runtime module."""

    def launch(spec: PodSpec) -> list[str]:
        return [interpreters.interpreter(spec.environment_id, spec.run_id), "-m", spec.role.module]

    return launch


def build_executor(
    config: ServerConfig, store: StoreLayout, interpreters: LocalInterpreters, environments: EnvironmentPort
) -> Executor:
    """The executor the config's `executor:` section chooses."""
    if config.executor.kind == "local":
        return LocalExecutor.from_config(config.executor.local, store.root, local_launcher(interpreters))
    if config.executor.kind == "containers":
        from simrun_tracker.containers import ContainerExecutor

        def image_of(spec: PodSpec) -> str:
            return environments.get(spec.environment_id).image

        return ContainerExecutor.from_configs(config.executor.containers, config.executor.local, store.root, image_of)
    if config.executor.kind == "kubernetes":
        from simrun_tracker.kubernetes import kubernetes_executor  # the client loads only when chosen

        return kubernetes_executor(config.executor.kubernetes or {}, store, config.grace_s)
    raise InvalidArgument(f"executor kind {config.executor.kind!r} is not available in this build of simrun")


def build_environments(
    config: ServerConfig, store: StoreLayout, builder: EnvironmentBuilder | None, telemetry: Telemetry | None = None
) -> InProcessEnvironments | GrpcEnvironments | ServerEnvironments:
    """The environment port: the server's own Python (`environments.kind: server`), the builder in process, or
    its service at `config.services.envbuilder` (on this machine: pods run its venvs through local overlays)."""
    if config.environments.kind == "server":
        return ServerEnvironments()
    if builder is not None:
        return InProcessEnvironments(builder)
    if config.services.envbuilder:
        return GrpcEnvironments(
            config.services.envbuilder, store, config.service_token, tls=config.tls, telemetry=telemetry
        )
    return InProcessEnvironments(EnvironmentBuilder(settings_from_config(config)), owned=True)


def check_pod_folders(config: ServerConfig) -> None:
    """Refuses, before a server makes anything, a store or environments folder its confined pods would not see.

    Raises:
        InvalidArgument: such a folder (`check_visible_to_pods`).
    """
    folders = {"the store": config.store, "the environments folder": settings_from_config(config).root}
    check_visible_to_pods(config.executor.local.confinement, folders)


def build_tracker(
    config: ServerConfig,
    store: StoreLayout,
    learner: ResourceLearner | None,
    environments: EnvironmentBuilder | None = None,
    telemetry: Telemetry | None = None,
) -> RunTracker:
    """A run tracker over the configured executor, with the learner in process or at `config.services.learner`,
    and the environment builder given (in process), at `config.services.envbuilder`, or its own; its spans (the
    driver's steps, pod attempts, calls to the learner) go to `telemetry`."""
    telemetry = telemetry or process_telemetry(TELEMETRY_NAME)
    port: LearnerPort
    if learner is not None:
        port = InProcessLearner(learner, store)
    else:
        port = GrpcLearner(config.services.learner, store, config.service_token, tls=config.tls, telemetry=telemetry)
    environments_port = build_environments(config, store, environments, telemetry)
    return RunTracker(
        store,
        build_executor(config, store, environments_port, environments_port),
        port,
        SubprocessDescriber(
            confinement=PodConfinement(config.executor.local.confinement, network=config.executor.local.pod_network)
        ),
        environments_port,
        environments_port,
        grace_s=config.grace_s,
        merge_wait_s=config.merge_wait_s,
        driver=config.driver,
        index_path=config.index,
        guard=Guard(config.limits, config.read_policy),
        telemetry=telemetry,
    )


def create_server(
    tracker: RunTracker,
    address: str,
    tokens: TokenRegistry | None,
    tls: TlsConfig | None = None,
    *,
    telemetry: Telemetry | None = None,
) -> BoundServer:
    """A tracker server bound to `address` (not started), with the production interceptors and health; its
    spans go to `telemetry` (the tracker's by default)."""
    servicer = RunTrackerServicer(tracker)
    return build_server(
        address,
        [lambda server: tracker_pb2_grpc.add_RunTrackerServiceServicer_to_server(servicer, server)],
        [SERVICE_NAME],
        tokens=tokens,
        tls=tls,
        telemetry=telemetry or tracker.telemetry,
    )
