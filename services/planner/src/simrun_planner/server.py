"""The planner's gRPC server factory, used by its `__main__`, by `simrun server` and by the tests."""

from __future__ import annotations

from simrun.v1 import planner_pb2, planner_pb2_grpc
from simrun_core.config import TlsConfig
from simrun_core.errors import FailedPrecondition
from simrun_core.identity import TokenRegistry
from simrun_core.rpc.server import BoundServer, build_server
from simrun_core.telemetry import Telemetry

from simrun_planner.planning import PlanError
from simrun_planner.servicer import PlannerService

SERVICE_NAME = planner_pb2.DESCRIPTOR.services_by_name["PlannerService"].full_name


def create_server(
    address: str = "127.0.0.1:0",
    tokens: TokenRegistry | None = None,
    tls: TlsConfig | None = None,
    insecure: bool = False,
    *,
    telemetry: Telemetry | None = None,
) -> BoundServer:
    """A planner server bound to `address` (not started), with the production interceptors and health; its spans
    go to `telemetry` (the process's own by default).

    The planner has no configuration: it plans from what each request carries.
    """
    return build_server(
        address,
        [lambda server: planner_pb2_grpc.add_PlannerServiceServicer_to_server(PlannerService(), server)],
        [SERVICE_NAME],
        tokens=tokens,
        translate={PlanError: FailedPrecondition},
        tls=tls,
        insecure=insecure,
        telemetry=telemetry,
    )
