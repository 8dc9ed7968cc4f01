"""The shared gRPC plumbing through a real server on loopback: error mapping, authentication, identity, health."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from simrun.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc, tracker_pb2, tracker_pb2_grpc
from simrun_core.errors import (
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    SimrunError,
    Unauthenticated,
    Unavailable,
)
from simrun_core.identity import TokenRegistry
from simrun_core.rpc.auth import bearer_metadata, current_identity
from simrun_core.rpc.errors import to_domain_error
from simrun_core.rpc.server import BoundServer, build_server

TOKENS = TokenRegistry.from_mapping(
    {
        "owner": "alice",
        "tokens": {"t-alice": {"name": "alice"}, "t-bob-agent": {"name": "bob-agent", "agent_of": "bob"}},
    }
)
ALICE = bearer_metadata("t-alice")
GATEWAY = gateway_pb2.DESCRIPTOR.services_by_name["GatewayService"].full_name
TRACKER = tracker_pb2.DESCRIPTOR.services_by_name["RunTrackerService"].full_name


class DomainError(Exception):
    """A domain's own exception, translated to FAILED_PRECONDITION by the server."""


class SubDomainError(DomainError):
    pass


class Gateway(gateway_pb2_grpc.GatewayServiceServicer):
    """GetIdentity raises `error` when set, else answers the caller's identity."""

    def __init__(self) -> None:
        self.error: BaseException | None = None
        self.abort: tuple[grpc.StatusCode, str] | None = None
        self.sleep_s = 0.0

    def GetIdentity(self, request: Any, context: grpc.ServicerContext) -> gateway_pb2.GetIdentityResponse:
        time.sleep(self.sleep_s)
        if self.abort is not None:
            context.abort(*self.abort)
        if self.error is not None:
            raise self.error
        identity = current_identity()
        return gateway_pb2.GetIdentityResponse(
            identity=common_pb2.Identity(
                name=identity.name, kind=identity.kind.value, on_behalf_of=identity.on_behalf_of or ""
            )
        )


class Tracker(tracker_pb2_grpc.RunTrackerServiceServicer):
    """WatchRun by the run id: `three` yields three runs named after the caller, `fail` one then NotFound,
    `boom` one then a RuntimeError, `endless` until the client goes away (then sets `closed`)."""

    def __init__(self) -> None:
        self.closed = threading.Event()
        self.errors: list[BaseException] = []

    def WatchRun(self, request: Any, context: grpc.ServicerContext) -> Iterator[tracker_pb2.WatchRunResponse]:
        def response(i: int) -> tracker_pb2.WatchRunResponse:
            return tracker_pb2.WatchRunResponse(run=common_pb2.Run(run_id=str(i), message=current_identity().name))

        if request.run_id == "three":
            for i in range(3):
                yield response(i)
        elif request.run_id == "fail":
            yield response(0)
            raise NotFound("run fail is gone")
        elif request.run_id == "boom":
            yield response(0)
            raise RuntimeError("boom")
        elif request.run_id == "endless":
            try:
                i = 0
                while True:
                    yield response(i)
                    i += 1
                    time.sleep(0.01)
            except Exception as exc:
                self.errors.append(exc)
                raise
            finally:
                self.closed.set()


@pytest.fixture(scope="module")
def servicers() -> tuple[Gateway, Tracker]:
    return Gateway(), Tracker()


@pytest.fixture(scope="module")
def bound(servicers: tuple[Gateway, Tracker]) -> Iterator[BoundServer]:
    gateway, tracker = servicers
    server = build_server(
        "127.0.0.1:0",
        [
            lambda s: gateway_pb2_grpc.add_GatewayServiceServicer_to_server(gateway, s),
            lambda s: tracker_pb2_grpc.add_RunTrackerServiceServicer_to_server(tracker, s),
        ],
        [GATEWAY, TRACKER],
        tokens=TOKENS,
        translate={DomainError: FailedPrecondition},
        max_concurrent_calls=8,
    ).start()
    yield server
    server.stop(None)


@pytest.fixture(scope="module")
def channel(bound: BoundServer) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(f"127.0.0.1:{bound.port}") as channel:
        yield channel


@pytest.fixture
def gateway(servicers: tuple[Gateway, Tracker]) -> Iterator[Gateway]:
    servicer = servicers[0]
    yield servicer
    servicer.error, servicer.abort, servicer.sleep_s = None, None, 0.0


@pytest.fixture
def gateway_stub(channel: grpc.Channel) -> gateway_pb2_grpc.GatewayServiceStub:
    return gateway_pb2_grpc.GatewayServiceStub(channel)


@pytest.fixture
def tracker_stub(channel: grpc.Channel) -> tracker_pb2_grpc.RunTrackerServiceStub:
    return tracker_pb2_grpc.RunTrackerServiceStub(channel)


def _fail(call: Any) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value


# --- errors -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (InvalidArgument("bad field x"), grpc.StatusCode.INVALID_ARGUMENT),
        (NotFound("no run r1"), grpc.StatusCode.NOT_FOUND),
        (AlreadyExists("run r1 exists"), grpc.StatusCode.ALREADY_EXISTS),
        (FailedPrecondition("node big is reserved"), grpc.StatusCode.FAILED_PRECONDITION),
        (PermissionDenied("not your run"), grpc.StatusCode.PERMISSION_DENIED),
        (Unauthenticated("who are you"), grpc.StatusCode.UNAUTHENTICATED),
        (Unavailable("learner is down"), grpc.StatusCode.UNAVAILABLE),
        (SimrunError("something broke"), grpc.StatusCode.INTERNAL),
        (SubDomainError("plan does not fit"), grpc.StatusCode.FAILED_PRECONDITION),
    ],
)
def test_domain_errors_become_their_status_code_with_their_message(
    gateway: Gateway, gateway_stub: gateway_pb2_grpc.GatewayServiceStub, error: Exception, code: grpc.StatusCode
) -> None:
    gateway.error = error
    failure = _fail(lambda: gateway_stub.GetIdentity(gateway_pb2.GetIdentityRequest(), metadata=ALICE))
    assert (failure.code(), failure.details()) == (code, str(error))
    back = to_domain_error(failure)
    expected = FailedPrecondition if isinstance(error, DomainError) else type(error)
    assert (type(back), str(back)) == (expected, str(error))


def test_any_other_exception_is_internal_naming_the_method(
    gateway: Gateway, gateway_stub: gateway_pb2_grpc.GatewayServiceStub
) -> None:
    gateway.error = KeyError("x")
    failure = _fail(lambda: gateway_stub.GetIdentity(gateway_pb2.GetIdentityRequest(), metadata=ALICE))
    assert failure.code() == grpc.StatusCode.INTERNAL
    assert failure.details() == f"internal error in /{GATEWAY}/GetIdentity: KeyError: 'x'"
    assert type(to_domain_error(failure)) is SimrunError


def test_an_abort_in_the_servicer_passes_through_untouched(
    gateway: Gateway, gateway_stub: gateway_pb2_grpc.GatewayServiceStub
) -> None:
    gateway.abort = (grpc.StatusCode.RESOURCE_EXHAUSTED, "too many runs")
    failure = _fail(lambda: gateway_stub.GetIdentity(gateway_pb2.GetIdentityRequest(), metadata=ALICE))
    assert (failure.code(), failure.details()) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "too many runs")
    back = to_domain_error(failure)
    assert (type(back), str(back), back.transient) == (ResourceExhausted, "too many runs", True)


def test_deadline_exceeded_and_unreachable_server_are_unavailable(
    gateway: Gateway, gateway_stub: gateway_pb2_grpc.GatewayServiceStub
) -> None:
    gateway.sleep_s = 0.3
    late = _fail(lambda: gateway_stub.GetIdentity(gateway_pb2.GetIdentityRequest(), metadata=ALICE, timeout=0.05))
    assert late.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert type(to_domain_error(late)) is Unavailable
    gone = build_server("127.0.0.1:0", [], []).start()
    gone.stop(None)  # nobody listens on its port any more
    with grpc.insecure_channel(f"127.0.0.1:{gone.port}") as closed:
        stub = gateway_pb2_grpc.GatewayServiceStub(closed)
        down = _fail(lambda: stub.GetIdentity(gateway_pb2.GetIdentityRequest(), timeout=5))
    assert down.code() == grpc.StatusCode.UNAVAILABLE
    assert type(to_domain_error(down)) is Unavailable


def test_a_stream_error_after_responses_keeps_its_code(tracker_stub: tracker_pb2_grpc.RunTrackerServiceStub) -> None:
    received: list[str] = []

    def watch(run_id: str) -> None:
        for response in tracker_stub.WatchRun(tracker_pb2.WatchRunRequest(run_id=run_id), metadata=ALICE):
            received.append(response.run.run_id)

    not_found = _fail(lambda: watch("fail"))
    assert (not_found.code(), not_found.details(), received) == (grpc.StatusCode.NOT_FOUND, "run fail is gone", ["0"])
    internal = _fail(lambda: watch("boom"))
    assert internal.code() == grpc.StatusCode.INTERNAL
    assert internal.details() == f"internal error in /{TRACKER}/WatchRun: RuntimeError: boom"


# --- authentication -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("metadata", "message"),
    [
        ((), "no bearer token"),
        ((("authorization", "t-alice"),), "no bearer token"),
        (bearer_metadata("t-carol"), "unknown bearer token"),
    ],
)
def test_a_call_without_a_known_token_is_unauthenticated(
    gateway_stub: gateway_pb2_grpc.GatewayServiceStub,
    tracker_stub: tracker_pb2_grpc.RunTrackerServiceStub,
    metadata: tuple[tuple[str, str], ...],
    message: str,
) -> None:
    unary = _fail(lambda: gateway_stub.GetIdentity(gateway_pb2.GetIdentityRequest(), metadata=metadata))
    stream = _fail(lambda: list(tracker_stub.WatchRun(tracker_pb2.WatchRunRequest(run_id="three"), metadata=metadata)))
    for failure in (unary, stream):
        assert failure.code() == grpc.StatusCode.UNAUTHENTICATED
        assert message in failure.details()
        assert type(to_domain_error(failure)) is Unauthenticated


def test_health_needs_no_token(channel: grpc.Channel) -> None:
    health = health_pb2_grpc.HealthStub(channel)
    for service in ("", GATEWAY, TRACKER):
        response = health.Check(health_pb2.HealthCheckRequest(service=service))
        assert response.status == health_pb2.HealthCheckResponse.SERVING


def test_a_unary_handler_sees_the_callers_identity(gateway_stub: gateway_pb2_grpc.GatewayServiceStub) -> None:
    alice = gateway_stub.GetIdentity(gateway_pb2.GetIdentityRequest(), metadata=ALICE).identity
    assert (alice.name, alice.kind, alice.on_behalf_of) == ("alice", "owner", "")
    agent = gateway_stub.GetIdentity(gateway_pb2.GetIdentityRequest(), metadata=bearer_metadata("t-bob-agent")).identity
    assert (agent.name, agent.kind, agent.on_behalf_of) == ("bob-agent", "agent", "bob")


def test_a_streaming_handler_sees_the_callers_identity_at_every_step(
    tracker_stub: tracker_pb2_grpc.RunTrackerServiceStub,
) -> None:
    responses = list(
        tracker_stub.WatchRun(tracker_pb2.WatchRunRequest(run_id="three"), metadata=bearer_metadata("t-bob-agent"))
    )
    assert [(r.run.run_id, r.run.message) for r in responses] == [
        ("0", "bob-agent"),
        ("1", "bob-agent"),
        ("2", "bob-agent"),
    ]


def test_no_identity_outside_a_request() -> None:
    with pytest.raises(Unauthenticated):
        current_identity()


def test_bearer_metadata() -> None:
    assert bearer_metadata("abc") == (("authorization", "Bearer abc"),)
    assert bearer_metadata(None) == bearer_metadata("") == ()


def test_a_client_cancelling_a_stream_early_raises_nothing(
    servicers: tuple[Gateway, Tracker],
    tracker_stub: tracker_pb2_grpc.RunTrackerServiceStub,
    gateway_stub: gateway_pb2_grpc.GatewayServiceStub,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING)
    tracker = servicers[1]
    call = tracker_stub.WatchRun(tracker_pb2.WatchRunRequest(run_id="endless"), metadata=ALICE)
    first = next(call)
    second = next(call)
    assert (first.run.run_id, second.run.run_id) == ("0", "1")
    call.cancel()
    assert call.code() == grpc.StatusCode.CANCELLED
    assert tracker.closed.wait(5), "the servicer's generator was never closed"
    assert tracker.errors == []
    assert [r.getMessage() for r in caplog.records] == []
    # The server still serves.
    assert gateway_stub.GetIdentity(gateway_pb2.GetIdentityRequest(), metadata=ALICE).identity.name == "alice"
