"""The gateway's forwarding of calls to services apart, on real gRPC servers on loopback: every shape of call, the
caller's token and deadline going with it, refusals coming back unchanged, and a caller who goes ending the call."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass

import grpc
import pytest
from simrun_core.config import TlsConfig
from simrun_core.rpc.server import BoundServer, build_server, server_credentials
from simrun_core.telemetry import Telemetry
from simrun_gateway.proxy import ForwardingHandler
from tls_support import make_certificates

SERVICE = "test.Echo"
SHAPES = {
    f"/{SERVICE}/Unary": (False, False),
    f"/{SERVICE}/Seen": (False, False),
    f"/{SERVICE}/Follow": (False, True),
    f"/{SERVICE}/Many": (False, True),
    f"/{SERVICE}/Upload": (True, False),
    f"/{SERVICE}/Chat": (True, True),
}
CHUNK = 1 << 20


class Echo:
    """A service apart whose methods take and give bytes, and say what they saw."""

    def __init__(self) -> None:
        self.follow_ended = threading.Event()
        self.produced = 0

    def unary(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        if request == b"refuse":
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "no <refuse>, say what to fix")
        return request + b"!"

    def seen(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        keys = sorted(key for key, _ in context.invocation_metadata() if not key.startswith(("grpc-", "user-agent")))
        metadata = dict(context.invocation_metadata())
        seen = {"keys": keys, "authorization": metadata.get("authorization"), "left": context.time_remaining()}
        return json.dumps(seen).encode()

    def follow(self, request: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
        ended = threading.Event()
        context.add_callback(ended.set)
        yield b"first"
        ended.wait(30)
        self.follow_ended.set()

    def many(self, request: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
        for _ in range(int(request)):
            self.produced += 1
            yield bytes(CHUNK)

    def upload(self, requests: Iterator[bytes], context: grpc.ServicerContext) -> bytes:
        return b"".join(requests)

    def chat(self, requests: Iterator[bytes], context: grpc.ServicerContext) -> Iterator[bytes]:
        for request in requests:
            yield request.upper()
            if request == b"end":  # the service ends the conversation, whatever the caller still sends
                return


def _backend(echo: Echo) -> grpc.Server:
    handlers = {
        "Unary": grpc.unary_unary_rpc_method_handler(echo.unary),
        "Seen": grpc.unary_unary_rpc_method_handler(echo.seen),
        "Follow": grpc.unary_stream_rpc_method_handler(echo.follow),
        "Many": grpc.unary_stream_rpc_method_handler(echo.many),
        "Upload": grpc.stream_unary_rpc_method_handler(echo.upload),
        "Chat": grpc.stream_stream_rpc_method_handler(echo.chat),
    }
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    return server


@dataclass
class Gateway:
    channel: grpc.Channel
    echo: Echo
    server: BoundServer
    forwarding: ForwardingHandler


@pytest.fixture
def gateway() -> Iterator[Gateway]:
    """A gateway forwarding `test.Echo` to its server apart, a channel to it, and that service."""
    echo = Echo()
    backend = _backend(echo)
    port = backend.add_insecure_port("127.0.0.1:0")
    backend.start()
    forwarding = ForwardingHandler({SERVICE: f"127.0.0.1:{port}"}, SHAPES, Telemetry.off())
    server = build_server(
        "127.0.0.1:0", [lambda s: s.add_generic_rpc_handlers((forwarding,))], [], telemetry=Telemetry.off()
    ).start()
    channel = grpc.insecure_channel(f"127.0.0.1:{server.port}")
    yield Gateway(channel, echo, server, forwarding)
    channel.close()
    server.stop(1)
    forwarding.close()
    backend.stop(1).wait()


def test_a_unary_call_and_a_refusal_come_back_as_the_service_gave_them(gateway):
    channel = gateway.channel
    unary = channel.unary_unary(f"/{SERVICE}/Unary")
    assert unary(b"hello", timeout=10) == b"hello!"
    with pytest.raises(grpc.RpcError) as caught:
        unary(b"refuse", timeout=10)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.details() == "no <refuse>, say what to fix"


def test_the_callers_token_and_deadline_go_with_the_call_and_nothing_else(gateway):
    channel = gateway.channel
    seen = json.loads(
        channel.unary_unary(f"/{SERVICE}/Seen")(
            b"", metadata=[("authorization", "Bearer abc"), ("x-other", "dropped")], timeout=30
        )
    )
    assert seen["authorization"] == "Bearer abc"
    assert "x-other" not in seen["keys"]
    assert 0 < seen["left"] <= 30
    no_deadline = json.loads(channel.unary_unary(f"/{SERVICE}/Seen")(b""))
    assert no_deadline["left"] > 3600  # no deadline of its own, not the gateway's


def test_a_caller_who_stops_following_ends_the_call_at_the_service(gateway):
    channel, echo = gateway.channel, gateway.echo
    follow = channel.unary_stream(f"/{SERVICE}/Follow")(b"")
    assert next(follow) == b"first"
    time.sleep(0.3)  # the gateway now waits on the service's next message
    assert not echo.follow_ended.is_set()
    follow.cancel()
    assert echo.follow_ended.wait(10), "the service's stream went on after its caller had gone"


def test_a_deadline_that_passes_while_following_ends_both_sides(gateway):
    channel, echo = gateway.channel, gateway.echo
    follow = channel.unary_stream(f"/{SERVICE}/Follow")(b"", timeout=1)
    assert next(follow) == b"first"
    with pytest.raises(grpc.RpcError) as caught:
        next(follow)
    assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert echo.follow_ended.wait(10)


def test_a_stream_goes_no_faster_than_its_caller_reads(gateway):
    channel, echo = gateway.channel, gateway.echo
    many = channel.unary_stream(f"/{SERVICE}/Many")(b"256", timeout=60)
    assert len(next(many)) == CHUNK
    time.sleep(1.0)
    # What HTTP/2's flow control lets each hop hold, not the whole stream: the gateway reads one message at a time.
    assert echo.produced < 64, f"the service produced {echo.produced} MiB for a caller that read 1"
    assert sum(1 for _ in many) == 255


def test_an_upload_and_a_conversation_are_forwarded_message_by_message(gateway):
    channel = gateway.channel
    chunks = [f"part {i};".encode() for i in range(20)]
    assert channel.stream_unary(f"/{SERVICE}/Upload")(iter(chunks), timeout=10) == b"".join(chunks)
    sent: list[bytes] = []
    replies = threading.Semaphore(0)

    def requests() -> Iterator[bytes]:
        for word in (b"one", b"two", b"three"):
            sent.append(word)
            yield word
            assert replies.acquire(timeout=10), "no reply before the next request: the conversation waits"

    chat = channel.stream_stream(f"/{SERVICE}/Chat")(requests(), timeout=30)
    answers = []
    for answer in chat:
        answers.append(answer)
        replies.release()
    assert answers == [b"ONE", b"TWO", b"THREE"]


def test_a_gateway_that_stops_ends_the_streams_it_forwards(gateway):
    follow = gateway.channel.unary_stream(f"/{SERVICE}/Follow")(b"")
    assert next(follow) == b"first"
    started = time.monotonic()
    gateway.server.stop(0.5)
    gateway.forwarding.close()
    assert time.monotonic() - started < 5
    with pytest.raises(grpc.RpcError):
        next(follow)
    assert gateway.echo.follow_ended.wait(10)
    with pytest.raises(grpc.RpcError):  # stopped: nothing more is forwarded
        gateway.channel.unary_unary(f"/{SERVICE}/Unary")(b"late", timeout=5)


def test_streams_go_to_a_service_apart_over_mutual_tls(tmp_path):
    certificates = make_certificates(tmp_path / "tls")
    tls = TlsConfig(
        cert=certificates.server_cert, key=certificates.server_key, client_ca=certificates.ca, ca=certificates.ca
    )
    echo = Echo()
    backend = _backend(echo)
    port = backend.add_secure_port("127.0.0.1:0", server_credentials(tls))
    backend.start()
    forwarding = ForwardingHandler({SERVICE: f"127.0.0.1:{port}"}, SHAPES, Telemetry.off(), tls=tls)
    server = build_server(
        "127.0.0.1:0", [lambda s: s.add_generic_rpc_handlers((forwarding,))], [], telemetry=Telemetry.off()
    ).start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            assert channel.unary_unary(f"/{SERVICE}/Unary")(b"sealed", timeout=10) == b"sealed!"
            many = channel.unary_stream(f"/{SERVICE}/Many")(b"3", timeout=10)
            assert [len(message) for message in many] == [CHUNK] * 3
    finally:
        server.stop(1)
        forwarding.close()
        backend.stop(1).wait()


def test_a_conversation_the_service_ends_first_ends_for_a_caller_still_sending(gateway):
    channel = gateway.channel
    stop = threading.Event()

    def requests() -> Iterator[bytes]:
        yield b"end"
        stop.wait(30)  # the caller would go on; the service has answered and ended

    chat = channel.stream_stream(f"/{SERVICE}/Chat")(requests(), timeout=30)
    started = time.monotonic()
    assert next(chat) == b"END"
    with pytest.raises(StopIteration):
        next(chat)
    stop.set()
    assert time.monotonic() - started < 10
