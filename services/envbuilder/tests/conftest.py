"""Fixtures of the environment builder's tests: a wheelhouse built once per session, snapshots, a builder.

The wheelhouse (`tests/envbuilder_support.py`) holds tiny wheels written in the test and pydantic re-packed from this
test environment, so uv locks and installs with no network.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from envbuilder_support import build_wheelhouse
from images import base_image, oci_registry  # noqa: F401  (session fixtures: tests/images.py)
from simrun_core.snapshots.model import FileEntry
from simrun_core.snapshots.store import LocalFiles, SnapshotStore
from simrun_envbuilder.builder import BuilderSettings, Environment, EnvironmentBuilder, EnvironmentState
from simrun_envbuilder.lock import UvSettings, default_uv_command
from simrun_runtime.record import Provenance, SnapshotRef


@pytest.fixture(scope="session")
def wheelhouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Wheels every test locks against: tinydep 1.0 and 2.0, otherdep, tinyback, pydantic and its dependencies."""
    return build_wheelhouse(tmp_path_factory.mktemp("wheelhouse"))


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
            (str(uv_calls.with_name("uv-wrapper")),),
            cache_dir=uv_cache,
            find_links=(str(wheelhouse),),
            no_index=True,
            # The counting wrapper logs beside the test and execs a uv the sandbox does not know of; confinement
            # of the builds is tested end to end (tests/test_attacks_build.py) and in test_sandbox.py.
            confine=False,
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
