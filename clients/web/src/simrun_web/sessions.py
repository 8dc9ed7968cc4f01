"""Who is logged in to the web view: one-time login links, sessions behind a cookie, and their CSRF secrets.

A session holds the bearer token of the person (or agent) who logged in, on the server only: the browser holds a
random session id in an HttpOnly cookie, so the token never stays in a URL, a page or a script's reach. Every call a
page makes goes through the session's own gRPC client, so the gateway decides what that identity sees and may do.
"""

from __future__ import annotations

import hmac
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from simrun.v1 import common_pb2
from simrun_client.client import Client
from simrun_core.errors import ResourceExhausted, Unauthenticated

LINK_TTL_S = 120.0
"""How long a one-time login link stays good: long enough to open a browser, short enough not to linger."""
SESSION_IDLE_S = 12 * 3600.0
"""A session nobody used for this long is ended (the next page asks to log in again)."""
MAX_SESSIONS = 256
MAX_LINKS = 64


@dataclass
class Session:
    """A logged-in browser: its identity, its client of the gateway and the secret its forms carry."""

    session_id: str
    identity: common_pb2.Identity
    client: Client
    csrf: str
    last_used: float = field(default_factory=time.monotonic)

    def csrf_ok(self, given: str | None) -> bool:
        """Whether a form's CSRF field is this session's secret (compared in constant time)."""
        return bool(given) and hmac.compare_digest(given.encode(), self.csrf.encode())  # type: ignore[union-attr]


@dataclass
class _Link:
    token: str
    expires: float


class Sessions:
    """The sessions and one-time links of one web server, bounded in number, safe to use from any thread.

    Args:
        connect: makes a client of the gateway for a token (the web view's endpoint and transport).
    """

    def __init__(self, connect: Callable[[str], Client], *, clock: Callable[[], float] = time.monotonic) -> None:
        self._connect = connect
        self._clock = clock
        self._lock = threading.Lock()
        self._sessions: dict[str, Session] = {}
        self._links: dict[str, _Link] = {}

    def login(self, token: str) -> Session:
        """A new session for `token`, once the gateway has said whose it is.

        Raises:
            Unauthenticated: the gateway does not know the token.
            ResourceExhausted: the server holds its most sessions, none of them idle.
        """
        token = token.strip()
        if not token:
            raise Unauthenticated("give a token: the one in ~/.simrun/token, or ask the cluster's owner for one")
        client = self._connect(token)
        try:
            identity = client.identity()
        except BaseException:
            client.close()
            raise
        session = Session(secrets.token_urlsafe(32), identity, client, secrets.token_urlsafe(32), self._clock())
        with self._lock:
            self._expire()
            if len(self._sessions) >= MAX_SESSIONS:
                client.close()
                raise ResourceExhausted(f"the web view holds {MAX_SESSIONS} sessions: log out of one and try again")
            self._sessions[session.session_id] = session
        return session

    def link(self, token: str) -> str:
        """A one-time code that logs in as `token` once, within `LINK_TTL_S` (the token is checked first).

        Raises:
            Unauthenticated: the gateway does not know the token.
        """
        client = self._connect(token)
        try:
            client.identity()
        finally:
            client.close()
        code = secrets.token_urlsafe(32)
        with self._lock:
            self._expire()
            if len(self._links) >= MAX_LINKS:
                raise ResourceExhausted(f"{MAX_LINKS} login links wait to be opened: open one, or wait a minute")
            self._links[code] = _Link(token, self._clock() + LINK_TTL_S)
        return code

    def redeem(self, code: str) -> Session:
        """The session a one-time link opens; the link is spent whether or not the login succeeds.

        Raises:
            Unauthenticated: the link is unknown, spent or expired.
        """
        with self._lock:
            self._expire()
            link = self._links.pop(code, None)
        if link is None:
            raise Unauthenticated("this login link is spent or expired: run `simrun ui` again for a new one")
        return self.login(link.token)

    def get(self, session_id: str | None) -> Session | None:
        """The live session of a cookie's id, or None."""
        if not session_id:
            return None
        with self._lock:
            self._expire()
            session = self._sessions.get(session_id)
            if session is not None:
                session.last_used = self._clock()
            return session

    def end(self, session_id: str) -> None:
        """Logs a session out: its id stops working and its client closes."""
        with self._lock:
            session = self._sessions.pop(session_id, None)
        if session is not None:
            session.client.close()

    def close(self) -> None:
        """Ends every session (the web server stops)."""
        with self._lock:
            sessions, self._sessions = list(self._sessions.values()), {}
            self._links.clear()
        for session in sessions:
            session.client.close()

    def _expire(self) -> None:
        now = self._clock()
        for code in [c for c, link in self._links.items() if link.expires <= now]:
            del self._links[code]
        for session_id in [s for s, v in self._sessions.items() if now - v.last_used > SESSION_IDLE_S]:
            self._sessions.pop(session_id).client.close()
