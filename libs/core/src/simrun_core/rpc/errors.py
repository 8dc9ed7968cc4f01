"""Maps domain errors to gRPC status codes (server side) and status codes back to domain errors (client side)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import grpc

from simrun_core.errors import SimrunError, error_for_status

log = logging.getLogger(__name__)


def status_code(error: SimrunError) -> grpc.StatusCode:
    return grpc.StatusCode[error.code_name]


def to_domain_error(error: grpc.RpcError) -> SimrunError:
    """Turns a failed call into the typed domain error its status code stands for."""
    code: grpc.StatusCode = error.code()  # type: ignore[attr-defined]
    return error_for_status(code.name, error.details() or "")  # type: ignore[attr-defined]


class ErrorInterceptor(grpc.ServerInterceptor):
    """Turns a `SimrunError` into its status code with its message; anything else into INTERNAL, logged.

    `translate` maps a domain's own exception types (e.g. the planner's `PlanError`, a `ValueError` by its
    specification) to the `SimrunError` class whose status code they stand for.
    """

    def __init__(self, translate: Mapping[type[Exception], type[SimrunError]] | None = None) -> None:
        self._translate = dict(translate or {})

    def intercept_service(self, continuation: Callable[..., Any], handler_call_details: Any) -> Any:
        handler = continuation(handler_call_details)
        if handler is None:
            return None
        method = handler_call_details.method
        if handler.unary_unary:
            return handler._replace(unary_unary=_wrap_unary(handler.unary_unary, method, self._translate))
        if handler.unary_stream:
            return handler._replace(unary_stream=_wrap_stream(handler.unary_stream, method, self._translate))
        if handler.stream_unary:
            return handler._replace(stream_unary=_wrap_unary(handler.stream_unary, method, self._translate))
        if handler.stream_stream:
            return handler._replace(stream_stream=_wrap_stream(handler.stream_stream, method, self._translate))
        return handler


Translate = dict[type[Exception], type[SimrunError]]


def _abort(context: grpc.ServicerContext, exc: Exception, method: str, translate: Translate) -> None:
    for source, target in translate.items():
        if isinstance(exc, source):
            exc = target(str(exc))
            break
    if isinstance(exc, SimrunError):
        context.abort(status_code(exc), str(exc))
    log.exception("internal error in %s", method)
    context.abort(grpc.StatusCode.INTERNAL, f"internal error in {method}: {type(exc).__name__}: {exc}")


def _wrap_unary(fn: Callable[..., Any], method: str, translate: Translate) -> Callable[..., Any]:
    def wrapper(request: Any, context: grpc.ServicerContext) -> Any:
        try:
            return fn(request, context)
        except Exception as exc:
            if _aborted(context):
                raise
            _abort(context, exc, method, translate)

    return wrapper


def _wrap_stream(fn: Callable[..., Any], method: str, translate: Translate) -> Callable[..., Any]:
    def wrapper(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        try:
            yield from fn(request, context)
        except Exception as exc:
            if _aborted(context):
                raise
            _abort(context, exc, method, translate)

    return wrapper


def _aborted(context: grpc.ServicerContext) -> bool:
    # context.abort raises a bare Exception after setting the status; let it through untouched.
    return context.code() is not None


__all__ = ["ErrorInterceptor", "status_code", "to_domain_error"]
