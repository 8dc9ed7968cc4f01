"""Images of environments: the Dockerfile of the concepts page, its name, the registry, and the image builder's
port with two adapters, BuildKit (`buildctl`, on a cluster) and buildah (one machine, the tests): the same Dockerfile
and the same name for both, pushed to the registry and named by digest.

The build context holds the Dockerfile, the lock project's `pyproject.toml` and `uv.lock`, and the runtime wheel,
no snapshot: the code comes from the snapshots a pod mounts. Layers: the base image by digest, the Debian
`system-packages` (and git when a locked package comes from git), uv, the locked dependencies with uv's downloads
in a BuildKit cache mount and their bytecode compiled, simrun-runtime last, so a new simrun rebuilds one layer.
There is no `# syntax=` line: it would pull a frontend image from a public hub.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import resource
import shutil
import ssl
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from simrun_core.errors import InvalidArgument

from simrun_envbuilder.venv import BuildError, Progress, run_logged

VENV = "/opt/simrun/venv"
UV_TOOL = "/opt/simrun/uv"
_DIGEST = re.compile(r"@sha256:[0-9a-f]{64}$")
MANIFEST_TYPES = (
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.docker.distribution.manifest.v2+json",
)


class RegistryError(RuntimeError):
    """The registry did not say whether it has an image: an error, never taken for "it exists"."""


@dataclass(frozen=True)
class ImageSettings:
    """Where images are built and pushed.

    Attributes:
        registry: host[:port] of the registry, e.g. `zot.simrun.svc:5000`.
        repository: the repository of environments in it, e.g. `simrun/environments`.
        base_images: the base image by digest (`name@sha256:…`) of each Python version, e.g. `{"3.11": …}`.
        insecure: the registry speaks plain HTTP (a registry on loopback or inside the cluster).
        buildctl: the BuildKit client command, and `buildkit_addr` the daemon's address (`tcp://buildkitd:1234`).
        ca_bundle: a CA bundle the image needs to reach the index (a proxy or a private CA); copied into it.
        uv_version: the uv the image installs.
        builder: `buildkit` (a daemon, on a cluster) or `buildah` (this machine, as root).
        buildah: the buildah command; `runtime` and `cgroup_manager` what its RUN steps use (crun refuses hybrid
            cgroups on some hosts; runc and cgroupfs work as root everywhere).
        ulimits: `--ulimit` values of buildah's RUN steps; empty: nofile and nproc at min(4096, this process's hard
            limit) (buildah's defaults exceed some hosts' hard limits and runc refuses them).
    """

    registry: str
    repository: str
    base_images: dict[str, str]
    insecure: bool = False
    buildctl: tuple[str, ...] = ("buildctl",)
    buildkit_addr: str = ""
    ca_bundle: Path | None = None
    uv_version: str = "0.13.9"
    index_url: str = ""
    username: str = ""
    password: str = field(default="", repr=False)
    builder: Literal["buildkit", "buildah"] = "buildkit"
    buildah: tuple[str, ...] = ("buildah",)
    runtime: str = "runc"
    cgroup_manager: str = "cgroupfs"
    ulimits: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for version, image in self.base_images.items():
            if not _DIGEST.search(image):
                raise InvalidArgument(f"the base image of Python {version} must be named by digest (…@sha256:…)")


def render_dockerfile(
    settings: ImageSettings,
    python_version: str,
    system_packages: list[str],
    uses_git: bool,
    runtime_wheel: str,
    builds_from_source: bool = False,
) -> str:
    """The Dockerfile of an environment; its text is part of the image's name. A lock with a package built from
    source gets no shared uv cache mount: the build runs that package's backend, which could write it."""
    base = settings.base_images.get(python_version)
    if base is None:
        raise InvalidArgument(f"no base image for Python {python_version}: configure one in environments.images")
    packages = sorted({*system_packages, *(["git"] if uses_git else [])})
    lines = [f"FROM {base}", "ENV DEBIAN_FRONTEND=noninteractive PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1"]
    if settings.ca_bundle is not None:
        lines += [
            "COPY ca-bundle.crt /etc/ssl/certs/simrun-ca-bundle.crt",
            "ENV SSL_CERT_FILE=/etc/ssl/certs/simrun-ca-bundle.crt PIP_CERT=/etc/ssl/certs/simrun-ca-bundle.crt",
        ]
    if packages:
        lines.append(
            "RUN apt-get update && apt-get install -y --no-install-recommends "
            + " ".join(packages)
            + " && rm -rf /var/lib/apt/lists/*"
        )
    index = f" --index-url {settings.index_url}" if settings.index_url else ""
    lines += [
        # uv in a venv of its own: a Debian base has no pip and refuses installs into its Python (PEP 668).
        f"RUN python{python_version} -m venv {UV_TOOL} && {UV_TOOL}/bin/pip install --quiet{index} "
        f"uv=={settings.uv_version} && ln -s {UV_TOOL}/bin/uv /usr/local/bin/uv",
        "WORKDIR /opt/simrun/lock",
        "COPY pyproject.toml uv.lock ./",
        f"ENV UV_PROJECT_ENVIRONMENT={VENV} UV_PYTHON_DOWNLOADS=never UV_COMPILE_BYTECODE=1 UV_LINK_MODE=copy",
        ("RUN " if builds_from_source else "RUN --mount=type=cache,target=/root/.cache/uv ")
        + f"uv venv --python python{python_version} {VENV} && "
        "uv sync --frozen --no-install-local --no-install-package simrun-runtime"
        + (f" --default-index {settings.index_url}" if settings.index_url else ""),
        f"COPY {runtime_wheel} /opt/simrun/",
        f"RUN uv pip install --python {VENV}/bin/python --no-deps --offline --compile-bytecode "
        f"/opt/simrun/{runtime_wheel}",
        f"ENV VIRTUAL_ENV={VENV} PATH={VENV}/bin:$PATH",
        "",
    ]
    return "\n".join(lines)


def image_tag(identity: str, python_version: str, runtime_version: str, dockerfile: str) -> str:
    """The image's tag: a hash of the lock's third-party packages, Python, simrun and the Dockerfile."""
    body = json.dumps([identity, python_version, runtime_version, hashlib.sha256(dockerfile.encode()).hexdigest()])
    return hashlib.sha256(body.encode()).hexdigest()[:32]


def write_context(folder: Path, dockerfile: str, lock_project: Path, settings: ImageSettings) -> None:
    """The build context: the Dockerfile, pyproject.toml, uv.lock and the runtime wheel (and the CA bundle)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "Dockerfile").write_text(dockerfile)
    for name in ("pyproject.toml", "uv.lock"):
        shutil.copyfile(lock_project / name, folder / name)
    for wheel in lock_project.glob("*.whl"):
        shutil.copyfile(wheel, folder / wheel.name)
    if settings.ca_bundle is not None:
        shutil.copyfile(settings.ca_bundle, folder / "ca-bundle.crt")


class ImageBuilder(Protocol):
    """The image builder's port: builds a context's Dockerfile, pushes it as `image` (`registry/repository:tag`) and
    returns the pushed manifest's digest. A failed build pushes no manifest: the tag appears only when all is there.
    """

    name: str

    def build(self, context: Path, image: str, log: Path, progress: Progress, timeout_s: float = 3600.0) -> str:
        """Builds and pushes; the digest of what was pushed.

        Raises:
            BuildError: the build or the push failed, with the builder's reason and the log's tail.
        """
        ...


def image_builder(settings: ImageSettings) -> ImageBuilder:
    """The adapter the settings name."""
    return Buildah(settings) if settings.builder == "buildah" else BuildKit(settings)


class RegistryClient:
    """Asks an OCI registry (distribution, Zot) whether it has a manifest, following a token challenge."""

    def __init__(self, settings: ImageSettings, timeout_s: float = 15.0) -> None:
        self._base = f"{'http' if settings.insecure else 'https'}://{settings.registry}"
        self._username = settings.username
        self._password = settings.password
        self._timeout_s = timeout_s
        self._context = ssl.create_default_context(cafile=str(settings.ca_bundle) if settings.ca_bundle else None)
        self._token: str | None = None

    def digest(self, repository: str, reference: str) -> str | None:
        """The digest of `repository:reference`, or None when the registry says it has none (404).

        Raises:
            RegistryError: any other answer, or no answer: the caller must not assume the image exists.
        """
        url = f"{self._base}/v2/{repository}/manifests/{reference}"
        headers = {"Accept": ", ".join(MANIFEST_TYPES)}
        for attempt in range(2):
            if self._token:
                headers["Authorization"] = self._token
            request = urllib.request.Request(url, method="HEAD", headers=headers)
            try:
                with urllib.request.urlopen(request, timeout=self._timeout_s, context=self._context) as response:
                    digest = response.headers.get("Docker-Content-Digest")
                    if not digest:
                        raise RegistryError(f"{url} answered without Docker-Content-Digest")
                    return str(digest)
            except urllib.error.HTTPError as exc:
                if exc.code == 404:
                    return None
                if exc.code == 401 and attempt == 0:
                    self._token = self._authorize(exc.headers.get("WWW-Authenticate", ""))
                    continue
                if exc.code == 401:
                    raise RegistryError(
                        f"{url} refused the credentials (401): check environments.images.username and password_file"
                    ) from None
                raise RegistryError(f"{url} answered {exc.code} {exc.reason}") from None
            except (urllib.error.URLError, OSError) as exc:
                raise RegistryError(f"cannot reach the registry at {self._base}: {exc}") from None
        raise RegistryError(f"{url} refused the credentials")

    def size(self, repository: str, digest: str) -> int:
        """Bytes of an image as stored (its config and compressed layers); of linux/amd64 in an index.

        Raises:
            RegistryError: no such manifest, or no answer.
        """
        manifest = self._manifest(repository, digest)
        if "manifests" in manifest:
            chosen = [
                m
                for m in manifest["manifests"]
                if m.get("platform", {}).get("os") == "linux" and m.get("platform", {}).get("architecture") == "amd64"
            ] or manifest["manifests"]
            if not chosen:
                raise RegistryError(f"{repository}@{digest} is an empty index")
            manifest = self._manifest(repository, chosen[0]["digest"])
        parts = [manifest.get("config", {}), *manifest.get("layers", [])]
        return sum(int(part.get("size", 0)) for part in parts)

    def _manifest(self, repository: str, reference: str) -> dict[str, Any]:
        url = f"{self._base}/v2/{repository}/manifests/{reference}"
        headers = {"Accept": ", ".join(MANIFEST_TYPES)}
        if self._token:
            headers["Authorization"] = self._token
        try:
            with urllib.request.urlopen(
                urllib.request.Request(url, headers=headers), timeout=self._timeout_s, context=self._context
            ) as response:
                data: dict[str, Any] = json.loads(response.read())
                return data
        except urllib.error.HTTPError as exc:
            if exc.code == 401 and not self._token:
                self._token = self._authorize(exc.headers.get("WWW-Authenticate", ""))
                return self._manifest(repository, reference)
            raise RegistryError(f"{url} answered {exc.code} {exc.reason}") from None
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise RegistryError(f"cannot read {url}: {exc}") from None

    def _authorize(self, challenge: str) -> str:
        """The Authorization header a 401 challenge asks for: Basic with the credentials, or a Bearer token."""
        scheme, _, params = challenge.partition(" ")
        basic = base64.b64encode(f"{self._username}:{self._password}".encode()).decode()
        if scheme.lower() == "basic":
            if not self._username:
                raise RegistryError(
                    "the registry asks for credentials and none are configured: set environments.images.username "
                    "and password_file"
                )
            return f"Basic {basic}"
        if scheme.lower() != "bearer":
            raise RegistryError(f"the registry asks for {scheme or 'an unknown'} authentication")
        fields = dict(re.findall(r'(\w+)="([^"]*)"', params))
        if "realm" not in fields:
            raise RegistryError("the registry's token challenge names no realm")
        query = urllib.parse.urlencode({k: v for k, v in fields.items() if k in ("service", "scope")})
        request = urllib.request.Request(f"{fields['realm']}?{query}")
        if self._username:
            request.add_header("Authorization", f"Basic {basic}")
        try:
            with urllib.request.urlopen(request, timeout=self._timeout_s, context=self._context) as response:
                data = json.loads(response.read())
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise RegistryError(f"the registry's token service failed: {exc}") from None
        token = data.get("token") or data.get("access_token")
        if not token:
            raise RegistryError("the registry's token service answered without a token")
        return f"Bearer {token}"


class BuildKit:
    """Builds a context with BuildKit and pushes the image: `buildctl build … --output type=image,push=true`.

    BuildKit pushes the manifest after every layer, so a failed build leaves no tag in the registry.
    """

    name = "BuildKit"

    def __init__(self, settings: ImageSettings) -> None:
        self._settings = settings

    def command(self, context: Path, image: str, metadata: Path) -> list[str]:
        s = self._settings
        output = f"type=image,name={image},push=true" + (",registry.insecure=true" if s.insecure else "")
        return [
            *s.buildctl,
            *(["--addr", s.buildkit_addr] if s.buildkit_addr else []),
            "build",
            "--frontend",
            "dockerfile.v0",
            "--local",
            f"context={context}",
            "--local",
            f"dockerfile={context}",
            "--output",
            output,
            "--metadata-file",
            str(metadata),
            "--progress",
            "plain",
        ]

    def build(self, context: Path, image: str, log: Path, progress: Progress, timeout_s: float = 3600.0) -> str:
        """Builds and pushes; returns the pushed image's digest from BuildKit's metadata file.

        Raises:
            BuildError: the build failed, with BuildKit's reason and the log's tail.
        """
        metadata = context.parent / "metadata.json"
        run_logged(self.command(context, image, metadata), "buildctl build", log, progress, _env(), timeout_s=timeout_s)
        try:
            digest = json.loads(metadata.read_text())["containerimage.digest"]
        except (FileNotFoundError, ValueError, KeyError) as exc:
            raise BuildError(f"buildctl wrote no image digest ({exc})") from None
        return str(digest)


class Buildah:
    """Builds a context with `buildah bud` into this machine's storage, then `buildah push`es it, reading the
    pushed digest from `--digestfile`. The manifest is the push's last request, so a build or a push that fails
    leaves no tag in the registry; the local image of a failed push is removed. Needs root (or a rootless setup).
    """

    name = "buildah"

    def __init__(self, settings: ImageSettings) -> None:
        self._settings = settings

    def ulimits(self) -> tuple[str, ...]:
        if self._settings.ulimits:
            return self._settings.ulimits
        limits = []
        for name, kind in (("nofile", resource.RLIMIT_NOFILE), ("nproc", resource.RLIMIT_NPROC)):
            hard = resource.getrlimit(kind)[1]
            value = 4096 if hard == resource.RLIM_INFINITY else min(4096, hard)
            limits.append(f"{name}={value}:{value}")
        return tuple(limits)

    def bud_command(self, context: Path, image: str) -> list[str]:
        s = self._settings
        return [
            *s.buildah,
            "--cgroup-manager",
            s.cgroup_manager,
            "bud",
            "--runtime",
            s.runtime,
            "--layers",
            "--force-rm",  # a failed step leaves no working container behind
            # An insecure registry holds the base too (one machine): pull it over plain HTTP as well.
            *(["--tls-verify=false"] if s.insecure else []),
            *[arg for limit in self.ulimits() for arg in ("--ulimit", limit)],
            "--file",
            str(context / "Dockerfile"),
            "--tag",
            image,
            str(context),
        ]

    def push_command(self, image: str, digest_file: Path, authfile: Path | None) -> list[str]:
        s = self._settings
        return [
            *s.buildah,
            "push",
            *(["--tls-verify=false"] if s.insecure else []),
            *(["--authfile", str(authfile)] if authfile is not None else []),
            "--digestfile",
            str(digest_file),
            image,
            f"docker://{image}",
        ]

    def build(self, context: Path, image: str, log: Path, progress: Progress, timeout_s: float = 3600.0) -> str:
        """Builds, pushes, and returns the pushed manifest's digest.

        Raises:
            BuildError: `buildah bud` or `buildah push` failed, with buildah's reason and the log's tail.
        """
        s = self._settings
        run_logged(self.bud_command(context, image), "buildah bud", log, progress, _env(), timeout_s=timeout_s)
        digest_file = context.parent / "digest"
        authfile = None
        if s.username:
            authfile = context.parent / "auth.json"
            secret = base64.b64encode(f"{s.username}:{s.password}".encode()).decode()
            fd = os.open(authfile, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as out:
                json.dump({"auths": {s.registry: {"auth": secret}}}, out)
        try:
            run_logged(
                self.push_command(image, digest_file, authfile), "buildah push", log, progress, _env(), timeout_s=600
            )
            digest = digest_file.read_text().strip()
        except (BuildError, OSError) as exc:
            subprocess.run([*s.buildah, "rmi", image], capture_output=True, check=False)
            if isinstance(exc, BuildError):
                raise
            raise BuildError(f"buildah push wrote no digest ({exc})") from None
        finally:
            if authfile is not None:
                authfile.unlink(missing_ok=True)
        if not digest.startswith("sha256:"):
            raise BuildError(f"buildah push wrote no digest ({digest!r})")
        return digest


def _env() -> dict[str, str]:
    return dict(os.environ)


__all__ = [
    "VENV",
    "BuildKit",
    "Buildah",
    "ImageBuilder",
    "ImageSettings",
    "RegistryClient",
    "RegistryError",
    "image_builder",
    "render_dockerfile",
]
