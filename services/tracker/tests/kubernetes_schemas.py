"""The real CRD schemas of `shared/schemas/` (beside the repository), as strict validators for rendered objects."""

from __future__ import annotations

import copy
import functools
import json
from pathlib import Path
from typing import Any

import jsonschema

REPO = Path(__file__).resolve().parents[3]
SCHEMAS = REPO.parent / "shared" / "schemas"

_BY_KIND = {
    ("argoproj.io/v1alpha1", "Workflow"): "argo/workflow.v1alpha1.schema.json",
    ("kueue.x-k8s.io/v1beta2", "ClusterQueue"): "kueue/clusterqueue.v1beta2.schema.json",
    ("kueue.x-k8s.io/v1beta2", "LocalQueue"): "kueue/localqueue.v1beta2.schema.json",
    ("kueue.x-k8s.io/v1beta2", "ResourceFlavor"): "kueue/resourceflavor.v1beta2.schema.json",
    ("kueue.x-k8s.io/v1beta2", "WorkloadPriorityClass"): "kueue/workloadpriorityclass.v1beta2.schema.json",
}


def schemas_dir() -> Path:
    """`../shared/schemas` from the repository root; a clear failure where CI did not put `shared/` beside it."""
    if not (SCHEMAS / "argo" / "workflow.v1alpha1.schema.json").is_file():
        raise RuntimeError(
            f"the CRD schemas are not at {SCHEMAS}: the tests need shared/schemas/ beside the repository's clone"
        )
    return SCHEMAS


def forbid_unknown(node: Any) -> Any:
    """Makes unknown (misspelled) fields errors, as the schema README says, except where Kubernetes keeps them."""
    if isinstance(node, dict):
        if (
            "properties" in node
            and "additionalProperties" not in node
            and not node.get("x-kubernetes-preserve-unknown-fields")
        ):
            node["additionalProperties"] = False
        for value in node.values():
            forbid_unknown(value)
    elif isinstance(node, list):
        for value in node:
            forbid_unknown(value)
    return node


@functools.cache
def _schema(relative: str) -> dict[str, Any]:
    return forbid_unknown(json.loads((schemas_dir() / relative).read_text()))


@functools.cache
def validator(relative: str) -> jsonschema.Draft7Validator:
    return jsonschema.Draft7Validator(_schema(relative))


@functools.cache
def container_validator() -> jsonschema.Draft7Validator:
    """The Workflow CRD's own schema of a template's container, for the branches of a `podSpecPatch`."""
    schema = _schema("argo/workflow.v1alpha1.schema.json")
    container = copy.deepcopy(
        schema["properties"]["spec"]["properties"]["templates"]["items"]["properties"]["container"]
    )
    container.pop("required", None)  # a patch names only what it changes
    return jsonschema.Draft7Validator(container)


def errors(document: dict[str, Any]) -> list[str]:
    """Strict-mode errors of a document against the schema of its apiVersion and kind; its kind must be known."""
    relative = _BY_KIND[(document.get("apiVersion"), document.get("kind"))]
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator(relative).iter_errors(document)]


def known(document: dict[str, Any]) -> bool:
    return (document.get("apiVersion"), document.get("kind")) in _BY_KIND
