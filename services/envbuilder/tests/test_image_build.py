"""Real images: the builder locks a model with numpy against the package index, builds its image with buildah from
the Debian base image of the tests (tests/images.py), pushes it to a real registry on loopback and names it by
digest; the image runs confined with podman. A code-only change builds nothing (the registry has the image), a
dependency change builds a new one, and a failed build leaves no tag in the registry."""

from __future__ import annotations

import hashlib
import json
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from click.testing import CliRunner
from images import PODMAN, ULIMITS, BaseImage, Registry
from simrun_cli.main import cli
from simrun_core.snapshots.model import FileEntry
from simrun_core.snapshots.store import LocalFiles, SnapshotStore
from simrun_envbuilder.builder import BuilderSettings, Environment, EnvironmentBuilder, EnvironmentState
from simrun_envbuilder.image import ImageSettings
from simrun_envbuilder.lock import UvSettings, default_uv_command
from simrun_envbuilder.server import create_server
from simrun_runtime.record import Provenance, SnapshotRef

pytestmark = [pytest.mark.slow, pytest.mark.network, pytest.mark.timeout(900)]
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")


def numpy_model(dependencies: tuple[str, ...] = ("numpy",), code: str = "v1") -> dict[str, str]:
    return {
        "pyproject.toml": f"""[project]
name = "npmodel"
version = "0.1.0"
requires-python = ">=3.11"
dependencies = {json.dumps(list(dependencies))}

[project.entry-points."simrun.task_types"]
npmodel = "npmodel.tasks"

[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"
""",
        "npmodel/__init__.py": f"CODE = {code!r}\n",
        "npmodel/tasks.py": "",
    }


@dataclass
class Images:
    """What these tests share: the store, the builder's settings, the registry."""

    store: Path
    tmp: Path
    settings: BuilderSettings
    registry: Registry

    def snapshot(self, files: dict[str, str]) -> SnapshotRef:
        folder = self.tmp / f"tree-{hashlib.sha256(repr(sorted(files.items())).encode()).hexdigest()[:8]}"
        entries = []
        for path, text in files.items():
            target = folder / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
            entries.append(FileEntry(path, hashlib.sha256(text.encode()).hexdigest(), len(text.encode())))
        return SnapshotStore(self.store).write("npmodel", entries, Provenance(), LocalFiles(folder)).snapshot.to_ref()

    def builder(self, root: str, **changes: object) -> EnvironmentBuilder:
        assert self.settings.images is not None
        images = replace(self.settings.images, **changes)  # type: ignore[arg-type]
        return EnvironmentBuilder(replace(self.settings, root=self.tmp / root, images=images))

    def tags(self) -> list[str]:
        url = f"http://{self.registry.address}/v2/simrun/environments/tags/list"
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                return list(json.loads(response.read()).get("tags") or [])
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return []
            raise


def ready(builder: EnvironmentBuilder, environment_id: str, timeout_s: float = 800) -> Environment:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        environment = builder.get(environment_id)
        if environment.state is not EnvironmentState.BUILDING:
            return environment
        time.sleep(0.2)
    raise AssertionError(f"environment {environment_id} still building after {timeout_s} s")


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory, base_image: BaseImage, oci_registry: Registry) -> Images:
    tmp = tmp_path_factory.mktemp("images")
    settings = BuilderSettings(
        root=tmp / "environments",
        store=tmp / "store",
        uv=UvSettings(default_uv_command()),
        compile_bytecode=False,
        images=ImageSettings(
            registry=oci_registry.address,
            repository="simrun/environments",
            base_images={base_image.python_version: base_image.pushed},
            insecure=True,
            ca_bundle=CA_BUNDLE,
            builder="buildah",
        ),
    )
    return Images(tmp / "store", tmp, settings, oci_registry)


@pytest.fixture(scope="module")
def numpy_image(images: Images) -> Iterator[Environment]:
    builder = images.builder("first")
    try:
        environment = ready(builder, builder.resolve([images.snapshot(numpy_model())]).environment_id)
    finally:
        builder.close()
    yield environment


def test_an_image_with_numpy_is_built_from_the_local_base_pushed_by_digest_and_runs(
    numpy_image: Environment, images: Images
) -> None:
    assert numpy_image.state is EnvironmentState.READY, numpy_image.message
    name, _, digest = numpy_image.image.partition("@")
    assert name == f"{images.registry.address}/simrun/environments" and digest.startswith("sha256:")
    assert numpy_image.environment_id in images.tags()
    request = urllib.request.Request(
        f"http://{images.registry.address}/v2/simrun/environments/manifests/{numpy_image.environment_id}",
        method="HEAD",
        headers={"Accept": "application/vnd.oci.image.manifest.v1+json"},
    )
    with urllib.request.urlopen(request, timeout=5) as response:
        assert response.headers["Docker-Content-Digest"] == digest
    assert numpy_image.size_bytes > 50 * 2**20, "numpy, Python and Debian, compressed"
    pulled = subprocess.run(
        ["podman", "pull", "--quiet", "--tls-verify=false", numpy_image.image], capture_output=True, text=True
    )
    assert pulled.returncode == 0, pulled.stderr
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
            numpy_image.image,
            "python",
            "-c",
            "import sys, numpy, simrun_runtime; print(sys.prefix, numpy.arange(4).sum())",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.split() == ["/opt/simrun/venv", "6"]


def test_a_code_only_change_builds_no_image_the_registry_has_it(numpy_image: Environment, images: Images) -> None:
    builder = images.builder("restarted")  # a new service: no local record, only the registry knows
    try:
        again = ready(builder, builder.resolve([images.snapshot(numpy_model(code="v2"))]).environment_id)
        assert again.state is EnvironmentState.READY, again.message
        assert again.environment_id == numpy_image.environment_id and again.image == numpy_image.image
        assert again.size_bytes == numpy_image.size_bytes
        log = builder.root / "envs" / again.environment_id / "build.log"
        assert not log.exists() or " bud " not in log.read_text(), "no image was built"
        assert (builder.root / "envs" / again.environment_id / "venv").is_dir(), "the describer's venv was"
        server = create_server(builder, "127.0.0.1:0").start()
        try:
            env = {"SIMRUN_ENDPOINT": f"127.0.0.1:{server.port}", "SIMRUN_TOKEN": "t", "COLUMNS": "250"}
            shown = CliRunner().invoke(cli, ["envs"], env=env, catch_exceptions=False)
        finally:
            server.stop(None)
        assert shown.exit_code == 0, shown.output
        header, row = shown.output.splitlines()[:2]
        assert header.split()[-1] == "image" and row.split()[-1] == again.image
        assert f"{again.size_bytes / 2**20:.1f} MiB" in row, row
    finally:
        builder.close()


def test_a_dependency_change_builds_a_new_image(numpy_image: Environment, images: Images) -> None:
    builder = images.builder("first")
    try:
        changed = builder.resolve([images.snapshot(numpy_model(("numpy", "six")))])
        assert changed.environment_id != numpy_image.environment_id
        built = ready(builder, changed.environment_id)
        assert built.state is EnvironmentState.READY, built.message
        assert built.image != numpy_image.image
        assert " bud --runtime runc" in (builder.root / "envs" / built.environment_id / "build.log").read_text()
        assert {numpy_image.environment_id, built.environment_id} <= set(images.tags())
    finally:
        builder.close()


def test_a_failed_build_fails_with_buildahs_reason_and_leaves_no_tag(images: Images) -> None:
    builder = images.builder("failing", uv_version="0.0.0")  # no such uv: the Dockerfile's second RUN fails
    before = subprocess.run(["buildah", "containers", "--quiet"], capture_output=True, text=True).stdout.split()
    try:
        environment = builder.resolve([images.snapshot(numpy_model())])
        failed = ready(builder, environment.environment_id)
        assert failed.state is EnvironmentState.FAILED
        assert "buildah bud failed" in failed.message and "log tail:" in failed.message
        assert "uv==0.0.0" in failed.message
        assert environment.environment_id not in images.tags()
        local = subprocess.run(
            ["podman", "image", "exists", f"{images.registry.address}/simrun/environments:{environment.environment_id}"]
        )
        assert local.returncode == 1, "no local tag either"
        containers = subprocess.run(["buildah", "containers", "--quiet"], capture_output=True, text=True)
        assert containers.stdout.split() == before, "no working container either"
        assert not (builder.root / "envs" / environment.environment_id).exists()
    finally:
        builder.close()
