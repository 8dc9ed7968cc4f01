"""Every manifest of `deploy/` validates strictly: CRD kinds against the real CRD schemas, Kubernetes' own kinds
against the `kubernetes` client's models (generated from Kubernetes' OpenAPI, unknown fields forbidden)."""

from __future__ import annotations

import shutil
import subprocess
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


def validate_strictly(where: str, doc: dict) -> None:
    """Validates one object: a CRD kind against its schema, a Kubernetes kind against the client's model."""
    if schemas.known(doc):
        assert schemas.errors(doc) == [], where
        return
    from kubernetes.client import models

    assert doc["apiVersion"] in CORE_GROUPS, f"{where}: no schema for {doc['apiVersion']} {doc['kind']}"
    model = getattr(models, f"V1{doc['kind']}")
    model.model_validate(doc)  # raises on a misspelled or unknown field


@pytest.mark.parametrize(("where", "doc"), manifests(), ids=[w for w, _ in manifests()])
def test_every_manifest_validates_strictly(where: str, doc: dict) -> None:
    validate_strictly(where, doc)


def _identity(doc: dict) -> tuple[str, str, str, str]:
    meta = doc["metadata"]
    return (doc["apiVersion"], doc["kind"], meta.get("namespace", ""), meta["name"])


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="no kubectl (scripts/test installs kubernetes-client)")
def test_kubectl_kustomize_renders_deploy_and_every_object_it_renders_validates() -> None:
    """`kubectl kustomize deploy/` (what `kubectl apply -k deploy/` applies) renders the files' objects, each once,
    and each validates strictly. `deploy/argo/` names Argo's release by URL, which this machine cannot fetch."""
    rendered = subprocess.run(
        ["kubectl", "kustomize", str(DEPLOY)], capture_output=True, text=True, timeout=120, check=False
    )
    assert rendered.returncode == 0, rendered.stderr
    objects = [d for d in yaml.safe_load_all(rendered.stdout) if d]
    for doc in objects:
        validate_strictly(f"kustomize: {doc['kind']}/{doc['metadata']['name']}", doc)
    files = [doc for where, doc in manifests() if not where.startswith("argo/")]
    assert sorted(map(_identity, objects)) == sorted(map(_identity, files))
    by_identity = {_identity(d): d for d in objects}
    for doc in files:
        assert by_identity[_identity(doc)] == doc, _identity(doc)


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


def test_the_service_builds_an_image_per_lock_with_the_deployed_buildkit_and_zot() -> None:
    """The builder is `kind: image`: BuildKit at the buildkitd Service, pushing to the Zot Service by its cluster
    name, the name the nodes pull through k3s's mirror (deploy/README.md), from a base named by digest."""
    config_map = next(d for d in by_kind("ConfigMap") if d["metadata"]["name"] == "simrun-config")
    environments = ServerConfig.model_validate(yaml.safe_load(config_map["data"]["server.yaml"])).environments
    assert environments.kind == "image" and environments.images is not None
    images = environments.images
    assert images.builder == "buildkit"

    def service_address(name: str) -> str:
        service = next(d for d in by_kind("Service") if d["metadata"]["name"] == name)
        namespace, port = service["metadata"]["namespace"], service["spec"]["ports"][0]["port"]
        return f"{name}.{namespace}.svc.cluster.local:{port}"

    assert images.registry == service_address("zot")
    assert images.buildkit_addr == f"tcp://{service_address('buildkitd')}"
    assert all("@sha256:" in base for base in images.base_images.values()) and "3.11" in images.base_images
    readme = (DEPLOY / "README.md").read_text()
    mirrors = " ".join(readme.split())
    assert f'"{images.registry}": endpoint: ["http://localhost:30500"]' in mirrors


def _server_container() -> tuple[dict, dict, ServerConfig]:
    deployment = next(d for d in by_kind("Deployment") if d["metadata"]["name"] == "simrun")
    config_map = next(d for d in by_kind("ConfigMap") if d["metadata"]["name"] == "simrun-config")
    config = ServerConfig.model_validate(yaml.safe_load(config_map["data"]["server.yaml"]))
    return deployment["spec"]["template"]["spec"], deployment["spec"]["template"]["spec"]["containers"][0], config


def test_argo_finds_the_token_of_the_wait_sidecar_s_account() -> None:
    # Argo mounts the Secret `<executor account>.service-account-token` (util/secrets.TokenName, Argo v4.1.2) into
    # every pod whose template names executor.serviceAccountName; no Secret, no pod ever starts.
    secrets = {d["metadata"]["name"]: d for d in by_kind("Secret")}
    token = secrets[f"{EXECUTOR_ACCOUNT}.service-account-token"]
    assert token["type"] == "kubernetes.io/service-account-token"
    assert token["metadata"]["annotations"]["kubernetes.io/service-account.name"] == EXECUTOR_ACCOUNT
    (account,) = [d for d in by_kind("ServiceAccount") if d["metadata"]["name"] == EXECUTOR_ACCOUNT]
    assert token["metadata"]["namespace"] == account["metadata"]["namespace"]


def test_the_deployed_server_may_start_with_its_config() -> None:
    from simrun_core.rpc.server import check_transport

    pod, container, config = _server_container()
    check_transport(config.address, config.tls, config.insecure)  # a LAN address: refused without insecure or TLS
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    writable = [Path(p) for p, m in mounts.items() if not m.get("readOnly") and "subPath" not in m]

    def beneath_a_writable_mount(path: Path) -> bool:
        return any(path.is_relative_to(root) and path != root for root in writable)

    # The server narrows its home to 0700, which a non-root user may not do to a volume's root (owned by root).
    assert beneath_a_writable_mount(config.home), config.home
    assert beneath_a_writable_mount(config.index)
    assert config.environments.uv_cache_dir is not None and beneath_a_writable_mount(config.environments.uv_cache_dir)
    env = {e["name"]: e["value"] for e in container.get("env", [])}
    assert any(Path(env["HOME"]) == root or beneath_a_writable_mount(Path(env["HOME"])) for root in writable)
    # The tokens come from a Secret mounted read-only: the server can migrate no plaintext token there.
    tokens = mounts[str(config.tokens_file.parent)]
    assert tokens["readOnly"] is True
    assert pod["securityContext"]["runAsNonRoot"] is True


MODEL_TASKS = """
from simrun_runtime import ExecContext, ResourceHint, TaskSettings, UnsplitTaskType


class Small(UnsplitTaskType):
    class Settings(TaskSettings):
        pass

    resources = ResourceHint(base_memory_gb=0.5)

    def run(self, settings, context: ExecContext):
        return {}


class Big(Small):
    resources = ResourceHint(base_memory_gb=500.0)
"""


def _model_repo(dest: Path) -> Path:
    """A model without pyproject.toml (its environment is the default image's) in a git working tree of its own."""
    import subprocess

    (dest / "kmodel").mkdir(parents=True)
    (dest / "kmodel" / "__init__.py").write_text("")
    (dest / "kmodel" / "tasks.py").write_text(MODEL_TASKS)
    (dest / "small.yaml").write_text("name: small\ntasks:\n  small:\n    type: kmodel.tasks:Small\n")
    (dest / "huge.yaml").write_text("name: huge\ntasks:\n  big:\n    type: kmodel.tasks:Big\n")
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    for args in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-q", "-m", "model"]):
        subprocess.run(["git", *args], cwd=dest, check=True, env={**env, "PATH": "/usr/bin:/bin"})
    return dest


@pytest.mark.slow
@pytest.mark.timeout(240)  # a real server and four CLI processes on a shared machine
def test_simrun_server_starts_with_the_deployed_config_and_a_tokens_file_made_as_the_readme_says(
    tmp_path: Path,
) -> None:
    """The ConfigMap's server.yaml (only its folders moved here, the port, and a default image) as a real `simrun
    server` against the fake API server: for a token made with `simrun tokens add` it lists the cluster's nodes,
    refuses a run that fits no node in one line and makes a run that fits one valid Workflow."""
    import os
    import re
    import shutil
    import signal
    import socket
    import subprocess
    import sys
    import time

    from kubernetes_fake_api import FakeApiServer, node

    simrun = shutil.which("simrun", path=str(Path(sys.executable).parent)) or "simrun"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SIMRUN_")}
    env["SIMRUN_HOME"] = str(tmp_path / "client-home")  # the CLI's own home, never the reader's
    secret = tmp_path / "secret"
    secret.mkdir()
    tokens = secret / "tokens.yaml"
    tokens.write_text("owner: alice\ntokens: {}\n")
    added = subprocess.run(
        [simrun, "tokens", "add", "alice", "--tokens-file", str(tokens)], capture_output=True, text=True, timeout=60
    )
    assert added.returncode == 0, added.stderr
    token = added.stdout.strip()
    assert token not in tokens.read_text()
    tokens.chmod(0o444)  # as the Secret is mounted: nothing to rewrite, nothing the server may write
    config_map = next(d for d in by_kind("ConfigMap") if d["metadata"]["name"] == "simrun-config")
    config = yaml.safe_load(config_map["data"]["server.yaml"])
    with FakeApiServer() as api, socket.socket() as sock:
        api.cluster.put("nodes", node("node-a", 8, 32))
        api.cluster.put("nodes", node("node-b", 8, 32))
        kubeconfig = api.kubeconfig(tmp_path / "kubeconfig")
        volume = tmp_path / "var-lib-simrun"

        def moved(path: str) -> str:
            return str(volume / Path(path).relative_to("/var/lib/simrun"))

        sock.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{sock.getsockname()[1]}"
        sock.close()
        config.update(
            home=moved(config["home"]),
            index=moved(config["index"]),
            store=str(tmp_path / "store"),
            tokens_file=str(tokens),
            address=address,
        )
        config["environments"]["uv_cache_dir"] = moved(config["environments"]["uv_cache_dir"])
        config["executor"]["kubernetes"]["kubeconfig"] = str(kubeconfig)  # in the cluster: its service account
        executor_image = "localhost:30500/simrun/default@sha256:" + "d1" * 32
        config["executor"]["kubernetes"]["default_image"] = executor_image  # README step 6
        server_yaml = tmp_path / "server.yaml"
        server_yaml.write_text(yaml.safe_dump(config))
        proc = subprocess.Popen(
            [simrun, "server", "--config", str(server_yaml)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**env, "HOME": str(volume), "SIMRUN_WEB_ADDRESS": "127.0.0.1:0"},
        )
        try:
            assert proc.stdout is not None and proc.stderr is not None
            first = proc.stdout.readline()
            assert re.match(rf"simrun serves at {re.escape(address)}", first), first + (
                proc.stderr.read() if proc.poll() is not None else ""
            )
            listed = subprocess.run(
                [simrun, "nodes", "--json"],
                capture_output=True,
                text=True,
                timeout=60,
                env={**env, "SIMRUN_ENDPOINT": address, "SIMRUN_TOKEN": token},
            )
            assert listed.returncode == 0, listed.stderr
            assert {"node-a", "node-b"} <= set(re.findall(r'"name": "([^"]+)"', listed.stdout))
            assert any(r.path == "/api/v1/nodes" for r in api.cluster.requests)
            client_env = {**env, "SIMRUN_ENDPOINT": address, "SIMRUN_TOKEN": token}
            model = _model_repo(tmp_path / "model")
            # A pod that fits no node of the cluster is refused at submission, in one line, nothing submitted.
            refused = subprocess.run(
                [simrun, "submit", str(model / "huge.yaml")],
                capture_output=True,
                text=True,
                timeout=120,
                env=client_env,
            )
            assert refused.returncode == 1 and "Traceback" not in refused.stderr, refused.stderr
            assert "task big" in refused.stderr and "GiB" in refused.stderr, refused.stderr
            assert len(refused.stderr.strip().splitlines()) == 1
            assert not [r for r in api.cluster.requests if r.method == "POST"]
            # A run that fits becomes one Workflow in the cluster, valid against the CRD, with the default image.
            done = subprocess.run(
                [simrun, "submit", str(model / "small.yaml")],
                capture_output=True,
                text=True,
                timeout=120,
                env=client_env,
            )
            assert done.returncode == 0, done.stderr
            deadline = time.monotonic() + 30
            while not api.cluster.items("workflows"):
                assert time.monotonic() < deadline, "no Workflow was created for the submitted run"
                time.sleep(0.1)
            (workflow,) = api.cluster.items("workflows")
            workflow.pop("status", None)
            for key in ("resourceVersion", "creationTimestamp", "uid"):
                workflow["metadata"].pop(key, None)
            assert schemas.errors(workflow) == []
            images = {t["container"]["image"] for t in workflow["spec"]["templates"] if "container" in t}
            assert images == {executor_image}
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.communicate(timeout=30)


def test_argo_keeps_a_succeeded_workflow_s_pods_until_their_logs_are_archived() -> None:
    argo = next(d for d in by_kind("ConfigMap") if d["metadata"]["name"] == "workflow-controller-configmap")
    delay = argo["data"]["podGCDeleteDelayDuration"]
    assert delay.endswith("m") and int(delay[:-1]) >= 1  # Argo's default, 5 s, can beat the archiver


def test_no_service_of_simrun_can_be_evicted_by_a_reservation() -> None:
    # A reservation taints its node simrun/reserved=<run>:NoExecute: every pod there that does not tolerate it is
    # evicted, so simrun's own services stay off the worker nodes (or tolerate the taint).
    for deployment in by_kind("Deployment"):
        spec = deployment["spec"]["template"]["spec"]
        pinned = spec.get("nodeSelector", {}).get("node-role.kubernetes.io/control-plane") == "true"
        tolerates = any(t.get("key") == "simrun/reserved" for t in spec.get("tolerations", []))
        assert pinned or tolerates, deployment["metadata"]["name"]
