"""Images for a cluster: the Dockerfile, the registry client against a real registry on loopback (Debian's
docker-registry, the CNCF distribution registry), and the builder's image flow with BuildKit's client replaced by a
script that pushes to that real registry (BuildKit does not run here)."""

from __future__ import annotations

import json
import shutil
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from images import free_port, serve_registry
from simrun_core.config import EnvironmentsConfig, ImagesConfig, ServerConfig
from simrun_core.errors import InvalidArgument
from simrun_envbuilder.builder import BuilderSettings, EnvironmentBuilder, EnvironmentState
from simrun_envbuilder.convert import settings_from_config
from simrun_envbuilder.image import ImageSettings, RegistryClient, RegistryError, render_dockerfile

BASE = "docker.io/library/python:3.11-slim@sha256:" + "a" * 64

PUSH = r'''
import hashlib, json, sys, urllib.request

def push(registry, repository, tag, text):
    """Pushes an image of one config blob and no layer; returns the manifest's digest."""
    config = json.dumps({"architecture": "amd64", "os": "linux", "simrun": text}).encode()
    digest = "sha256:" + hashlib.sha256(config).hexdigest()
    start = urllib.request.Request(f"http://{registry}/v2/{repository}/blobs/uploads/", method="POST")
    location = urllib.request.urlopen(start).headers["Location"]
    if location.startswith("/"):
        location = f"http://{registry}{location}"
    sep = "&" if "?" in location else "?"
    put = urllib.request.Request(f"{location}{sep}digest={digest}", data=config, method="PUT",
                                 headers={"Content-Type": "application/octet-stream"})
    urllib.request.urlopen(put)
    manifest = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": digest, "size": len(config)},
        "layers": []}).encode()
    put = urllib.request.Request(f"http://{registry}/v2/{repository}/manifests/{tag}", data=manifest, method="PUT",
                                 headers={"Content-Type": "application/vnd.oci.image.manifest.v1+json"})
    return urllib.request.urlopen(put).headers["Docker-Content-Digest"]
'''

FAKE_BUILDCTL = (
    "#!{python}\n"
    + PUSH
    + r"""
args = sys.argv[1:]
with open({calls!r}, "a") as f:
    f.write(json.dumps(args) + "\n")
output = dict(kv.split("=", 1) for kv in args[args.index("--output") + 1].split(","))
metadata = args[args.index("--metadata-file") + 1]
context = [a.split("=", 1)[1] for a in args if a.startswith("context=")][0]
dockerfile = open(context + "/Dockerfile").read()
print("#1 [internal] load build definition from Dockerfile")
registry, _, rest = output["name"].partition("/")
repository, _, tag = rest.rpartition(":")
digest = push(registry, repository, tag, dockerfile)
json.dump({"containerimage.digest": digest}, open(metadata, "w"))
print("#9 pushing manifest done")
"""
)


@pytest.fixture(scope="module")
def registry_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("registry")


@pytest.fixture(scope="module")
def registry(registry_folder: Path) -> Iterator[str]:
    """A real distribution registry on loopback; `scripts/test` installs Debian's docker-registry when missing."""
    address, proc = serve_registry(registry_folder / "open", registry_folder / "data")
    try:
        yield address
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def push(registry: str, repository: str, tag: str, text: str) -> str:
    namespace: dict[str, object] = {}
    exec(PUSH, namespace)  # the same code the fake buildctl runs
    return namespace["push"](registry, repository, tag, text)  # type: ignore[operator,no-any-return]


def image_settings(registry: str, buildctl: tuple[str, ...] = ("buildctl",)) -> ImageSettings:
    return ImageSettings(
        registry=registry,
        repository="simrun/environments",
        base_images={"3.11": BASE},
        insecure=True,
        buildctl=buildctl,
    )


def test_the_registry_client_tells_missing_from_present_and_never_guesses(registry: str) -> None:
    client = RegistryClient(image_settings(registry))
    assert client.digest("simrun/environments", "nothere") is None
    pushed = push(registry, "simrun/environments", "present", "x")
    assert client.digest("simrun/environments", "present") == pushed
    down = RegistryClient(image_settings(f"127.0.0.1:{free_port()}"))
    with pytest.raises(RegistryError, match="cannot reach"):
        down.digest("simrun/environments", "present")


# `simrun:s3cret`, bcrypt (the only hash distribution's htpasswd accepts), made once with crypt(3).
HTPASSWD = "simrun:$2b$04$9wdhjsUsk338AAq6cz.x.etaYWHcFFalNqG8f..9crT3Ys/8XyXKi\n"


def test_the_registry_client_follows_a_credentials_challenge(registry: str, registry_folder: Path) -> None:
    """A registry with htpasswd auth on the same storage as the open one: the client answers its 401 challenge with
    the configured credentials, and a missing or wrong credential is an error, never "the image is missing"."""
    pushed = push(registry, "simrun/environments", "guarded", "y")
    (registry_folder / "htpasswd").write_text(HTPASSWD)
    auth = f"{{htpasswd: {{realm: simrun-test, path: {registry_folder / 'htpasswd'}}}}}"
    address, proc = serve_registry(registry_folder / "guarded", registry_folder / "data", auth)
    try:
        with pytest.raises(urllib.error.HTTPError, match="401"):
            urllib.request.urlopen(f"http://{address}/v2/simrun/environments/manifests/guarded", timeout=5)
        (registry_folder / "password").write_text("s3cret\n")
        config = ServerConfig(
            home=registry_folder / "home",
            environments=EnvironmentsConfig(
                kind="image",
                images=ImagesConfig(
                    registry=address,
                    base_images={"3.11": BASE},
                    insecure=True,
                    username="simrun",
                    password_file=registry_folder / "password",
                ),
            ),
        )
        settings = settings_from_config(config).images
        assert settings is not None and settings.password == "s3cret"
        client = RegistryClient(settings)
        assert client.digest("simrun/environments", "guarded") == pushed
        assert client.digest("simrun/environments", "nothere") is None
        with pytest.raises(RegistryError, match="asks for credentials and none are configured"):
            RegistryClient(image_settings(address)).digest("simrun/environments", "guarded")
        wrong = RegistryClient(replace(image_settings(address), username="simrun", password="wrong"))
        with pytest.raises(RegistryError, match="refused the credentials"):
            wrong.digest("simrun/environments", "guarded")
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    unreadable = config.model_copy(deep=True)
    assert unreadable.environments.images is not None
    unreadable.environments.images.password_file = registry_folder / "nope"
    with pytest.raises(InvalidArgument, match=r"environments\.images\.password_file: cannot read .*nope"):
        settings_from_config(unreadable)


def test_the_dockerfile_has_the_concepts_pages_layers() -> None:
    settings = image_settings("zot:5000")
    text = render_dockerfile(settings, "3.11", ["libexpat1"], uses_git=True, runtime_wheel="simrun_runtime-0.1.whl")
    lines = text.splitlines()
    assert lines[0] == f"FROM {BASE}" and not any(line.startswith("# syntax") for line in lines)
    assert "apt-get install -y --no-install-recommends git libexpat1" in text
    assert "--mount=type=cache,target=/root/.cache/uv" in text and "UV_COMPILE_BYTECODE=1" in text
    runs = [line for line in lines if line.startswith(("RUN", "COPY"))]
    assert "simrun_runtime-0.1.whl" in runs[-1], "simrun is the last layer"
    assert render_dockerfile(settings, "3.11", [], False, "w.whl").count("apt-get") == 0
    # a lock that builds a package from source runs its backend: no uv cache shared with other image builds
    assert "--mount=type=cache" in render_dockerfile(settings, "3.11", [], False, "w.whl")
    assert "--mount=type=cache" not in render_dockerfile(settings, "3.11", [], True, "w.whl", builds_from_source=True)
    with pytest.raises(InvalidArgument, match="by digest"):
        ImageSettings(registry="r", repository="x", base_images={"3.11": "python:3.11-slim"})


def test_an_image_is_built_once_then_found_in_the_registry(
    registry: str, settings: BuilderSettings, kit, tmp_path: Path
) -> None:
    calls = tmp_path / "buildctl-calls"
    fake = tmp_path / "buildctl"
    fake.write_text(FAKE_BUILDCTL.replace("{python}", sys.executable).replace("{calls!r}", repr(str(calls))))
    fake.chmod(0o755)
    images = image_settings(registry, (str(fake),))
    ref = kit.snapshot("tinymodel", kit.model_files())
    builder = EnvironmentBuilder(replace(settings, images=images))
    try:
        environment = kit.wait_ready(builder, builder.resolve([ref]).environment_id)
        assert environment.state is EnvironmentState.READY, environment.message
        assert environment.image.startswith(f"{registry}/simrun/environments@sha256:")
        assert environment.interpreter.endswith("/venv/bin/python"), "the describer's venv of the same lock"
        call = json.loads(calls.read_text().splitlines()[0])
        assert call[:3] == ["build", "--frontend", "dockerfile.v0"]
        assert f"type=image,name={registry}/simrun/environments:{environment.environment_id},push=true" in call[-5]
        context = builder.root / "envs" / environment.environment_id / "context"
        names = sorted(p.name for p in context.iterdir())
        assert names[:2] == ["Dockerfile", "pyproject.toml"] and names[3] == "uv.lock" and len(names) == 4
        assert names[2].startswith("simrun_runtime-"), "the context holds the lock project and the runtime, no code"
    finally:
        builder.close()
    # Another builder (a restarted service, or another cluster's) finds the image in the registry: no build.
    shutil.rmtree(settings.root)
    again = EnvironmentBuilder(replace(settings, images=images))
    try:
        found = kit.wait_ready(again, again.resolve([ref]).environment_id)
        assert found.image == environment.image and found.environment_id == environment.environment_id
        assert len(calls.read_text().splitlines()) == 1
    finally:
        again.close()


def test_a_registry_that_does_not_answer_fails_the_environment(settings: BuilderSettings, kit) -> None:
    builder = EnvironmentBuilder(replace(settings, images=image_settings(f"127.0.0.1:{free_port()}")))
    try:
        environment = builder.resolve([kit.snapshot("tinymodel", kit.model_files())])
        failed = kit.wait_ready(builder, environment.environment_id)
        assert failed.state is EnvironmentState.FAILED
        assert "the registry did not say whether it has the image" in failed.message
        assert not (builder.root / "envs" / environment.environment_id).exists()
    finally:
        builder.close()
