"""A gRPC channel to simrun with the caller's bearer token, and calls whose failures come back as domain errors."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import grpc
from simrun_core.rpc import channel as rpc_channel
from simrun_core.rpc.errors import to_domain_error
from simrun_core.telemetry import Telemetry, process_telemetry

R = TypeVar("R")

# Uploads stream chunks of about 1 MiB; leave room for a header listing many files.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
SERVICE_NAME = "simrun-client"
"""The client's OpenTelemetry service name, unless `OTEL_SERVICE_NAME` names it."""


def open_channel(endpoint: str, token: str | None = None, *, telemetry: Telemetry | None = None) -> grpc.Channel:
    """A channel to `host:port` that sends `token` as a bearer token on every call, if given, and traces its calls
    (with the client's own telemetry from the OpenTelemetry variables unless `telemetry` is given)."""
    options = [
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ]
    return rpc_channel.open_channel(
        endpoint, token=token, options=options, telemetry=telemetry or process_telemetry(SERVICE_NAME)
    )


def call(method: Callable[..., R], request: Any, **kwargs: Any) -> R:
    """Calls a stub method; a failed call raises the typed domain error (`NotFound`, `InvalidArgument`, …)."""
    try:
        return method(request, **kwargs)
    except grpc.RpcError as exc:
        raise to_domain_error(exc) from None
