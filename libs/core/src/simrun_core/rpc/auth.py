"""Bearer-token authentication: a server interceptor that puts the caller's identity where servicers find it."""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Iterator
from typing import Any

import grpc

from simrun_core.errors import SimrunError, Unauthenticated
from simrun_core.identity import Identity, TokenRegistry
from simrun_core.rpc.errors import status_code

AUTHORIZATION = "authorization"
_PUBLIC_PREFIXES = ("/grpc.health.v1.Health/",)
_identity: contextvars.ContextVar[Identity | None] = contextvars.ContextVar("simrun_identity", default=None)


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


class AuthInterceptor(grpc.ServerInterceptor):
    """Refuses a call without a known bearer token (UNAUTHENTICATED) and serves it with its identity set."""

    def __init__(self, registry: TokenRegistry) -> None:
        self._registry = registry

    def intercept_service(self, continuation: Callable[..., Any], handler_call_details: Any) -> Any:
        handler = continuation(handler_call_details)
        if handler is None or handler_call_details.method.startswith(_PUBLIC_PREFIXES):
            return handler
        registry = self._registry

        def authenticate(context: grpc.ServicerContext) -> Identity:
            try:
                return registry.authenticate(_token(context.invocation_metadata()))
            except SimrunError as exc:
                context.abort(status_code(exc), str(exc))
                raise  # unreachable: abort raises

        def unary(fn: Callable[..., Any]) -> Callable[..., Any]:
            def wrapper(request: Any, context: grpc.ServicerContext) -> Any:
                token = _identity.set(authenticate(context))
                try:
                    return fn(request, context)
                finally:
                    _identity.reset(token)

            return wrapper

        def stream(fn: Callable[..., Any]) -> Callable[..., Any]:
            def wrapper(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
                identity = authenticate(context)
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

            return wrapper

        if handler.unary_unary:
            return handler._replace(unary_unary=unary(handler.unary_unary))
        if handler.stream_unary:
            return handler._replace(stream_unary=unary(handler.stream_unary))
        if handler.unary_stream:
            return handler._replace(unary_stream=stream(handler.unary_stream))
        if handler.stream_stream:
            return handler._replace(stream_stream=stream(handler.stream_stream))
        return handler
