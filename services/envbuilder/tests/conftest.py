"""Fixtures of the environment builder's tests: a wheelhouse built once per session, snapshots, a builder.

The wheelhouse holds tiny wheels written here (two versions of a dependency, a PEP 517/660 build backend), and
pydantic with its dependencies re-packed from this test environment, so uv locks and installs with no network.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from simrun_envbuilder.builder import BuilderSettings, Environment, EnvironmentBuilder, EnvironmentState
from simrun_envbuilder.lock import UvSettings, default_uv_command
from simrun_envbuilder.wheels import write_wheel
from simrun_runtime.record import Provenance, SnapshotRef
from simrun_snapshot.model import FileEntry
from simrun_snapshot.store import LocalFiles, SnapshotStore

BACKEND = '''
"""tinyback: a build backend small enough to read; editable installs are a .pth naming the source folder."""
import base64, hashlib, os, re, tomllib, zipfile

def _project(root="."):
    with open(os.path.join(root, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)["project"]

def _norm(name):
    return re.sub(r"[-_.]+", "_", name).lower()

def _dist_info(project):
    name, version = project["name"], project["version"]
    lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    lines += [f"Requires-Dist: {r}" for r in project.get("dependencies", [])]
    files = {"METADATA": "\\n".join(lines) + "\\n",
             "WHEEL": "Wheel-Version: 1.0\\nGenerator: tinyback\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n"}
    eps = project.get("entry-points", {})
    if eps:
        files["entry_points.txt"] = "".join(
            f"[{g}]\\n" + "".join(f"{k} = {v}\\n" for k, v in items.items()) + "\\n" for g, items in eps.items())
    return f"{_norm(name)}-{version}.dist-info", files

def _write(directory, project, members):
    info, files = _dist_info(project)
    members = dict(members)
    for k, v in files.items():
        members[f"{info}/{k}"] = v.encode()
    record = []
    for path, data in members.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append(f"{info}/RECORD,,")
    members[f"{info}/RECORD"] = ("\\n".join(record) + "\\n").encode()
    name = f"{_norm(project['name'])}-{project['version']}-py3-none-any.whl"
    with zipfile.ZipFile(os.path.join(directory, name), "w") as z:
        for path, data in members.items():
            z.writestr(path, data)
    return name

def get_requires_for_build_wheel(config_settings=None):
    return []

get_requires_for_build_editable = get_requires_for_build_wheel

def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    info, files = _dist_info(_project())
    os.makedirs(os.path.join(metadata_directory, info))
    for k, v in files.items():
        with open(os.path.join(metadata_directory, info, k), "w") as f:
            f.write(v)
    return info

prepare_metadata_for_build_editable = prepare_metadata_for_build_wheel

def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    project = _project()
    package = _norm(project["name"])
    members = {}
    for folder, _, names in os.walk(package):
        for n in names:
            if n.endswith(".py"):
                path = os.path.join(folder, n)
                with open(path, "rb") as f:
                    members[path.replace(os.sep, "/")] = f.read()
    return _write(wheel_directory, project, members)

def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    project = _project()
    return _write(wheel_directory, project, {f"_{_norm(project['name'])}_editable.pth": os.getcwd().encode() + b"\\n"})
'''


def wheel_from_installed(name: str, dest: Path) -> Path:
    """Re-packs an installed distribution of this test environment as a wheel (files from its RECORD)."""
    dist = importlib.metadata.distribution(name)
    files: dict[str, bytes] = {}
    info_dir = ""
    for item in dist.files or []:
        posix = item.as_posix()
        if posix.startswith("..") or posix.endswith((".pyc", "/RECORD", "INSTALLER", "REQUESTED")):
            continue
        if "__pycache__" in posix or posix.endswith("direct_url.json"):
            continue
        path = Path(str(dist.locate_file(item)))
        if path.is_file():
            files[posix] = path.read_bytes()
        if posix.endswith(".dist-info/METADATA"):
            info_dir = posix.rsplit("/", 1)[0]
    tag = next(
        line.split(":", 1)[1].strip()
        for line in files[f"{info_dir}/WHEEL"].decode().splitlines()
        if line.startswith("Tag:")
    )
    record = []
    for path, data in sorted(files.items()):
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append(f"{info_dir}/RECORD,,")
    files[f"{info_dir}/RECORD"] = ("\n".join(record) + "\n").encode()
    stem = info_dir.removesuffix(".dist-info")
    wheel = dest / f"{stem}-{tag}.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as archive:
        for path, data in sorted(files.items()):
            archive.writestr(path, data)
    return wheel


@pytest.fixture(scope="session")
def wheelhouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Wheels every test locks against: tinydep 1.0 and 2.0, otherdep, tinyback, pydantic and its dependencies."""
    dest = tmp_path_factory.mktemp("wheelhouse")
    for version in ("1.0", "2.0"):
        write_wheel(dest, "tinydep", version, {"tinydep/__init__.py": f"VERSION = {version!r}\n".encode()})
    write_wheel(dest, "otherdep", "1.0", {"otherdep/__init__.py": b""}, requires=["tinydep==2.0"])
    write_wheel(dest, "tinyback", "1.0", {"tinyback/__init__.py": BACKEND.encode()})
    for name in ("pydantic", "pydantic-core", "typing-extensions", "annotated-types", "typing-inspection"):
        wheel_from_installed(name, dest)
    return dest


@pytest.fixture(scope="session")
def uv_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("uv-cache")


@pytest.fixture
def uv_calls(tmp_path: Path) -> Path:
    """A uv command that logs each call to a file, so a test can tell that a step started no uv process."""
    calls = tmp_path / "uv-calls.log"
    wrapper = tmp_path / "uv-wrapper"
    wrapper.write_text(f'#!/bin/sh\necho "$@" >> {calls}\nexec {" ".join(default_uv_command())} "$@"\n')
    wrapper.chmod(0o755)
    calls.touch()
    return calls


@pytest.fixture
def settings(tmp_path: Path, wheelhouse: Path, uv_cache: Path, uv_calls: Path) -> BuilderSettings:
    return BuilderSettings(
        root=tmp_path / "environments",
        store=tmp_path / "store",
        uv=UvSettings(
            (str(uv_calls.with_name("uv-wrapper")),), cache_dir=uv_cache, find_links=(str(wheelhouse),), no_index=True
        ),
        compile_bytecode=False,
    )


@pytest.fixture
def builder(settings: BuilderSettings) -> Iterator[EnvironmentBuilder]:
    built = EnvironmentBuilder(settings)
    yield built
    built.close()


def model_files(
    name: str = "tinymodel",
    dependencies: tuple[str, ...] = ("tinydep==1.0",),
    code: str = "v1",
    extra: str = "",
    requires_python: str = ">=3.11",
) -> dict[str, str]:
    """The files of a tiny model: a pyproject.toml with a simrun.task_types entry point and one module."""
    package = name.replace("-", "_")
    return {
        "pyproject.toml": f"""[project]
name = "{name}"
version = "0.1.0"
requires-python = "{requires_python}"
dependencies = {list(dependencies)!r}

[project.entry-points."simrun.task_types"]
{package} = "{package}.tasks"

[build-system]
requires = ["tinyback==1.0"]
build-backend = "tinyback"
{extra}""".replace("'", '"'),
        f"{package}/__init__.py": f"CODE = {code!r}\n",
        f"{package}/tasks.py": "",
    }


def snapshot(store_root: Path, name: str, files: dict[str, str], tmp: Path) -> SnapshotRef:
    """Writes a folder of `files` into the store as a snapshot named `name`; returns its reference."""
    folder = tmp / f"tree-{name}-{hashlib.sha256(repr(sorted(files.items())).encode()).hexdigest()[:8]}"
    entries = []
    for path, text in files.items():
        target = folder / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        data = text.encode()
        entries.append(FileEntry(path, hashlib.sha256(data).hexdigest(), len(data)))
    result = SnapshotStore(store_root).write(name, entries, Provenance(), LocalFiles(folder))
    return result.snapshot.to_ref()


def wait_ready(builder: EnvironmentBuilder, environment_id: str, timeout_s: float = 100) -> Environment:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        environment = builder.get(environment_id)
        if environment.state is not EnvironmentState.BUILDING:
            return environment
        time.sleep(0.05)
    raise AssertionError(f"environment {environment_id} still building after {timeout_s} s")


def uv_call_count(calls: Path) -> int:
    return len(calls.read_text().splitlines())


class Kit:
    """The helpers of these tests, as a fixture (test modules cannot import conftest under importlib mode)."""

    def __init__(self, store: Path, tmp: Path, calls: Path) -> None:
        self.store = store
        self.tmp = tmp
        self.calls = calls
        self.model_files = model_files
        self.wait_ready = wait_ready

    def snapshot(self, name: str, files: dict[str, str]) -> SnapshotRef:
        return snapshot(self.store, name, files, self.tmp)

    def uv_calls(self) -> int:
        return uv_call_count(self.calls)


@pytest.fixture
def kit(settings: BuilderSettings, tmp_path: Path, uv_calls: Path) -> Kit:
    return Kit(settings.store, tmp_path, uv_calls)
