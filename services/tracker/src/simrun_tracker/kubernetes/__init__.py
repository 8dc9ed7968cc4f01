"""The kubernetes executor: one Argo Workflow per run, its pods admitted by Kueue, observed through informers.

Nothing here imports the `kubernetes` client at module level: `simrun_tracker.kubernetes.adapter` imports it when
the server config chooses this executor, so the local executor never pays its second of import time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import ValidationError
from simrun_core.errors import FailedPrecondition, InvalidArgument
from simrun_core.validation import first_error
from simrun_runtime.layout import StoreLayout

from simrun_tracker.kubernetes.config import KubernetesSettings

if TYPE_CHECKING:
    from simrun_tracker.kubernetes.adapter import KubernetesExecutor


def kubernetes_executor(section: dict[str, Any], store: StoreLayout, grace_s: float) -> KubernetesExecutor:
    """The executor of the config's `executor.kubernetes` section.

    Raises:
        InvalidArgument: a setting the section must not have or a bad value (with the field's name).
        FailedPrecondition: the `kubernetes` client is not installed (install `simrun-tracker[kubernetes]`).
    """
    try:
        settings = KubernetesSettings.model_validate(section)
    except ValidationError as exc:
        raise InvalidArgument(f"bad executor.kubernetes settings: {first_error(exc)}") from None
    try:
        import kubernetes  # noqa: F401  (about a second: only once this executor is chosen)
    except ImportError as exc:
        raise FailedPrecondition(
            f"the kubernetes executor needs the kubernetes client ({exc.name}): install simrun-tracker[kubernetes]"
        ) from None
    from simrun_tracker.kubernetes.adapter import KubernetesExecutor

    return KubernetesExecutor(settings, store, grace_s=grace_s)
