"""The GatewayService servicer: tells a caller who its token says it is."""

from __future__ import annotations

import grpc
from simrun.v1 import gateway_pb2, gateway_pb2_grpc
from simrun_core.messages import identity_to_proto
from simrun_core.rpc.auth import current_identity


class GatewayServicer(gateway_pb2_grpc.GatewayServiceServicer):
    """The gateway's own method; every other method is served or forwarded beside it."""

    def GetIdentity(
        self, request: gateway_pb2.GetIdentityRequest, context: grpc.ServicerContext
    ) -> gateway_pb2.GetIdentityResponse:
        return gateway_pb2.GetIdentityResponse(identity=identity_to_proto(current_identity()))
