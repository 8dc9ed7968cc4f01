"""The domain errors of simrun: one hierarchy, mapped to gRPC status codes in one place (rpc.errors), and each
with the HTTP status the web view answers it with."""

from __future__ import annotations


class SimrunError(Exception):
    """A failure a caller can act on; its message is one line that says what to fix."""

    code_name = "INTERNAL"
    http_status = 500
    transient = False
    """Whether trying again later may succeed (a service down, an overload), as opposed to a refusal."""


class InvalidArgument(SimrunError):
    """A bad workflow, setting or request field."""

    code_name = "INVALID_ARGUMENT"
    http_status = 400


class NotFound(SimrunError):
    """A run, task, snapshot or other resource that does not exist."""

    code_name = "NOT_FOUND"
    http_status = 404


class AlreadyExists(SimrunError):
    """A resource that exists already."""

    code_name = "ALREADY_EXISTS"
    http_status = 409


class FailedPrecondition(SimrunError):
    """A task that fits no node, a reservation already held, or a state that forbids the request."""

    code_name = "FAILED_PRECONDITION"
    http_status = 409


class PermissionDenied(SimrunError):
    """An identity that may not do this, e.g. cancel another's run."""

    code_name = "PERMISSION_DENIED"
    http_status = 403


class Unauthenticated(SimrunError):
    """A request without a token, or with an unknown one."""

    code_name = "UNAUTHENTICATED"
    http_status = 401


class Unavailable(SimrunError):
    """A service that cannot be reached right now."""

    code_name = "UNAVAILABLE"
    http_status = 503
    transient = True


class ResourceExhausted(SimrunError):
    """A server at its bound of concurrent calls, or an identity at its bound of active runs."""

    code_name = "RESOURCE_EXHAUSTED"
    http_status = 429
    transient = True


ERRORS_BY_CODE_NAME: dict[str, type[SimrunError]] = {
    cls.code_name: cls
    for cls in (
        SimrunError,
        InvalidArgument,
        NotFound,
        AlreadyExists,
        FailedPrecondition,
        PermissionDenied,
        Unauthenticated,
        Unavailable,
        ResourceExhausted,
    )
}


def error_for_status(code_name: str, details: str) -> SimrunError:
    """The domain error a failed call's status code (`NOT_FOUND`, …) stands for, with the server's words.

    A call past its deadline is `Unavailable`, like a server that cannot be reached: trying again may succeed.
    """
    kind = "UNAVAILABLE" if code_name == "DEADLINE_EXCEEDED" else code_name
    return ERRORS_BY_CODE_NAME.get(kind, SimrunError)(details or code_name)
