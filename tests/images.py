"""Images for tests: a base image made from Debian's packages once per machine, and an OCI registry on loopback.

No public image hub is reachable here, so the base image is made with `debootstrap --variant=minbase` (Python 3,
venv, CA certificates) and `podman import`, named by a hash of what went into it (`localhost/simrun-test-base:<hash>`)
and kept in podman's storage: a second test session on the machine finds it and makes nothing. A file lock makes
concurrent sessions make it once. The registry is Debian's `docker-registry` (the CNCF distribution registry);
`scripts/test` installs podman, buildah, runc, debootstrap and docker-registry with apt-get. Without them (or without
root) the tests that use these fixtures are skipped, never faked.

Use from a `conftest.py` (pytest runs with `tests` on `sys.path`)::

    from images import base_image, oci_registry  # noqa: F401  (session fixtures)

then, in a test::

    def test_x(base_image: BaseImage, oci_registry: Registry) -> None:
        base_image.pushed   # "127.0.0.1:PORT/simrun/base@sha256:…": FROM this, by digest, as on a cluster
        base_image.local    # "localhost/simrun-test-base:<hash>" in podman's local storage
        oci_registry.address  # "127.0.0.1:PORT" (plain HTTP: --tls-verify=false)

`PODMAN` and `BUILDAH` are the command prefixes that work on these machines (runc, cgroupfs; crun refuses hybrid
cgroups) and `ULIMITS` the limits a container needs (the default nofile is above the hard limit; runc refuses the
default nproc).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import resource
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REGISTRY_BINARY = "/usr/bin/docker-registry"
SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
PACKAGES = ("python3", "python3-venv", "ca-certificates")
BASE_NAME = "localhost/simrun-test-base"
BASE_PYTHON = "3.11"  # bookworm's python3
LOCK_FILE = Path("/var/tmp/simrun-test-base.lock")
BASE_RECIPE = 1  # bump when the way the base is made changes: a new name, a new image

PODMAN = ("podman", "--runtime", "runc", "--cgroup-manager", "cgroupfs")
BUILDAH = ("buildah", "--cgroup-manager", "cgroupfs")


def _ulimit(kind: int, cap: int) -> int:
    hard = resource.getrlimit(kind)[1]
    return cap if hard == resource.RLIM_INFINITY else min(cap, hard)


NOFILE = _ulimit(resource.RLIMIT_NOFILE, 4096)
NPROC = _ulimit(resource.RLIMIT_NPROC, 4096)
ULIMITS = ("--ulimit", f"nofile={NOFILE}:{NOFILE}", "--ulimit", f"nproc={NPROC}:{NPROC}")


@dataclass(frozen=True)
class Registry:
    """A distribution registry serving plain HTTP on loopback."""

    address: str
    storage: Path


@dataclass(frozen=True)
class BaseImage:
    """The test base image: in podman's local storage, and pushed to the session's registry (named by digest)."""

    local: str
    pushed: str
    python_version: str = BASE_PYTHON


def missing_tools(*names: str) -> list[str]:
    """The commands among `names` not on PATH (the image tests need root and these)."""
    return [name for name in names if shutil.which(name) is None]


def require_image_tools() -> None:
    """Skips the calling test unless podman, buildah, runc and debootstrap run here as root."""
    missing = missing_tools("podman", "buildah", "runc", "debootstrap")
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed (scripts/test installs them with apt-get)")
    if os.geteuid() != 0:
        pytest.skip("images are built as root here (debootstrap, podman's root storage)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve_registry(folder: Path, storage: Path, auth: str = "") -> tuple[str, subprocess.Popen[bytes]]:
    """A real distribution registry on loopback storing in `storage` (`auth`: a config's `auth:` value)."""
    if not os.access(REGISTRY_BINARY, os.X_OK):
        pytest.skip("Debian's docker-registry is not installed (scripts/test installs it)")
    folder.mkdir(parents=True, exist_ok=True)
    address = f"127.0.0.1:{free_port()}"
    (folder / "config.yml").write_text(
        f"version: 0.1\nlog: {{level: error}}\nstorage: {{filesystem: {{rootdirectory: {storage}}}, "
        "delete: {enabled: true}}\n"
        f"http: {{addr: {address}}}\n" + (f"auth: {auth}\n" if auth else "")
    )
    proc = subprocess.Popen(
        [REGISTRY_BINARY, "serve", str(folder / "config.yml")], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 20
    while True:
        try:
            urllib.request.urlopen(f"http://{address}/v2/", timeout=1).close()
            return address, proc
        except urllib.error.HTTPError:
            return address, proc  # it answers (401 with auth)
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                proc.wait()
                raise AssertionError("the registry did not start") from None
            time.sleep(0.1)


def base_image_name() -> str:
    """The local base image's name: a hash of the suite, the mirror, the packages and the recipe."""
    content = hashlib.sha256(repr((SUITE, MIRROR, sorted(PACKAGES), BASE_RECIPE)).encode()).hexdigest()[:16]
    return f"{BASE_NAME}:{content}"


def ensure_base_image() -> str:
    """Makes the base image in podman's local storage unless it is there already; returns its name.

    About 70 s and 275 MB the first time on a machine (debootstrap from Debian's mirror), nothing after.
    """
    require_image_tools()
    name = base_image_name()
    LOCK_FILE.parent.mkdir(parents=True, exist_ok=True)
    with LOCK_FILE.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if subprocess.run(["podman", "image", "exists", name], check=False).returncode == 0:
            return name
        with tempfile.TemporaryDirectory(prefix="simrun-base-", dir="/var/tmp") as tmp:
            root = Path(tmp) / "root"
            log = Path(tmp) / "debootstrap.log"
            with log.open("wb") as out:
                made = subprocess.run(
                    [
                        "debootstrap",
                        "--variant=minbase",
                        f"--include={','.join(PACKAGES)}",
                        SUITE,
                        str(root),
                        MIRROR,
                    ],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    check=False,
                )
            if made.returncode != 0:
                tail = log.read_text(errors="replace")[-2000:]
                raise AssertionError(f"debootstrap failed ({made.returncode}):\n{tail}")
            tar = subprocess.Popen(["tar", "-C", str(root), "--numeric-owner", "-c", "."], stdout=subprocess.PIPE)
            imported = subprocess.run(
                ["podman", "import", "--change", "CMD=/bin/bash", "-", name],
                stdin=tar.stdout,
                capture_output=True,
                check=False,
            )
            assert tar.stdout is not None
            tar.stdout.close()
            if tar.wait() != 0 or imported.returncode != 0:
                raise AssertionError(f"podman import of the base failed: {imported.stderr.decode(errors='replace')}")
        return name


def push_by_digest(local: str, target: str) -> str:
    """Pushes a local image to `target` (`registry/repo:tag`, plain HTTP); returns `registry/repo@digest`."""
    with tempfile.TemporaryDirectory() as tmp:
        digest_file = Path(tmp) / "digest"
        subprocess.run(
            ["podman", "push", "--quiet", "--tls-verify=false", "--digestfile", str(digest_file), local, target],
            check=True,
            capture_output=True,
        )
        digest = digest_file.read_text().strip()
    head, _, last = target.rpartition("/")
    repository = f"{head}/{last.split(':', 1)[0]}"
    return f"{repository}@{digest}"


@pytest.fixture(scope="session")
def oci_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    """A real distribution registry on loopback for the session (deletes enabled, so a test can clean up)."""
    folder = tmp_path_factory.mktemp("oci-registry")
    address, proc = serve_registry(folder / "config", folder / "data")
    try:
        yield Registry(address, folder / "data")
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture(scope="session")
def base_image(oci_registry: Registry) -> BaseImage:
    """The Debian base image (made once per machine) pushed to the session's registry and named by digest."""
    local = ensure_base_image()
    return BaseImage(local=local, pushed=push_by_digest(local, f"{oci_registry.address}/simrun/base:{SUITE}"))


__all__ = [
    "BUILDAH",
    "PODMAN",
    "ULIMITS",
    "BaseImage",
    "Registry",
    "base_image",
    "ensure_base_image",
    "free_port",
    "oci_registry",
    "push_by_digest",
    "require_image_tools",
    "serve_registry",
]


def image_with_files(base: str, files: dict[str, str], repository: str) -> str:
    """An image of `base` with `files` (path in the image -> text; a script, `#!…`, executable) added, in podman's
    local storage and named by digest (`localhost/<repository>@sha256:…`, as pods name images); made once per
    content on a machine."""
    content = hashlib.sha256(repr((base, sorted(files.items()), "modes")).encode()).hexdigest()[:16]
    name = f"localhost/{repository}:{content}"
    with LOCK_FILE.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if subprocess.run(["podman", "image", "exists", name], check=False).returncode != 0:
            container = subprocess.run(
                [*BUILDAH, "from", "--quiet", base], capture_output=True, text=True, check=True
            ).stdout.strip()
            try:
                with tempfile.TemporaryDirectory() as tmp:
                    for path, text in files.items():
                        local = Path(tmp) / path.lstrip("/")
                        local.parent.mkdir(parents=True, exist_ok=True)
                        local.write_text(text)
                        local.chmod(0o755 if text.startswith("#!") else 0o644)
                    subprocess.run([*BUILDAH, "copy", "--quiet", container, f"{tmp}/", "/"], check=True)
                subprocess.run([*BUILDAH, "commit", "--quiet", container, name], check=True, capture_output=True)
            finally:
                subprocess.run([*BUILDAH, "rm", container], check=False, capture_output=True)
    digest = subprocess.run(
        ["podman", "image", "inspect", "--format", "{{.Digest}}", name], capture_output=True, text=True, check=True
    ).stdout.strip()
    return f"localhost/{repository}@{digest}"
