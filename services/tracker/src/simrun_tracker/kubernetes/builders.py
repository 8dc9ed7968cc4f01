"""Small typed builders of the Kubernetes and Argo objects simrun submits, as plain dicts in the API's camelCase.

Each builder takes what it needs as typed arguments and returns the object the API expects; nothing here knows of
runs or plans (that is `render`). Tests validate what they build strictly against the real CRD schemas.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

Obj = dict[str, Any]

CONTAINER = "main"
"""Argo's name for a template's container; `podSpecPatch` patches it by this name."""


def env_vars(variables: Mapping[str, str]) -> list[Obj]:
    """Container environment variables in a stable order."""
    return [{"name": name, "value": value} for name, value in sorted(variables.items())]


def resources(cores: str, memory: str, scratch: str | None = None, gpus: int = 0) -> Obj:
    """Requests equal to limits (Kueue admits by requests; the limit is the memory the pod is killed at)."""
    amounts: Obj = {"cpu": cores, "memory": memory}
    if scratch is not None:
        amounts["ephemeral-storage"] = scratch
    if gpus:
        amounts["nvidia.com/gpu"] = str(gpus)
    return {"requests": dict(amounts), "limits": dict(amounts)}


def volume_mount(name: str, path: str, *, read_only: bool = False, sub_path: str | None = None) -> Obj:
    mount: Obj = {"name": name, "mountPath": path}
    if read_only:
        mount["readOnly"] = True
    if sub_path is not None:
        mount["subPath"] = sub_path
    return mount


def claim_volume(name: str, claim: str) -> Obj:
    return {"name": name, "persistentVolumeClaim": {"claimName": claim}}


def empty_dir(name: str, size: str | None = None) -> Obj:
    return {"name": name, "emptyDir": {"sizeLimit": size} if size else {}}


def container_security() -> Obj:
    """No privilege escalation, no capabilities, a read-only root file system (writes go to emptyDirs)."""
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
    }


def pod_security(user: int) -> Obj:
    """The pod runs as a non-root user with the runtime's default seccomp profile."""
    return {
        "runAsNonRoot": True,
        "runAsUser": user,
        "runAsGroup": user,
        "fsGroup": user,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def container(image: str, command: Sequence[str], env: list[Obj], res: Obj, mounts: list[Obj]) -> Obj:
    """Argo's template container: `command` always set (an image's entry point is never relied on)."""
    return {
        "name": CONTAINER,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "command": list(command),
        "env": env,
        "resources": res,
        "volumeMounts": mounts,
        "securityContext": container_security(),
    }


def toleration(key: str, value: str, effect: str = "NoExecute") -> Obj:
    return {"key": key, "operator": "Equal", "value": value, "effect": effect}


def retry_strategy(limit: int, exit_codes: Sequence[int]) -> Obj:
    """Argo retries a pod that ended with one of `exit_codes` or in error (deleted, evicted), up to `limit` times."""
    codes = ", ".join(str(c) for c in exit_codes)
    return {
        "limit": str(limit),
        "retryPolicy": "Always",
        "expression": f"lastRetry.status == 'Error' || asInt(lastRetry.exitCode) in [{codes}]",
    }


def input_parameter(name: str, default: str | None = None) -> Obj:
    parameter: Obj = {"name": name}
    if default is not None:
        parameter["default"] = default
    return parameter


def container_template(
    name: str,
    *,
    labels: Mapping[str, str],
    annotations: Mapping[str, str],
    main: Obj,
    priority_class: str,
    retry: Obj,
    pod_spec_patch: str,
    volumes: list[Obj],
    node_selector: Mapping[str, str],
    tolerations: list[Obj],
    security: Obj,
    executor_service_account: str,
    inputs: list[Obj],
) -> Obj:
    """A container template: one pod per attempt, labelled for Kueue, with no service-account token in `main`.

    Argo's templates have no field for the termination grace: `pod_spec_patch` sets it with the memory.
    """
    template: Obj = {
        "name": name,
        "metadata": {"labels": dict(labels), "annotations": dict(annotations)},
        "container": main,
        "priorityClassName": priority_class,
        "retryStrategy": retry,
        "podSpecPatch": pod_spec_patch,
        "volumes": volumes,
        "nodeSelector": dict(node_selector),
        "securityContext": security,
        "automountServiceAccountToken": False,
        # The wait sidecar reports to the controller with this account's token; the main container gets none.
        "executor": {"serviceAccountName": executor_service_account},
    }
    if tolerations:
        template["tolerations"] = tolerations
    if inputs:
        template["inputs"] = {"parameters": inputs}
    return template


def dag_task(
    name: str,
    template: str,
    depends: str = "",
    *,
    sequence: tuple[int, int] | None = None,
    arguments: Mapping[str, str] | None = None,
    continue_on_failed: bool = False,
) -> Obj:
    """A node of the run's DAG; `sequence` fans it out over `{{item}}` from start to end, both included."""
    task: Obj = {"name": name, "template": template}
    if depends:
        task["depends"] = depends
    if sequence is not None:
        task["withSequence"] = {"start": str(sequence[0]), "end": str(sequence[1])}
    if arguments:
        task["arguments"] = {"parameters": [{"name": k, "value": v} for k, v in arguments.items()]}
    if continue_on_failed:
        task["continueOn"] = {"failed": True}
    return task


def dag_template(name: str, tasks: list[Obj]) -> Obj:
    return {"name": name, "dag": {"tasks": tasks}}


def workflow(
    name: str,
    namespace: str,
    *,
    labels: Mapping[str, str],
    annotations: Mapping[str, str],
    entrypoint: str,
    templates: list[Obj],
    volumes: list[Obj],
) -> Obj:
    """The Workflow: pods are kept until it succeeds (so a restarted tracker still sees them), then collected."""
    return {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Workflow",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": dict(labels),
            "annotations": dict(annotations),
        },
        "spec": {
            "entrypoint": entrypoint,
            "templates": templates,
            "volumes": volumes,
            "automountServiceAccountToken": False,
            "podGC": {"strategy": "OnWorkflowSuccess"},
            "ttlStrategy": {"secondsAfterCompletion": 7 * 24 * 3600},
        },
    }
