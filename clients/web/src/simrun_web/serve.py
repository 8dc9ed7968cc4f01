"""Serving the web view: on a thread of `simrun server`, or alone (`simrun web`), with uvicorn on a socket it binds.

The socket is bound before the view starts, so a taken port is refused at once and port 0 names the port taken.
"""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import uvicorn
from fastapi import FastAPI
from simrun_core.config import DEFAULT_WEB_ADDRESS
from simrun_core.errors import InvalidArgument
from simrun_web.app import WebConfig, create_app


def bind(address: str) -> socket.socket:
    """A listening TCP socket at `HOST:PORT`.

    Raises:
        InvalidArgument: the address is malformed or cannot be listened at, with the reason.
    """
    host, colon, port = address.rpartition(":")
    if not colon or not port.isdigit() or not host:
        raise InvalidArgument(f"--web-address {address!r}: give HOST:PORT, e.g. {DEFAULT_WEB_ADDRESS}")
    host = host.strip("[]")
    try:
        infos = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
        family, kind, proto, _, where = infos[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(where)
        sock.listen(128)
    except OSError as exc:
        raise InvalidArgument(
            f"cannot serve the web view at {address}: {exc.strerror or exc}; another address with --web-address, "
            "or --no-web"
        ) from None
    sock.setblocking(False)
    return sock


class WebServer:
    """The web view on a socket bound at once, served on a thread of its own (`start`) or this one (`run`)."""

    def __init__(self, address: str, *, cert: Path | None = None, key: Path | None = None) -> None:
        self.socket = bind(address)
        self._cert, self._key = cert, key
        host, port = self.socket.getsockname()[:2]
        shown = f"[{host}]" if ":" in host else host
        self.url = f"{'https' if cert else 'http'}://{shown}:{port}"
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self.app: FastAPI | None = None

    def _prepare(self, config: WebConfig) -> uvicorn.Server:
        config.secure_cookie = config.secure_cookie or self._cert is not None
        self.app = create_app(config)
        self._server = uvicorn.Server(
            uvicorn.Config(
                self.app,
                log_level="warning",
                access_log=False,
                ssl_certfile=str(self._cert) if self._cert else None,
                ssl_keyfile=str(self._key) if self._key else None,
                timeout_graceful_shutdown=2,
                lifespan="off",
            )
        )
        return self._server

    def start(self, config: WebConfig) -> None:
        """Serves on a thread of its own until `stop`."""
        server = self._prepare(config)
        self._thread = threading.Thread(
            target=server.run, kwargs={"sockets": [self.socket]}, daemon=True, name="simrun-web"
        )
        self._thread.start()

    def run(self, config: WebConfig) -> None:
        """Serves in this thread until SIGINT or SIGTERM (uvicorn's own handling of them)."""
        try:
            self._prepare(config).run(sockets=[self.socket])
        finally:
            self._close()

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._close()

    def _close(self) -> None:
        if self.app is not None:
            self.app.state.sessions.close()
        self.socket.close()
