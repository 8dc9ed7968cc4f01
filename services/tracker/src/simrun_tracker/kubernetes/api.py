"""The cluster API as the adapter uses it: the client made from the settings, and API errors classified once.

An error is either transient (the API unreachable, overloaded, a timeout: back off and try again) or a refusal
(an object the API will not take: the run fails with the API's own message, never a run that spins).
"""

from __future__ import annotations

import json
from typing import Any

from simrun_core.errors import FailedPrecondition, InvalidArgument, SimrunError, Unavailable

from simrun_tracker.kubernetes.config import KubernetesSettings

TRANSIENT_STATUS = frozenset({0, 408, 429, 500, 502, 503, 504})
CONFLICT = 409


def api_client(settings: KubernetesSettings) -> Any:
    """A `kubernetes.client.ApiClient` for the settings: a kubeconfig file, else in-cluster, else ~/.kube/config."""
    from kubernetes import client, config  # the client takes about a second to import: only when chosen

    configuration = client.Configuration()
    if settings.kubeconfig:
        config.load_kube_config(settings.kubeconfig, context=settings.context, client_configuration=configuration)
    else:
        try:
            config.load_incluster_config(client_configuration=configuration)
        except config.ConfigException:
            config.load_kube_config(context=settings.context, client_configuration=configuration)
    return client.ApiClient(configuration)


def api_message(exc: BaseException) -> str:
    """The API's own message of an error (the `message` of its Status body), else the exception's text."""
    body = getattr(exc, "body", None)
    if body:
        try:
            message = json.loads(body).get("message")
        except (ValueError, AttributeError):
            message = None
        if message:
            return str(message)
    reason = getattr(exc, "reason", None)
    return str(reason or exc).splitlines()[0] if str(reason or exc) else type(exc).__name__


def status_of(exc: BaseException) -> int:
    """The HTTP status of an API error; 0 for a connection that failed before any answer."""
    return int(getattr(exc, "status", 0) or 0)


def classify(exc: BaseException, what: str) -> SimrunError:
    """One of simrun's errors for a failed API call: `Unavailable` (transient), else the refusal with its message.

    400 and 422 (an invalid object) become `InvalidArgument`; 401, 403 (forbidden: RBAC, an admission webhook, a
    quota), 404 (no such namespace or CRD) and anything else `FailedPrecondition`. An exception that is not the
    API's (a bug, a file the store refused) is never transient: trying it again would only repeat it.
    """
    if is_transient(exc):
        status = status_of(exc)
        return Unavailable(f"{what}: {api_message(exc)} (the cluster API answered {status or 'nothing'}; retrying)")
    if not is_api_error(exc):
        return FailedPrecondition(f"{what}: {type(exc).__name__}: {api_message(exc)}")
    status = status_of(exc)
    message = f"{what}: {api_message(exc)}"
    if status in (400, 422):
        return InvalidArgument(f"{message} (refused by the cluster API, {status})")
    return FailedPrecondition(f"{message} (refused by the cluster API, {status})")


def is_transient(exc: BaseException) -> bool:
    """Whether a failed call is worth trying again: the API unreachable, overloaded, or too slow to answer."""
    if isinstance(exc, Unavailable):
        return True
    from kubernetes.client.exceptions import ApiException

    if isinstance(exc, ApiException):
        return status_of(exc) in TRANSIENT_STATUS
    import urllib3

    return isinstance(exc, urllib3.exceptions.HTTPError | ConnectionError | TimeoutError)


def is_api_error(exc: BaseException) -> bool:
    """Whether the cluster API answered (the client's `ApiException`), as opposed to an error of simrun's own."""
    from kubernetes.client.exceptions import ApiException

    return isinstance(exc, ApiException)
