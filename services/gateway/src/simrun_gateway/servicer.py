"""The GatewayService servicer: tells a caller who its token says it is."""

from __future__ import annotations

import grpc
from simrun.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc
from simrun_core.identity import Priority
from simrun_core.rpc.auth import current_identity

_PRIORITY = {
    Priority.OWNER: common_pb2.PRIORITY_OWNER,
    Priority.STANDARD: common_pb2.PRIORITY_STANDARD,
    Priority.AGENT: common_pb2.PRIORITY_AGENT,
}


class GatewayServicer(gateway_pb2_grpc.GatewayServiceServicer):
    """The gateway's own method; every other method is served or forwarded beside it."""

    def GetIdentity(
        self, request: gateway_pb2.GetIdentityRequest, context: grpc.ServicerContext
    ) -> gateway_pb2.GetIdentityResponse:
        identity = current_identity()
        return gateway_pb2.GetIdentityResponse(
            identity=common_pb2.Identity(
                name=identity.name,
                kind=identity.kind.value,
                on_behalf_of=identity.on_behalf_of or "",
                priority=_PRIORITY[identity.priority],
            )
        )
