"""The client's own HTTP/2 connection for unary calls, against a real grpcio server on loopback.

The server here is grpcio's own (its C core speaks the protocol), with handlers that answer what a test needs: a
large message, a slow answer, a status with words to decode, the metadata it received.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures

import grpc
import pytest
from hpack import Encoder
from simrun.v1 import common_pb2, tracker_pb2
from simrun_client import unary
from simrun_client.client import Client
from simrun_client.unary import STATUS_CODE_NAMES, UnaryConnection
from simrun_core.errors import (
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    SimrunError,
    Unauthenticated,
    Unavailable,
)

GET_RUN = "/simrun.v1.RunTrackerService/GetRun"
MAX = 64 * 1024 * 1024


def _get_run(request: tracker_pb2.GetRunRequest, context: grpc.ServicerContext) -> tracker_pb2.GetRunResponse:
    """Answers by the run id: `big:N` a message of N bytes, `slow:S` after S seconds, `fail:CODE:words` that
    status, `metadata` the metadata received, anything else the length of the id it received."""
    what, _, rest = request.run_id.partition(":")
    if what == "big":
        return tracker_pb2.GetRunResponse(run=common_pb2.Run(run_id="big", message="x" * int(rest)))
    if what == "slow":
        time.sleep(float(rest))
    if what == "fail":
        code, _, words = rest.partition(":")
        context.abort(grpc.StatusCode[code], words)
    if what == "metadata":
        received = "\n".join(f"{key}={value}" for key, value in context.invocation_metadata())
        return tracker_pb2.GetRunResponse(run=common_pb2.Run(message=received))
    return tracker_pb2.GetRunResponse(run=common_pb2.Run(run_id=str(len(request.run_id))))


def _serve(port: int = 0, compression: grpc.Compression | None = None) -> tuple[grpc.Server, int]:
    options = [("grpc.max_receive_message_length", MAX), ("grpc.max_send_message_length", MAX)]
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8), options=options, compression=compression)
    handler = grpc.unary_unary_rpc_method_handler(
        _get_run,
        request_deserializer=tracker_pb2.GetRunRequest.FromString,
        response_serializer=tracker_pb2.GetRunResponse.SerializeToString,
    )
    server.add_generic_rpc_handlers(
        [grpc.method_handlers_generic_handler("simrun.v1.RunTrackerService", {"GetRun": handler})]
    )
    bound = server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    return server, bound


@pytest.fixture
def untraced(monkeypatch: pytest.MonkeyPatch) -> None:
    """As in a process that has not loaded OpenTelemetry (the CLI's), whatever the tests before loaded here."""
    monkeypatch.setattr("simrun_core.telemetry_env.may_record", lambda env=None: False)


@pytest.fixture
def served() -> Iterator[int]:
    server, port = _serve()
    yield port
    server.stop(None)


@pytest.fixture
def connect() -> Iterator[Callable[..., UnaryConnection]]:
    """Makes connections (`connect(port, metadata, max_message_bytes)`), closed after the test."""
    made: list[UnaryConnection] = []

    def make(port: int, metadata: list[tuple[str, str]] | None = None, max_message: int = MAX) -> UnaryConnection:
        made.append(UnaryConnection(f"127.0.0.1:{port}", metadata or [], max_message))
        return made[-1]

    yield make
    for connection in made:
        connection.close()


def get_run(connection: UnaryConnection, run_id: str, timeout_s: float | None = 10) -> common_pb2.Run:
    request = tracker_pb2.GetRunRequest(run_id=run_id)
    return connection.call(GET_RUN, request, tracker_pb2.GetRunResponse, timeout_s).run


def test_status_code_names_are_grpcs() -> None:
    assert {name: number for number, name in enumerate(STATUS_CODE_NAMES)} == {
        code.name: code.value[0] for code in grpc.StatusCode
    }


def test_calls_on_one_connection_carry_the_token_never_indexed(
    served: int, connect: Callable[..., UnaryConnection]
) -> None:
    connection = connect(served, [("authorization", "Bearer s3cret")])
    for _ in range(3):  # the second and third calls reuse the connection and HPACK's tables on both sides
        received = dict(line.split("=", 1) for line in get_run(connection, "metadata").message.splitlines())
        assert received["authorization"] == "Bearer s3cret"
        assert received["user-agent"].startswith(unary.USER_AGENT)
    assert get_run(connection, "abc").run_id == "3"
    connection.close()


@pytest.mark.parametrize("size", [0, 20_000, 100_000, 5_000_000])
def test_messages_larger_than_a_frame_and_a_window_come_whole(
    served: int, size: int, connect: Callable[..., UnaryConnection]
) -> None:
    connection = connect(served)
    assert get_run(connection, f"big:{size}").message == "x" * size
    assert get_run(connection, "x" * size).run_id == str(size), "a request past the server's windows is sent whole"


def test_a_status_comes_back_as_its_domain_error_with_its_words(
    served: int, connect: Callable[..., UnaryConnection]
) -> None:
    connection = connect(served)
    cases = [
        ("NOT_FOUND", "no run 'r1': `simrun list` shows the runs", NotFound),
        ("INVALID_ARGUMENT", "100% wrong: é ✓ \u2028 end", InvalidArgument),
        ("FAILED_PRECONDITION", "fits no node", FailedPrecondition),
        ("UNAUTHENTICATED", "unknown bearer token", Unauthenticated),
        ("RESOURCE_EXHAUSTED", "too many runs", ResourceExhausted),
        ("DATA_LOSS", "lost", SimrunError),
    ]
    for code, words, kind in cases:
        with pytest.raises(kind) as raised:
            get_run(connection, f"fail:{code}:{words}")
        assert type(raised.value) is kind and str(raised.value) == words
    assert get_run(connection, "ok").run_id == "2", "a failed call leaves the connection usable"


def test_a_message_past_the_bound_is_refused_both_ways(served: int, connect: Callable[..., UnaryConnection]) -> None:
    connection = connect(served, max_message=50_000)
    answer = tracker_pb2.GetRunResponse(run=common_pb2.Run(run_id="big", message="x" * 100_000)).ByteSize()
    with pytest.raises(ResourceExhausted, match=rf"^Received message larger than max \({answer} vs. 50000\)$"):
        get_run(connection, "big:100000")
    with pytest.raises(ResourceExhausted, match=r"^Sent message larger than max \(60004 vs. 50000\)$"):
        get_run(connection, "x" * 60_000)
    assert get_run(connection, "big:10").message == "x" * 10


def test_a_deadline_past_is_unavailable_and_the_next_call_goes_on(
    served: int, connect: Callable[..., UnaryConnection]
) -> None:
    connection = connect(served)
    begun = time.monotonic()
    with pytest.raises(Unavailable, match=r"^Deadline Exceeded$"):
        get_run(connection, "slow:3", timeout_s=0.3)
    assert time.monotonic() - begun < 2
    assert get_run(connection, "ok").run_id == "2"


def test_a_server_that_accepts_and_never_answers_is_a_deadline(
    served: int, connect: Callable[..., UnaryConnection]
) -> None:
    with socket.create_server(("127.0.0.1", 0)) as silent:
        connection = connect(silent.getsockname()[1])
        with pytest.raises(Unavailable, match=r"^Deadline Exceeded$"):
            get_run(connection, "ok", timeout_s=0.3)


def test_a_server_that_closes_at_once_is_a_lost_connection(connect: Callable[..., UnaryConnection]) -> None:
    with socket.create_server(("127.0.0.1", 0)) as closing:

        def close_at_once() -> None:
            peer, _ = closing.accept()
            peer.close()

        threading.Thread(target=close_at_once, daemon=True).start()
        connection = connect(closing.getsockname()[1])
        with pytest.raises(Unavailable, match="was lost during the call"):
            get_run(connection, "ok")


def test_a_restarted_server_is_reached_again_on_a_new_connection(connect: Callable[..., UnaryConnection]) -> None:
    server, port = _serve()
    connection = connect(port)
    assert get_run(connection, "ok").run_id == "2"
    server.stop(None)
    with pytest.raises(Unavailable, match="connection refused"):
        get_run(connection, "ok")
    server, _ = _serve(port)
    try:
        assert get_run(connection, "again").run_id == "5"
    finally:
        server.stop(None)


def test_threads_share_one_connection(served: int, connect: Callable[..., UnaryConnection]) -> None:
    connection = connect(served)
    with futures.ThreadPoolExecutor(8) as pool:
        sizes = list(pool.map(lambda n: get_run(connection, "x" * n).run_id, range(0, 4000, 50)))
    assert sizes == [str(n) for n in range(0, 4000, 50)]


@pytest.mark.parametrize(
    ("endpoint", "usable"),
    [
        ("127.0.0.1:50551", True),
        ("localhost:1", True),
        ("[::1]:50551", True),
        ("unix:/tmp/s.sock", False),
        ("dns:///example.org:443", False),
        ("example.org", False),
        ("::1", False),
        ("host:0", False),
        ("host:99999", False),
    ],
)
def test_only_a_plain_host_and_port_is_taken(endpoint: str, usable: bool) -> None:
    assert unary.usable(endpoint) is usable


def test_a_proxy_variable_leaves_the_calls_to_grpcio(
    served: int, monkeypatch: pytest.MonkeyPatch, untraced: None
) -> None:
    endpoint = f"127.0.0.1:{served}"
    assert Client(endpoint, "t", quick_start=True)._unary is not None
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.invalid:3128")
    assert not unary.usable(endpoint)
    assert Client(endpoint, "t", quick_start=True)._unary is None


def test_a_client_with_quick_start_answers_as_with_grpcio(served: int, untraced: None) -> None:
    """The same calls through the client, with and without its own connection: the same runs, the same errors."""
    endpoint = f"127.0.0.1:{served}"
    with Client(endpoint, "t", quick_start=True) as quick, Client(endpoint, "t") as channel:
        assert quick._unary is not None and channel._unary is None
        for run_id in ("abc", "big:70000"):
            assert quick.get_run(run_id) == channel.get_run(run_id)
        for run_id in ("fail:NOT_FOUND:no run 'x'", "fail:PERMISSION_DENIED:not yours", "fail:INTERNAL:boom"):
            with pytest.raises(SimrunError) as by_quick:
                quick.get_run(run_id)
            with pytest.raises(SimrunError) as by_channel:
                channel.get_run(run_id)
            assert (type(by_quick.value), str(by_quick.value)) == (type(by_channel.value), str(by_channel.value))
        assert quick._grpc_channel is None, "no call above opened grpcio's channel"
    unreachable = r"^cannot reach simrun at 127.0.0.1:1: start it with `simrun server`$"
    with (
        Client("127.0.0.1:1", "t", quick_start=True, timeout_s=5) as nowhere,
        pytest.raises(Unavailable, match=unreachable),
    ):
        nowhere.get_run("x")
    with socket.create_server(("127.0.0.1", 0)) as silent:
        endpoint = f"127.0.0.1:{silent.getsockname()[1]}"
        with Client(endpoint, "t", quick_start=True, timeout_s=0.3) as stuck, pytest.raises(Unavailable) as late:
            stuck.get_run("x")
        assert str(late.value) == f"simrun at {endpoint} did not answer within 0.3 s; it may be overloaded: try again"


class Peer:
    """A raw HTTP/2 server on loopback that answers each connection by `answer(peer, connection_number)`, for
    what grpcio's server never sends (padding, a GOAWAY or a refusal before the call, a broken frame)."""

    def __init__(self, answer: Callable[[Peer, int], None]) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.answer = answer
        self.sock: socket.socket | None = None
        self.buffer = b""
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        for number in range(1, 4):
            try:
                self.sock, _ = self.listener.accept()
            except OSError:
                return
            self.buffer = b""
            self.encoder = Encoder()
            try:
                assert self._read(len(unary.PREFACE)) == unary.PREFACE
                self.answer(self, number)
            except (EOFError, OSError):
                pass
            finally:
                self.sock.close()

    def _read(self, size: int) -> bytes:
        assert self.sock is not None
        while len(self.buffer) < size:
            piece = self.sock.recv(65_536)
            if not piece:
                raise EOFError
            self.buffer += piece
        taken, self.buffer = self.buffer[:size], self.buffer[size:]
        return taken

    def read_request(self) -> int:
        """Reads frames up to the request's last DATA frame; the request's stream."""
        while True:
            head = self._read(9)
            self._read(int.from_bytes(head[:3], "big"))
            if head[3] == unary.DATA and head[4] & unary.END_STREAM:
                return int.from_bytes(head[5:9], "big")

    def send(self, kind: int, flags: int, stream: int, payload: bytes) -> None:
        assert self.sock is not None
        self.sock.sendall(len(payload).to_bytes(3, "big") + bytes((kind, flags)) + stream.to_bytes(4, "big") + payload)

    def answer_ok(self, stream: int, message: bytes, *, padded: bool = False) -> None:
        """Headers (with a priority), the message (padded if asked), then OK trailers."""
        headers = self.encoder.encode([(":status", "200"), ("content-type", "application/grpc")])
        self.send(unary.HEADERS, unary.END_HEADERS | unary.PRIORITY, stream, b"\0\0\0\0\x10" + headers)
        body = b"\0" + len(message).to_bytes(4, "big") + message
        if padded:
            self.send(unary.DATA, unary.PADDED, stream, b"\x07" + body + b"\0" * 7)
        else:
            self.send(unary.DATA, 0, stream, body)
        self.send(
            unary.HEADERS, unary.END_HEADERS | unary.END_STREAM, stream, self.encoder.encode([("grpc-status", "0")])
        )

    def close(self) -> None:
        self.listener.close()


def _run_message(run_id: str) -> bytes:
    return tracker_pb2.GetRunResponse(run=common_pb2.Run(run_id=run_id)).SerializeToString()


def test_a_call_the_server_did_not_take_is_sent_again_on_a_new_connection(
    connect: Callable[..., UnaryConnection],
) -> None:
    """A GOAWAY below the call's stream, or a REFUSED_STREAM, says the server never took it: sent once more."""

    def goaway_first(peer: Peer, number: int) -> None:
        stream = peer.read_request()
        if number == 1:
            peer.send(unary.GOAWAY, 0, 0, (0).to_bytes(4, "big") + (0).to_bytes(4, "big"))
            time.sleep(0.5)
        else:
            peer.answer_ok(stream, _run_message(f"taken on connection {number}"))
            time.sleep(0.5)

    def refused_first(peer: Peer, number: int) -> None:
        stream = peer.read_request()
        if number == 1:
            peer.send(unary.RST_STREAM, 0, stream, unary.REFUSED_STREAM.to_bytes(4, "big"))
            time.sleep(0.5)
        else:
            peer.answer_ok(stream, _run_message(f"taken on connection {number}"), padded=True)
            time.sleep(0.5)

    for answer in (goaway_first, refused_first):
        peer = Peer(answer)
        try:
            assert get_run(connect(peer.port), "x").run_id == "taken on connection 2"
        finally:
            peer.close()


def test_a_peer_breaking_http2_is_an_error_not_a_hang(connect: Callable[..., UnaryConnection]) -> None:
    def tiny_frames(peer: Peer, number: int) -> None:
        peer.send(unary.SETTINGS, 0, 0, unary.MAX_FRAME_SIZE.to_bytes(2, "big") + (0).to_bytes(4, "big"))
        peer.read_request()
        time.sleep(1)

    def bad_padding(peer: Peer, number: int) -> None:
        stream = peer.read_request()
        peer.send(unary.DATA, unary.PADDED, stream, b"\xff" + b"\0" * 10)
        time.sleep(1)

    def not_a_message(peer: Peer, number: int) -> None:
        peer.answer_ok(peer.read_request(), b"\xff\xff\xff")
        time.sleep(1)

    cases = [
        (tiny_frames, "broke HTTP/2: a largest frame of 0 bytes"),
        (bad_padding, "broke HTTP/2: padding longer than its frame"),
        (not_a_message, "^Exception deserializing response!$"),
    ]
    for answer, words in cases:
        peer = Peer(answer)
        try:
            with pytest.raises(SimrunError, match=words):
                get_run(connect(peer.port), "x", timeout_s=5)
        finally:
            peer.close()


def test_a_compressed_answer_is_read(connect: Callable[..., UnaryConnection]) -> None:
    """grpcio's server compresses where it is told to, whatever the client asked: gzip and deflate are read."""
    for compression in (grpc.Compression.Gzip, grpc.Compression.Deflate):
        server, port = _serve(compression=compression)
        try:
            assert get_run(connect(port), "big:300000").message == "x" * 300_000
        finally:
            server.stop(None)


def test_a_socket_numbered_past_1024_is_used_alike(served: int, connect: Callable[..., UnaryConnection]) -> None:
    """A process holding many files (past what `select` takes) makes its calls as any other."""
    import resource

    if resource.getrlimit(resource.RLIMIT_NOFILE)[0] < 1200:
        pytest.skip("this process may not open 1,200 files")
    held = [open(os.devnull) for _ in range(1100)]  # noqa: SIM115
    try:
        connection = connect(served)
        assert [get_run(connection, "abc").run_id for _ in range(3)] == ["3"] * 3
    finally:
        for handle in held:
            handle.close()
