"""The test base image and the registry on loopback (tests/images.py): made once, pushed by digest, and runnable
with the flags these machines need."""

from __future__ import annotations

import subprocess
import urllib.request

import pytest
from images import PODMAN, ULIMITS, BaseImage, Registry


@pytest.mark.slow
def test_the_base_image_is_in_the_registry_by_digest_and_runs_confined(
    base_image: BaseImage, oci_registry: Registry
) -> None:
    repository, _, digest = base_image.pushed.partition("@")
    assert repository == f"{oci_registry.address}/simrun/base" and digest.startswith("sha256:")
    request = urllib.request.Request(
        f"http://{oci_registry.address}/v2/simrun/base/manifests/{digest}",
        method="HEAD",
        headers={"Accept": "application/vnd.oci.image.manifest.v1+json"},
    )
    with urllib.request.urlopen(request, timeout=5) as response:
        assert response.headers["Docker-Content-Digest"] == digest
    ran = subprocess.run(
        [
            *PODMAN,
            "run",
            "--rm",
            *ULIMITS,
            "--read-only",
            "--user",
            "1000",
            "--network",
            "none",
            base_image.local,
            "python3",
            "-c",
            "import ssl, venv, os; print(os.getuid(), ssl.get_default_verify_paths().cafile is not None)",
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.split()[0] == "1000"
