"""Which build of the simulator runs, and that the compiled and the pure-Python modules agree bit for bit.

Where a C compiler and the Python headers exist (this machine, CI) the install must have compiled the
hot modules and the package must run them: a broken compile fails here instead of hiding behind the
pure-Python fallback. The rules that keep an edited source from being shadowed by a stale extension
are tested on a package laid out in a temporary folder.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path

import cluster_sim
import pytest
from cluster_sim import _build

TESTS = Path(__file__).resolve().parent

# Cases of test_recorded_runs.py, small and varied: every queue order, borrowing with a delay, overloaded
# flows with the aging guard reserving machines.
CASES = (
    "seed7-8m/borrowing-delay/varied",
    "seed11-overloaded/aging-600/varied",
    "seed2-overloaded/aging-0-borrowing/constant",
)

_DIGESTS = """
import json, sys
sys.path.insert(0, sys.argv[1])
import cluster_sim
from test_recorded_runs import CONFIGS, FLOWS, POLICIES, RECORDED, run_digest
digests = {}
for case in sys.argv[2:]:
    flow, config, policy = case.split("/")
    digests[case] = run_digest(cluster_sim.ClusterSimulator, FLOWS[flow](), CONFIGS[config], POLICIES[policy])
recorded = {case: RECORDED[case] for case in sys.argv[2:]}
print(json.dumps({"build": cluster_sim.BUILD.name, "digests": digests, "recorded": recorded}))
"""


def _why_not_compilable() -> str | None:
    """Why this interpreter cannot build C extensions (the build hook's own checks), or None."""
    headers = Path(sysconfig.get_paths()["include"], "Python.h")
    if not headers.is_file():
        return f"no Python headers ({headers})"
    compiler = (os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(compiler) is None:
        return f"no C compiler ({compiler})"
    return None


def _start_digests(pure: bool) -> subprocess.Popen[str]:
    """A fresh interpreter computing the digests of :data:`CASES`, pure or with the installed build."""
    env = {k: v for k, v in os.environ.items() if k != "CLUSTER_SIM_PURE"}
    if pure:
        env["CLUSTER_SIM_PURE"] = "1"
    command = [sys.executable, "-c", _DIGESTS, str(TESTS), *CASES]
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _digests(process: subprocess.Popen[str]) -> dict[str, object]:
    stdout, stderr = process.communicate(timeout=100)
    assert process.returncode == 0, stderr
    return json.loads(stdout)


def test_the_compiled_build_runs_where_it_can_be_built() -> None:
    if os.environ.get("CLUSTER_SIM_PURE"):
        pytest.skip("CLUSTER_SIM_PURE is set: the pure-Python modules run by request")
    why_not = _why_not_compilable()
    if why_not is not None:
        pytest.skip(f"nothing can be compiled here: {why_not}")
    assert cluster_sim.BUILD.compiled, cluster_sim.BUILD.detail
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    for module in _build.COMPILED:
        assert str(sys.modules[f"cluster_sim.{module}"].__file__).endswith(suffix)


def test_the_compiled_and_the_pure_modules_give_the_recorded_runs() -> None:
    # Both at once (each is a fresh interpreter): the test costs the longer of the two.
    processes = [_start_digests(pure=True), _start_digests(pure=False)]
    try:
        pure, installed = _digests(processes[0]), _digests(processes[1])
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.communicate()
    assert pure["build"] == "pure"
    assert pure["digests"] == pure["recorded"]
    assert installed["build"] == cluster_sim.BUILD.name
    assert installed["digests"] == pure["digests"]


# The rules of cluster_sim._build, on a package laid out in a temporary folder --------------------


def _package(root: Path, name: str) -> Path:
    package = root / name
    package.mkdir(parents=True)
    (package / "_structures.py").write_text("WHERE = 'source'\n")
    (package / "simulator.py").write_text("WHERE = 'source'\n")
    return package


def _record(folder: Path, package: Path, **fields: object) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    sources = {m: hashlib.sha256((package / f"{m}.py").read_bytes()).hexdigest() for m in _build.COMPILED}
    (folder / "_build.json").write_text(json.dumps({"sources": sources, "compiled": True, "mypy": "x", **fields}))


@pytest.fixture
def fake_name(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    name = "cluster_sim_build_probe"
    monkeypatch.delenv("CLUSTER_SIM_PURE", raising=False)
    yield name
    for module in [m for m in sys.modules if m.startswith(f"{name}.")]:
        del sys.modules[module]


def test_an_edited_source_runs_as_edited_never_a_stale_extension(tmp_path: Path, fake_name: str) -> None:
    package = _package(tmp_path, fake_name)
    _record(package, package)  # a standard install: the extensions and the record beside the sources
    (package / "simulator.py").write_text("WHERE = 'edited source'\n")
    path = [str(package)]
    with pytest.warns(RuntimeWarning, match=r"simulator\.py changed since the compiled build"):
        build = _build.select(package, fake_name, path)
    assert not build.compiled and "uv sync --reinstall-package cluster-sim" in build.detail
    # The sources were imported ahead of any extension beside them.
    assert sys.modules[f"{fake_name}.simulator"].WHERE == "edited source"
    assert path == [str(package)]


def test_an_editable_install_puts_its_extensions_first_while_the_sources_match(
    tmp_path: Path, fake_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = _package(tmp_path / "src", fake_name)
    site = tmp_path / "site-packages"
    _record(site / "cluster_sim", package)  # the editable wheel's folder, found on sys.path
    monkeypatch.setattr(sys, "path", [str(site), *sys.path])
    path = [str(package)]
    build = _build.select(package, fake_name, path)
    assert build.compiled, build.detail
    assert path == [str(site / "cluster_sim"), str(package)]

    (package / "_structures.py").write_text("WHERE = 'edited'\n")
    path = [str(package)]
    with pytest.warns(RuntimeWarning, match=r"_structures\.py changed"):
        build = _build.select(package, fake_name, path)
    assert not build.compiled and path == [str(package)]


def test_pure_by_request_or_where_nothing_was_compiled(
    tmp_path: Path, fake_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = _package(tmp_path, fake_name)
    _record(package, package, compiled=False, reason="no C compiler ('cc' is not on PATH)")
    build = _build.select(package, fake_name, [str(package)])
    assert not build.compiled and "no C compiler" in build.detail
    _record(package, package)
    monkeypatch.setenv("CLUSTER_SIM_PURE", "1")
    build = _build.select(package, fake_name, [str(package)])
    assert build == _build.Build(False, "CLUSTER_SIM_PURE is set")
    assert sys.modules[f"{fake_name}.simulator"].__file__ == str(package / "simulator.py")
