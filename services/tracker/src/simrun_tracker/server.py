"""The run tracker's server factory, used by its `__main__`, by `simrun server` and by the tests."""

from __future__ import annotations

from simrun.v1 import tracker_pb2, tracker_pb2_grpc
from simrun_core.config import ServerConfig
from simrun_core.identity import TokenRegistry
from simrun_core.rpc.server import BoundServer, build_server
from simrun_learner.learner import ResourceLearner
from simrun_runtime.layout import StoreLayout

from simrun_tracker.describer import SubprocessDescriber
from simrun_tracker.learning import GrpcLearner, InProcessLearner
from simrun_tracker.local import LocalExecutor
from simrun_tracker.ports import LearnerPort, ServerInterpreter
from simrun_tracker.servicer import RunTrackerServicer
from simrun_tracker.tracker import RunTracker

SERVICE_NAME = tracker_pb2.DESCRIPTOR.services_by_name["RunTrackerService"].full_name


def build_tracker(config: ServerConfig, store: StoreLayout, learner: ResourceLearner | None) -> RunTracker:
    """A run tracker over the local executor, with the learner in process or at `config.services.learner`."""
    port: LearnerPort
    if learner is not None:
        port = InProcessLearner(learner, store)
    else:
        port = GrpcLearner(config.services.learner, store, config.service_token)
    return RunTracker(
        store,
        LocalExecutor.from_config(config),
        port,
        SubprocessDescriber(),
        ServerInterpreter(),
        grace_s=config.grace_s,
        merge_wait_s=config.merge_wait_s,
    )


def create_server(tracker: RunTracker, address: str, tokens: TokenRegistry | None) -> BoundServer:
    """A tracker server bound to `address` (not started), with the production interceptors and health."""
    servicer = RunTrackerServicer(tracker)
    return build_server(
        address,
        [lambda server: tracker_pb2_grpc.add_RunTrackerServiceServicer_to_server(servicer, server)],
        [SERVICE_NAME],
        tokens=tokens,
    )
