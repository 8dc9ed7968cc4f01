"""Every manifest of `deploy/` validates strictly: CRD kinds against the real CRD schemas, Kubernetes' own kinds
against the `kubernetes` client's models (generated from Kubernetes' OpenAPI, unknown fields forbidden)."""

from __future__ import annotations

from pathlib import Path

import kubernetes_schemas as schemas
import pytest
import yaml
from simrun_core.config import ServerConfig
from simrun_core.identity import PRIORITY_VALUES, PodRole, Priority, priority_class
from simrun_tracker.kubernetes.config import KubernetesSettings
from simrun_tracker.kubernetes.render import EXECUTOR_ACCOUNT

DEPLOY = schemas.REPO / "deploy"
CORE_GROUPS = {"v1", "apps/v1", "scheduling.k8s.io/v1", "rbac.authorization.k8s.io/v1"}


def documents(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def manifests() -> list[tuple[str, dict]]:
    kustomization = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    found = []
    for name in kustomization["resources"]:
        found.extend((f"{name}#{i}", doc) for i, doc in enumerate(documents(DEPLOY / name)))
    found.extend(
        (f"argo/controller-configmap.yaml#{i}", d)
        for i, d in enumerate(documents(DEPLOY / "argo" / "controller-configmap.yaml"))
    )
    return found


def by_kind(kind: str) -> list[dict]:
    return [doc for _, doc in manifests() if doc["kind"] == kind]


def test_the_kustomizations_list_every_manifest_in_order() -> None:
    listed = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())["resources"]
    on_disk = sorted(p.name for p in DEPLOY.glob("*.yaml") if p.name != "kustomization.yaml")
    assert sorted(listed) == on_disk
    assert listed[0] == "namespace.yaml"
    argo = yaml.safe_load((DEPLOY / "argo" / "kustomization.yaml").read_text())
    assert any(r.endswith("/v4.1.2/install.yaml") for r in argo["resources"])
    assert {"path": "controller-configmap.yaml"} in argo["patches"]
    assert any("ARGO_POD_STATUS_CAPTURE_FINALIZER" in p.get("patch", "") for p in argo["patches"])


@pytest.mark.parametrize(("where", "doc"), manifests(), ids=[w for w, _ in manifests()])
def test_every_manifest_validates_strictly(where: str, doc: dict) -> None:
    if schemas.known(doc):
        assert schemas.errors(doc) == [], where
        return
    from kubernetes.client import models

    assert doc["apiVersion"] in CORE_GROUPS, f"{where}: no schema for {doc['apiVersion']} {doc['kind']}"
    model = getattr(models, f"V1{doc['kind']}")
    model.model_validate(doc)  # raises on a misspelled or unknown field


def test_strict_validation_of_core_kinds_catches_a_misspelled_field() -> None:
    from kubernetes.client import models
    from pydantic import ValidationError

    deployment = next(d for d in by_kind("Deployment") if d["metadata"]["name"] == "simrun")
    deployment["spec"]["template"]["spec"]["containers"][0]["imagePullPolicyy"] = "Always"
    with pytest.raises(ValidationError, match="imagePullPolicyy"):
        models.V1Deployment.model_validate(deployment)


def test_priority_classes_have_the_names_and_values_of_the_identities() -> None:
    expected = {priority_class(p, r): PRIORITY_VALUES[p][r] for p in Priority for r in PodRole}
    for kind in ("PriorityClass", "WorkloadPriorityClass"):
        assert {d["metadata"]["name"]: d["value"] for d in by_kind(kind)} == expected, kind
    assert {d["preemptionPolicy"] for d in by_kind("PriorityClass")} == {"Never"}  # the scheduler never preempts


def test_kueue_preempts_lower_priorities_within_the_queue_only() -> None:
    (queue,) = by_kind("ClusterQueue")
    assert queue["spec"]["preemption"] == {"withinClusterQueue": "LowerPriority", "reclaimWithinCohort": "Never"}
    covered = queue["spec"]["resourceGroups"][0]["coveredResources"]
    assert {"cpu", "memory", "ephemeral-storage", "nvidia.com/gpu"} <= set(covered)
    (local,) = by_kind("LocalQueue")
    assert local["spec"]["clusterQueue"] == queue["metadata"]["name"]


def test_the_server_config_chooses_the_kubernetes_executor_with_the_deployed_names() -> None:
    config_map = next(d for d in by_kind("ConfigMap") if d["metadata"]["name"] == "simrun-config")
    config = yaml.safe_load(config_map["data"]["server.yaml"])
    server = ServerConfig.model_validate(config)
    assert server.executor.kind == "kubernetes"
    executor = KubernetesSettings.model_validate(server.executor.kubernetes)
    (local,) = by_kind("LocalQueue")
    claims = [d for d in by_kind("PersistentVolumeClaim") if d["metadata"]["name"] == executor.store_claim]
    assert executor.local_queue == local["metadata"]["name"] and claims
    assert local["metadata"]["namespace"] == executor.namespace == claims[0]["metadata"]["namespace"]
    assert EXECUTOR_ACCOUNT in {d["metadata"]["name"] for d in by_kind("ServiceAccount")}
    argo = next(d for d in by_kind("ConfigMap") if d["metadata"]["name"] == "workflow-controller-configmap")
    sidecar = yaml.safe_load(argo["data"]["executor"])["resources"]
    assert sidecar["requests"] == sidecar["limits"] == {"cpu": "100m", "memory": "128Mi"}
    assert executor.sidecar.cores == 0.1 and executor.sidecar.memory_gb == 0.125
    deployment = next(d for d in by_kind("Deployment") if d["metadata"]["name"] == "simrun")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["readinessProbe"]["grpc"]["port"] == 50551
