"""Bearer-token authentication: a server interceptor that puts the caller's identity where servicers find it."""

from __future__ import annotations

import argparse
import contextvars
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc

from simrun_core.errors import SimrunError, Unauthenticated
from simrun_core.identity import Identity, TokenRegistry
from simrun_core.rpc.errors import status_code

AUTHORIZATION = "authorization"
_PUBLIC_PREFIXES = ("/grpc.health.v1.Health/",)
_identity: contextvars.ContextVar[Identity | None] = contextvars.ContextVar("simrun_identity", default=None)


UNAUTHENTICATED_REFUSAL = (
    "serving without tokens lets every process of this machine call it as the server itself (a task's pods reach "
    "loopback too): give {option} (the server's tokens.yaml), or --no-auth where only trusted code runs"
)


def add_token_arguments(parser: argparse.ArgumentParser) -> None:
    """The authentication options of a service's `__main__`: --tokens, --no-auth."""
    parser.add_argument(
        "--tokens", type=Path, help="tokens file (the server's tokens.yaml): every call but health needs a token"
    )
    add_no_auth_argument(parser)


def add_no_auth_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--no-auth", action="store_true", help="serve without tokens: any local process calls it as the server"
    )


def tokens_from_arguments(
    parser: argparse.ArgumentParser, args: argparse.Namespace, tokens: Path | None = None, option: str = "--tokens FILE"
) -> TokenRegistry | None:
    """The registry of `--tokens` (or `tokens`, a config's); a usage error without one unless `--no-auth`.

    A service alone without authentication serves any caller as the server itself (a call without an identity
    passes every check): a pod of a local server, which may open connections to loopback, could then read every
    run or write the learner. So it takes an explicit `--no-auth`.
    """
    path = tokens if tokens is not None else getattr(args, "tokens", None)
    if path is None:
        if not args.no_auth:
            parser.error(UNAUTHENTICATED_REFUSAL.format(option=option))
        return None
    return TokenRegistry.load(path)


def current_identity() -> Identity:
    """The identity of the request being served; `Unauthenticated` outside an authenticated request."""
    identity = _identity.get()
    if identity is None:
        raise Unauthenticated("this request carries no authenticated identity")
    return identity


def caller_identity() -> Identity | None:
    """The identity of the request being served, or None on a server without authentication (tests, a trusted
    service alone); a servicer's authorization passes such calls."""
    return _identity.get()


def bearer_metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    """The call metadata that carries a bearer token."""
    return ((AUTHORIZATION, f"Bearer {token}"),) if token else ()


def _token(metadata: Any) -> str | None:
    for key, value in metadata or ():
        if key == AUTHORIZATION and isinstance(value, str) and value.startswith("Bearer "):
            return value.removeprefix("Bearer ").strip()
    return None


class _CallsInFlight:
    """The calls each identity has open (streams while open), bounded for all but the owner and services.

    The server serves a fixed number of calls at once (`max_concurrent_calls`): without a share per identity, one
    agent holding that many watches or followed logs would leave every other identity RESOURCE_EXHAUSTED.
    """

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self._open: dict[str, int] = {}
        self._lock = threading.Lock()

    def enter(self, identity: Identity) -> bool:
        """Counts a call of `identity`; False (nothing counted) when it has `limit` open already."""
        if self.limit is None or identity.is_owner or identity.is_service:
            return True
        with self._lock:
            held = self._open.get(identity.name, 0)
            if held >= self.limit:
                return False
            self._open[identity.name] = held + 1
            return True

    def leave(self, identity: Identity) -> None:
        if self.limit is None or identity.is_owner or identity.is_service:
            return
        with self._lock:
            held = self._open.get(identity.name, 0) - 1
            if held > 0:
                self._open[identity.name] = held
            else:
                self._open.pop(identity.name, None)


class AuthInterceptor(grpc.ServerInterceptor):
    """Refuses a call without a known bearer token (UNAUTHENTICATED) and serves it with its identity set.

    With `calls_per_identity`, an identity other than the owner or a service with that many calls open has one
    more refused at once with RESOURCE_EXHAUSTED (`limits.calls_per_identity`).
    """

    def __init__(self, registry: TokenRegistry, calls_per_identity: int | None = None) -> None:
        self._registry = registry
        self._calls = _CallsInFlight(calls_per_identity)

    def intercept_service(self, continuation: Callable[..., Any], handler_call_details: Any) -> Any:
        handler = continuation(handler_call_details)
        if handler is None or handler_call_details.method.startswith(_PUBLIC_PREFIXES):
            return handler
        registry = self._registry
        calls = self._calls

        def authenticate(context: grpc.ServicerContext) -> Identity:
            try:
                identity = registry.authenticate(_token(context.invocation_metadata()))
            except SimrunError as exc:
                context.abort(status_code(exc), str(exc))
                raise  # unreachable: abort raises
            if not calls.enter(identity):
                context.abort(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"{identity.name} has {calls.limit} calls open, the most one identity may "
                    "(limits.calls_per_identity): close some (watches, followed logs) and call again",
                )
            return identity

        def unary(fn: Callable[..., Any]) -> Callable[..., Any]:
            def wrapper(request: Any, context: grpc.ServicerContext) -> Any:
                identity = authenticate(context)
                token = _identity.set(identity)
                try:
                    return fn(request, context)
                finally:
                    _identity.reset(token)
                    calls.leave(identity)

            return wrapper

        def stream(fn: Callable[..., Any]) -> Callable[..., Any]:
            def wrapper(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
                identity = authenticate(context)
                try:
                    yield from _serve_stream(fn, request, context, identity)
                finally:
                    calls.leave(identity)

            return wrapper

        def _serve_stream(
            fn: Callable[..., Any], request: Any, context: grpc.ServicerContext, identity: Identity
        ) -> Iterator[Any]:
            # The identity is set around each step of the handler only: the thread may serve others between.
            token = _identity.set(identity)
            try:
                responses = iter(fn(request, context))
            finally:
                _identity.reset(token)
            try:
                while True:
                    token = _identity.set(identity)
                    try:
                        item = next(responses)
                    except StopIteration:
                        return
                    finally:
                        _identity.reset(token)
                    yield item
            finally:
                close = getattr(responses, "close", None)
                if close is not None:
                    close()

        if handler.unary_unary:
            return handler._replace(unary_unary=unary(handler.unary_unary))
        if handler.stream_unary:
            return handler._replace(stream_unary=unary(handler.stream_unary))
        if handler.unary_stream:
            return handler._replace(unary_stream=stream(handler.unary_stream))
        if handler.stream_stream:
            return handler._replace(stream_stream=stream(handler.stream_stream))
        return handler
