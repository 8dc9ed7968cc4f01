"""gRPC unary calls over a plaintext HTTP/2 connection of the client's own, without grpcio.

A command that makes a call or two and ends (`simrun status`, `simrun whoami`) would spend more time importing
grpcio (0.14 s on this machine's cores, asyncio with it) than on everything else it does. This module speaks the
part of gRPC's wire protocol such a call needs, on one connection, one call at a time: HTTP/2 frames, the headers
in HPACK (by `hpack`), the length-prefixed message, the status in the trailers. TLS, tracing, streams and uploads
stay with grpcio's channel (`simrun_client.channel`).
"""

from __future__ import annotations

import os
import socket
import threading
import time
import zlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, TypeVar, cast
from urllib.parse import unquote_to_bytes

from google.protobuf.message import DecodeError
from hpack import Decoder, Encoder, HPACKError, NeverIndexedHeaderTuple, OversizedHeaderListError
from simrun_core.errors import ResourceExhausted, SimrunError, Unavailable, error_for_status

if TYPE_CHECKING:
    from google.protobuf.message import Message

M = TypeVar("M", bound="Message")

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = 0, 1, 3, 4, 5, 6, 7, 8, 9
END_STREAM = ACK = 0x1
END_HEADERS, PADDED, PRIORITY = 0x4, 0x8, 0x20
HEADER_TABLE_SIZE, ENABLE_PUSH, INITIAL_WINDOW_SIZE, MAX_FRAME_SIZE = 1, 2, 4, 5
REFUSED_STREAM, CANCEL, ENHANCE_YOUR_CALM = 0x7, 0x8, 0xB
DEFAULT_WINDOW = 65_535
DEFAULT_FRAME = 16_384
"""The largest frame either side may send until the other's SETTINGS says more (simrun's never says more)."""
LARGEST_WINDOW = 2**31 - 1

STATUS_CODE_NAMES = (
    "OK",
    "CANCELLED",
    "UNKNOWN",
    "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "ABORTED",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "INTERNAL",
    "UNAVAILABLE",
    "DATA_LOSS",
    "UNAUTHENTICATED",
)
"""gRPC's status codes by number (a test keeps them equal to grpcio's)."""

HTTP_STATUS_CODES = {
    "400": "INTERNAL",
    "401": "UNAUTHENTICATED",
    "403": "PERMISSION_DENIED",
    "404": "UNIMPLEMENTED",
    "429": "UNAVAILABLE",
    "502": "UNAVAILABLE",
    "503": "UNAVAILABLE",
    "504": "UNAVAILABLE",
}
"""What an HTTP status other than 200 without a gRPC status means (gRPC's http-grpc-status-mapping)."""

PROXY_VARIABLES = ("grpc_proxy", "https_proxy", "http_proxy")
"""The variables by which grpcio goes through a proxy; with one set, calls stay with grpcio."""

USER_AGENT = "simrun-client (unary over HTTP/2)"


def usable(endpoint: str) -> bool:
    """Whether `endpoint` is a plain `host:port` (no `unix:` or `dns:///` target) that grpcio would reach directly
    (no proxy variable set): where this connection and grpcio's channel reach the same server."""
    if any(os.environ.get(name) or os.environ.get(name.upper()) for name in PROXY_VARIABLES):
        return False
    return _host_port(endpoint) is not None


def _host_port(endpoint: str) -> tuple[str, int] | None:
    host, colon, port = endpoint.rpartition(":")
    if not colon or not host or "/" in endpoint or not port.isdigit() or not 0 < int(port) < 65536:
        return None
    if host.startswith("["):
        return (host[1:-1], int(port)) if host.endswith("]") else None
    return None if ":" in host else (host, int(port))


class _NotTaken(Exception):
    """The server closed the connection before taking the call (GOAWAY below its stream): safe to send again."""


class _Exchange:
    """One call's stream as its frames arrive: the headers, the message's bytes, the trailers, the window."""

    def __init__(self, stream: int, window: int) -> None:
        self.stream = stream
        self.window = window
        self.headers: dict[str, str] | None = None
        self.trailers: dict[str, str] | None = None
        self.data = bytearray()
        self.reset: int | None = None
        self.ended = False


class UnaryConnection:
    """A plaintext HTTP/2 connection to a gRPC server that makes unary calls one at a time.

    It connects at the first call, is reused by the next ones, and connects again when the server has closed it
    between calls. Failures come back as the domain errors grpcio's channel gives through
    `simrun_core.rpc.errors` (a server that cannot be reached, a deadline past: `Unavailable`).

    Args:
        endpoint: `host:port` of the server (see `usable`).
        metadata: headers sent on every call (the bearer token as `authorization`, never indexed by HPACK).
        max_message_bytes: the largest message sent or received, as grpcio's channel options bound it.
    """

    def __init__(self, endpoint: str, metadata: Sequence[tuple[str, str]], max_message_bytes: int) -> None:
        address = _host_port(endpoint)
        if address is None:
            raise ValueError(f"not a host:port endpoint: {endpoint!r}")
        self.endpoint = endpoint
        self._address = address
        self._metadata = [
            NeverIndexedHeaderTuple(name, value) if name == "authorization" else (name, value)
            for name, value in metadata
        ]
        self._max_message = max_message_bytes
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._fresh()

    def _fresh(self) -> None:
        """The state of a new connection: HTTP/2's defaults until the server's SETTINGS say otherwise."""
        self._buffer = bytearray()
        self._encoder = Encoder()
        self._decoder = Decoder()
        self._next_stream = 1
        self._send_window = self._peer_window = DEFAULT_WINDOW
        self._peer_frame = DEFAULT_FRAME
        self._received = 0
        self._going_away: int | None = None

    def call(self, path: str, request: Message, response_type: type[M], timeout_s: float | None) -> M:
        """Calls the unary method `path` (`/simrun.v1.RunTrackerService/GetRun`) and returns its response.

        Raises:
            SimrunError: the call's status as its domain error; `Unavailable` for a server that cannot be reached,
                a connection lost during the call or a deadline past.
        """
        payload = request.SerializeToString()
        if len(payload) > self._max_message:
            raise ResourceExhausted(f"Sent message larger than max ({len(payload)} vs. {self._max_message})")
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._lock:
            for attempt in (1, 2):
                try:
                    exchange = self._exchange(path, payload, deadline)
                except _NotTaken:
                    self._close()
                    if attempt == 2:
                        raise Unavailable(f"simrun at {self.endpoint} is going away: try again") from None
                    continue
                except BaseException:
                    self._close()
                    raise
                return self._response(exchange, response_type)
        raise AssertionError("unreachable")

    def close(self) -> None:
        with self._lock:
            self._close()

    def _close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def _exchange(self, path: str, payload: bytes, deadline: float | None) -> _Exchange:
        """Sends the call on the connection (made or made again if need be) and reads its stream to its end."""
        if self._sock is not None and not self._idle_and_open():
            self._close()
        if self._sock is None:
            self._connect(deadline)
        exchange = _Exchange(self._next_stream, self._peer_window)
        self._next_stream += 2
        self._send_headers(exchange.stream, path, deadline)
        self._send_message(exchange, b"\0" + len(payload).to_bytes(4, "big") + payload, deadline)
        while not exchange.ended:
            self._process(self._read_frame(deadline), exchange, deadline)
        if exchange.reset == REFUSED_STREAM and exchange.trailers is None:
            raise _NotTaken
        # The answer is in: giving the server back its window must not fail the call (not even past its
        # deadline); a connection that cannot take the frame is made anew at the next call.
        try:
            if self._received:
                self._send_frame(WINDOW_UPDATE, 0, 0, self._received.to_bytes(4, "big"), None)
                self._received = 0
        except SimrunError:
            self._close()
        return exchange

    # The connection.

    def _connect(self, deadline: float | None) -> None:
        host, port = self._address
        try:
            sock = socket.create_connection((host, port), timeout=_remaining(deadline))
        except TimeoutError as exc:
            if exc.errno is None:  # the deadline, not the kernel's own connect timeout
                raise _deadline_exceeded() from None
            raise Unavailable(f"failed to connect to {self.endpoint}: {exc.strerror}") from None
        except socket.gaierror as exc:
            raise Unavailable(f"DNS resolution failed for {host}: {exc.strerror}") from None
        except UnicodeError:
            raise Unavailable(f"DNS resolution failed for {host}: not a host name") from None
        except ConnectionRefusedError:
            raise Unavailable(f"failed to connect to {self.endpoint}: connection refused") from None
        except OSError as exc:
            raise Unavailable(f"failed to connect to {self.endpoint}: {exc.strerror or exc}") from None
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._sock = sock
        self._fresh()
        settings = b"".join(
            key.to_bytes(2, "big") + value.to_bytes(4, "big")
            for key, value in ((ENABLE_PUSH, 0), (INITIAL_WINDOW_SIZE, LARGEST_WINDOW))
        )
        # Windows as large as HTTP/2 allows: a response never waits for this side to make room.
        self._send_all(
            PREFACE
            + _frame(SETTINGS, 0, 0, settings)
            + _frame(WINDOW_UPDATE, 0, 0, (LARGEST_WINDOW - DEFAULT_WINDOW).to_bytes(4, "big")),
            deadline,
        )

    def _idle_and_open(self) -> bool:
        """Reads what the server sent since the last call (a PING, SETTINGS, GOAWAY, or the end of the
        connection) without waiting; whether the connection can take another call."""
        assert self._sock is not None
        try:
            self._sock.setblocking(False)
            try:
                while piece := self._sock.recv(65_536):
                    self._buffer += piece
                return False  # the server closed the connection
            except BlockingIOError:
                pass
            finally:
                self._sock.setblocking(True)
            while len(self._buffer) >= 9 and len(self._buffer) >= 9 + int.from_bytes(self._buffer[:3], "big"):
                if self._buffer[3] == HEADERS or self._buffer[3] == CONTINUATION:
                    return False  # no call's headers belong between calls
                self._process(self._read_frame(None), None, None)
        except (OSError, SimrunError):
            return False
        return self._going_away is None

    def _send_all(self, data: bytes, deadline: float | None) -> None:
        assert self._sock is not None
        self._sock.settimeout(_remaining(deadline))
        try:
            self._sock.sendall(data)
        except TimeoutError:
            raise _deadline_exceeded() from None
        except OSError as exc:
            raise self._lost(exc) from None

    def _send_frame(self, kind: int, flags: int, stream: int, payload: bytes, deadline: float | None = None) -> None:
        self._send_all(_frame(kind, flags, stream, payload), deadline)

    def _read_frame(self, deadline: float | None) -> tuple[int, int, int, bytes]:
        """The next frame: (type, flags, stream, payload)."""
        self._fill(9, deadline)
        length = int.from_bytes(self._buffer[:3], "big")
        if length > DEFAULT_FRAME:
            raise SimrunError(f"simrun at {self.endpoint} sent a frame of {length} bytes, past HTTP/2's bound")
        self._fill(9 + length, deadline)
        kind, flags = self._buffer[3], self._buffer[4]
        stream = int.from_bytes(self._buffer[5:9], "big") & LARGEST_WINDOW
        payload = bytes(self._buffer[9 : 9 + length])
        del self._buffer[: 9 + length]
        return kind, flags, stream, payload

    def _fill(self, size: int, deadline: float | None) -> None:
        assert self._sock is not None
        while len(self._buffer) < size:
            self._sock.settimeout(_remaining(deadline))
            try:
                piece = self._sock.recv(max(65_536, size - len(self._buffer)))
            except TimeoutError:
                raise _deadline_exceeded() from None
            except OSError as exc:
                raise self._lost(exc) from None
            if not piece:
                raise self._lost(None)
            self._buffer += piece

    def _unpadded(self, flags: int, payload: bytes) -> bytes:
        if not flags & PADDED:
            return payload
        if not payload or payload[0] >= len(payload):
            raise self._broke("padding longer than its frame")
        return payload[1 : len(payload) - payload[0]]

    def _broke(self, what: str) -> SimrunError:
        return SimrunError(f"simrun at {self.endpoint} broke HTTP/2: {what}")

    def _lost(self, exc: OSError | None) -> Unavailable:
        why = f": {exc.strerror or exc}" if exc is not None else ""
        return Unavailable(f"the connection to simrun at {self.endpoint} was lost during the call{why}: try again")

    # The call.

    def _send_headers(self, stream: int, path: str, deadline: float | None) -> None:
        headers = [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", path),
            (":authority", self.endpoint),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
            ("user-agent", USER_AGENT),
        ]
        if deadline is not None:
            headers.append(("grpc-timeout", _grpc_timeout(deadline - time.monotonic())))
        block = self._encoder.encode([*headers, *self._metadata])
        pieces = [block[i : i + self._peer_frame] for i in range(0, len(block), self._peer_frame)] or [b""]
        frames = [
            _frame(HEADERS if i == 0 else CONTINUATION, END_HEADERS if i == len(pieces) - 1 else 0, stream, piece)
            for i, piece in enumerate(pieces)
        ]
        self._send_all(b"".join(frames), deadline)

    def _send_message(self, exchange: _Exchange, message: bytes, deadline: float | None) -> None:
        """Sends the message in DATA frames within the server's windows, reading its frames while they are full;
        stops early when the server ends the call first (a refusal before it read the request)."""
        view = memoryview(message)
        sent = 0
        while sent < len(message) and not exchange.ended:
            room = min(self._send_window, exchange.window, self._peer_frame, len(message) - sent)
            if room <= 0:
                self._process(self._read_frame(deadline), exchange, deadline)
                continue
            last = sent + room == len(message)
            self._send_frame(
                DATA, END_STREAM if last else 0, exchange.stream, bytes(view[sent : sent + room]), deadline
            )
            sent += room
            self._send_window -= room
            exchange.window -= room
        if sent < len(message) and exchange.reset is None:
            self._send_frame(RST_STREAM, 0, exchange.stream, CANCEL.to_bytes(4, "big"), deadline)

    def _process(self, frame: tuple[int, int, int, bytes], exchange: _Exchange | None, deadline: float | None) -> None:
        """Takes one frame: the call's own, or the connection's (SETTINGS, PING, WINDOW_UPDATE, GOAWAY)."""
        kind, flags, stream, payload = frame
        ours = exchange is not None and stream == exchange.stream
        if kind == DATA:
            self._received += len(payload)
            if ours:
                assert exchange is not None
                exchange.data += self._unpadded(flags, payload)
                # The message's length prefix says its size before it all arrived; more than one message is
                # refused in `_response`, but not held past the bound meanwhile.
                declared = int.from_bytes(exchange.data[1:5], "big") if len(exchange.data) >= 5 else 0
                if max(declared, len(exchange.data) - 5) > self._max_message:
                    size = max(declared, len(exchange.data) - 5)
                    raise ResourceExhausted(f"Received message larger than max ({size} vs. {self._max_message})")
                exchange.ended = exchange.ended or bool(flags & END_STREAM)
        elif kind == HEADERS:
            block = self._unpadded(flags, payload)
            if flags & PRIORITY:
                block = block[5:]
            while not flags & END_HEADERS:
                kind, flags, _, more = self._read_frame(deadline)
                if kind != CONTINUATION:
                    raise self._broke("headers without their end")
                block += more
            try:
                # Decoded to text (`raw=False`), whatever hpack's annotation says.
                fields = cast(dict[str, str], dict(self._decoder.decode(block)))
            except OversizedHeaderListError as exc:
                raise ResourceExhausted(f"simrun at {self.endpoint} sent headers past the bound: {exc}") from None
            except HPACKError as exc:
                raise SimrunError(f"simrun at {self.endpoint} sent headers that cannot be read: {exc}") from None
            if ours:
                assert exchange is not None
                if exchange.headers is None:
                    exchange.headers = fields
                    if frame[1] & END_STREAM:
                        exchange.trailers = fields
                else:
                    exchange.trailers = fields
                exchange.ended = exchange.ended or bool(frame[1] & END_STREAM)
        elif kind == RST_STREAM and ours:
            assert exchange is not None
            exchange.reset = int.from_bytes(payload[:4], "big")
            exchange.ended = True
        elif kind == SETTINGS and not flags & ACK:
            for i in range(0, len(payload) - 5, 6):
                key, value = int.from_bytes(payload[i : i + 2], "big"), int.from_bytes(payload[i + 2 : i + 6], "big")
                if key == HEADER_TABLE_SIZE:
                    # Never more than the default: the table holds this side's headers, which need no more.
                    self._encoder.header_table_size = min(value, 4096)
                elif key == INITIAL_WINDOW_SIZE:
                    if value > LARGEST_WINDOW:
                        raise self._broke(f"a window of {value} bytes")
                    if exchange is not None:
                        exchange.window += value - self._peer_window
                    self._peer_window = value
                elif key == MAX_FRAME_SIZE:
                    if not DEFAULT_FRAME <= value < 2**24:
                        raise self._broke(f"a largest frame of {value} bytes")
                    self._peer_frame = value
            self._send_frame(SETTINGS, ACK, 0, b"", deadline)
        elif kind == PING and not flags & ACK:
            self._send_frame(PING, ACK, 0, payload, deadline)
        elif kind == WINDOW_UPDATE:
            increment = int.from_bytes(payload[:4], "big") & LARGEST_WINDOW
            if stream == 0:
                self._send_window += increment
            elif ours:
                assert exchange is not None
                exchange.window += increment
        elif kind == GOAWAY:
            self._going_away = int.from_bytes(payload[:4], "big") & LARGEST_WINDOW
            if exchange is not None and exchange.stream > self._going_away:
                raise _NotTaken
        elif kind in (PUSH_PROMISE, CONTINUATION):
            raise self._broke(f"an unexpected frame of type {kind}")

    def _response(self, exchange: _Exchange, response_type: type[M]) -> M:
        """The call's response, or its status as the domain error."""
        trailers = exchange.trailers or {}
        if "grpc-status" not in trailers:
            if exchange.reset is not None:
                raise _reset_error(self.endpoint, exchange.reset)
            http_status = (exchange.headers or {}).get(":status", "")
            if http_status != "200":
                code = HTTP_STATUS_CODES.get(http_status, "UNKNOWN")
                raise error_for_status(code, f"simrun at {self.endpoint} answered HTTP status {http_status}")
            raise SimrunError(f"simrun at {self.endpoint} ended the call without a gRPC status")
        status = trailers["grpc-status"]
        if status != "0":
            number = int(status) if status.isdigit() else 2
            name = STATUS_CODE_NAMES[number] if number < len(STATUS_CODE_NAMES) else "UNKNOWN"
            details = unquote_to_bytes(trailers.get("grpc-message", "")).decode("utf-8", "replace")
            raise error_for_status(name, details)
        data = exchange.data
        if len(data) < 5 or len(data) != 5 + int.from_bytes(data[1:5], "big"):
            raise SimrunError(f"simrun at {self.endpoint} answered with something other than one whole message")
        message = bytes(data[5:])
        if data[0]:
            message = self._decompressed(message, (exchange.headers or {}).get("grpc-encoding", "identity"))
        try:
            return response_type.FromString(message)
        except DecodeError:
            raise SimrunError("Exception deserializing response!") from None

    def _decompressed(self, message: bytes, encoding: str) -> bytes:
        """A message the server compressed (gzip or deflate, as grpcio's server may), within the bound."""
        if encoding not in ("gzip", "deflate"):
            raise SimrunError(f"simrun at {self.endpoint} compressed its answer with {encoding!r}, unknown here")
        inflater = zlib.decompressobj(16 + zlib.MAX_WBITS if encoding == "gzip" else zlib.MAX_WBITS)
        try:
            plain = inflater.decompress(message, self._max_message + 1)
        except zlib.error as exc:
            raise SimrunError(
                f"simrun at {self.endpoint} sent a compressed answer that cannot be read: {exc}"
            ) from None
        if len(plain) > self._max_message:
            raise ResourceExhausted(f"Received message larger than max (more than {self._max_message} bytes)")
        return plain


def _frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    return len(payload).to_bytes(3, "big") + bytes((kind, flags)) + stream.to_bytes(4, "big") + payload


def _remaining(deadline: float | None) -> float | None:
    if deadline is None:
        return None
    left = deadline - time.monotonic()
    if left <= 0:
        raise _deadline_exceeded()
    return left


def _deadline_exceeded() -> SimrunError:
    return error_for_status("DEADLINE_EXCEEDED", "Deadline Exceeded")


def _grpc_timeout(seconds: float) -> str:
    """The `grpc-timeout` header: at most 8 digits and a unit."""
    millis = max(1, int(seconds * 1000))
    return f"{millis}m" if millis < 10**8 else f"{max(1, int(seconds))}S"


def _reset_error(endpoint: str, code: int) -> SimrunError:
    """A stream reset as grpcio reports it: refused (never taken) is worth trying again, a cancel is not."""
    if code == REFUSED_STREAM:
        return Unavailable(f"simrun at {endpoint} refused the call: try again")
    if code == ENHANCE_YOUR_CALM:
        return ResourceExhausted(f"simrun at {endpoint} asked to slow down (ENHANCE_YOUR_CALM)")
    return SimrunError(f"simrun at {endpoint} reset the call (HTTP/2 error {code})")
