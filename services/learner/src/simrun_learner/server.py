"""The resource learner's gRPC server factory, used by its `__main__`, by `simrun server` and by the tests."""

from __future__ import annotations

from pathlib import Path

from simrun.v1 import learner_pb2, learner_pb2_grpc
from simrun_core.config import TlsConfig
from simrun_core.identity import TokenRegistry
from simrun_core.rpc.server import BoundServer, build_server
from simrun_core.telemetry import Telemetry

from simrun_learner.learner import ResourceLearner
from simrun_learner.servicer import ResourceLearnerService

SERVICE_NAME = learner_pb2.DESCRIPTOR.services_by_name["ResourceLearnerService"].full_name


def create_server(
    learner: ResourceLearner | Path | str,
    address: str = "127.0.0.1:0",
    tokens: TokenRegistry | None = None,
    tls: TlsConfig | None = None,
    insecure: bool = False,
    *,
    telemetry: Telemetry | None = None,
) -> BoundServer:
    """A learner server bound to `address` (not started), with the production interceptors and health.

    Args:
        learner: The learner to serve, or the path of its SQLite database (`StoreLayout.observations`);
            an embedded server passes the learner the run tracker calls in-process.
        address: `host:port`; port 0 picks a free one.
        tokens: When given, every call but health checks needs a known bearer token.
        telemetry: Where the server's spans go; the process's own by default.
    """
    if not isinstance(learner, ResourceLearner):
        learner = ResourceLearner(learner)
    servicer = ResourceLearnerService(learner)
    return build_server(
        address,
        [lambda server: learner_pb2_grpc.add_ResourceLearnerServiceServicer_to_server(servicer, server)],
        [SERVICE_NAME],
        tokens=tokens,
        tls=tls,
        insecure=insecure,
        telemetry=telemetry,
    )
