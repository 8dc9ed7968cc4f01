"""The service's image: `deploy/server.Dockerfile` built with buildah from the Debian base of the tests, run with
podman as the Deployment runs it (read-only root, uid 1000, the deployed server.yaml at its deployed paths), against
the fake Kubernetes API; the host's `simrun whoami` reaches it and its nodes are the cluster's."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from images import BUILDAH, PODMAN, ULIMITS, BaseImage, free_port, image_with_files
from kubernetes_fake_api import FakeApiServer, node

pytestmark = [pytest.mark.slow, pytest.mark.network, pytest.mark.timeout(900)]
REPO = Path(__file__).resolve().parents[1]
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
SIMRUN = shutil.which("simrun", path=str(Path(sys.executable).parent)) or "simrun"

# BuildKit is not packaged here: a stand-in `buildctl` (the service only runs it for a build) makes the image's
# stage `FROM ${BUILDKIT}` real without a public hub.
STAND_IN_BUILDCTL = "#!/bin/sh\necho 'buildctl stand-in of the tests' >&2\nexit 1\n"


def deployed_config() -> dict:
    documents = yaml.safe_load_all((REPO / "deploy" / "simrun.yaml").read_text())
    config_map = next(d for d in documents if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "simrun-config")
    return yaml.safe_load(config_map["data"]["server.yaml"])


def test_the_service_image_builds_with_buildah_runs_as_deployed_and_answers_the_host_s_cli(
    tmp_path: Path, base_image: BaseImage
) -> None:
    buildctl = image_with_files(base_image.local, {"/usr/bin/buildctl": STAND_IN_BUILDCTL}, "simrun-test-buildctl")
    image = "localhost/simrun-test-server:suite"
    built = subprocess.run(
        [
            *BUILDAH,
            "bud",
            "--runtime",
            "runc",
            *ULIMITS,
            "--layers",
            "--build-arg",
            f"BASE={base_image.local}",
            "--build-arg",
            f"BUILDKIT={buildctl}",
            "--build-arg",
            "CA_BUNDLE=/run/simrun-ca.crt",
            "--volume",
            f"{CA_BUNDLE}:/run/simrun-ca.crt:ro",
            "--file",
            "deploy/server.Dockerfile",
            "--tag",
            image,
            ".",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=800,
    )
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    try:
        _run_as_deployed(tmp_path, image)
    finally:
        subprocess.run(["podman", "rmi", "--force", image], capture_output=True)


def _run_as_deployed(tmp_path: Path, image: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SIMRUN_")}
    env["SIMRUN_HOME"] = str(tmp_path / "client-home")
    tokens = tmp_path / "tokens" / "tokens.yaml"
    tokens.parent.mkdir()
    tokens.write_text("owner: alice\ntokens: {}\n")
    added = subprocess.run(
        [SIMRUN, "tokens", "add", "alice", "--tokens-file", str(tokens)], capture_output=True, text=True, timeout=60
    )
    assert added.returncode == 0, added.stderr
    token = added.stdout.strip()
    tokens.chmod(0o444)
    config = deployed_config()
    port = free_port()
    config["address"] = f"127.0.0.1:{port}"  # the pod's network is the host's here: loopback only
    config["executor"]["kubernetes"]["kubeconfig"] = "/etc/simrun/kubeconfig"  # in the cluster: its account
    (tmp_path / "server.yaml").write_text(yaml.safe_dump(config))
    # The Deployment's volumes: the store (a claim), the home and /tmp (emptyDirs), each the pods' user's.
    for folder in ("store", "var-lib-simrun"):
        (tmp_path / folder).mkdir()
        os.chown(tmp_path / folder, 1000, 1000)
    with FakeApiServer() as api:
        api.cluster.put("nodes", node("node-a", 8, 32))
        kubeconfig = api.kubeconfig(tmp_path / "kubeconfig")
        kubeconfig.chmod(0o444)
        name = f"simrun-test-server-{port}"
        started = subprocess.run(
            [
                *PODMAN,
                "run",
                "--detach",
                "--name",
                name,
                "--network",
                "host",
                "--read-only",
                "--user",
                "1000:1000",
                "--cap-drop",
                "all",
                "--security-opt",
                "no-new-privileges",
                *ULIMITS,
                "--env",
                "HOME=/var/lib/simrun",
                "--tmpfs",
                "/tmp:rw,mode=1777",
                "--volume",
                f"{tmp_path / 'store'}:/store:rw",
                "--volume",
                f"{tmp_path / 'var-lib-simrun'}:/var/lib/simrun:rw",
                "--volume",
                f"{tmp_path / 'server.yaml'}:/etc/simrun/server.yaml:ro",
                "--volume",
                f"{tokens.parent}:/etc/simrun/tokens:ro",
                "--volume",
                f"{kubeconfig}:/etc/simrun/kubeconfig:ro",
                image,
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert started.returncode == 0, started.stderr
        try:
            client = {**env, "SIMRUN_ENDPOINT": f"127.0.0.1:{port}", "SIMRUN_TOKEN": token}
            whoami = subprocess.run(
                [SIMRUN, "whoami", "--wait", "120", "--json"], capture_output=True, text=True, timeout=180, env=client
            )
            logs = subprocess.run([*PODMAN, "logs", name], capture_output=True, text=True).stderr[-3000:]
            assert whoami.returncode == 0, whoami.stderr + logs
            assert json.loads(whoami.stdout)["name"] == "alice"
            nodes = subprocess.run([SIMRUN, "nodes", "--json"], capture_output=True, text=True, timeout=60, env=client)
            assert nodes.returncode == 0, nodes.stderr
            assert '"node-a"' in nodes.stdout
            user = subprocess.run([*PODMAN, "exec", name, "id", "-u"], capture_output=True, text=True).stdout.strip()
            assert user == "1000"
            tools = subprocess.run(
                [*PODMAN, "exec", name, "sh", "-c", "command -v buildctl && command -v uv && command -v simrun"],
                capture_output=True,
                text=True,
            )
            assert tools.returncode == 0 and len(tools.stdout.split()) == 3, tools.stdout + tools.stderr
        finally:
            subprocess.run([*PODMAN, "rm", "--force", "--time", "5", name], capture_output=True, timeout=120)
