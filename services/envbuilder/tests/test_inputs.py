"""What an environment is locked from, read from snapshots (no uv), and the choice of the Python."""

from __future__ import annotations

import sys
from pathlib import PurePosixPath

import pytest
from simrun_core.errors import InvalidArgument, NotFound
from simrun_envbuilder.inputs import read_inputs, tree_places
from simrun_envbuilder.pythons import Interpreter, choose, installed
from simrun_runtime.layout import StoreLayout


def test_places_and_digest_follow_the_pyprojects_not_the_code(kit) -> None:
    store = StoreLayout(kit.store)
    lib = kit.snapshot("lib", {"pyproject.toml": '[project]\nname = "lib"\nversion = "1"\n'})
    extra = '\n[tool.uv.sources]\nlib = { path = "../lib" }\ninner = { path = "packages/inner" }\n'
    one = kit.snapshot("m", kit.model_files(extra=extra, code="a"))
    two = kit.snapshot("m", kit.model_files(extra=extra, code="b"))
    a, b = read_inputs(store, [one, lib]), read_inputs(store, [two, lib])
    assert a is not None and b is not None
    assert [s.place for s in a.sources] == [PurePosixPath("."), PurePosixPath("../lib")]
    assert a.digest("x") == b.digest("x") != a.digest("y")
    assert {p.as_posix() for p in tree_places(a)} == {"tree/_", "tree/lib"}
    # the library has no [build-system]: PEP 517 builds it with setuptools
    assert a.build_requires == ["tinyback==1.0", "setuptools>=40.8.0"] and a.project_name == "tinymodel"


def test_refusals(kit) -> None:
    store = StoreLayout(kit.store)
    absolute = kit.snapshot("m", kit.model_files(extra='\n[tool.uv.sources]\nlib = { path = "/opt/lib" }\n'))
    with pytest.raises(InvalidArgument, match="absolute path"):
        read_inputs(store, [absolute])
    bad = kit.snapshot("m", {"pyproject.toml": "[project\nname="})
    with pytest.raises(InvalidArgument, match="not valid TOML"):
        read_inputs(store, [bad])
    debian = kit.snapshot("m", kit.model_files(extra='\n[tool.simrun]\nsystem-packages = ["Bad Name"]\n'))
    with pytest.raises(InvalidArgument, match="not a Debian package name"):
        read_inputs(store, [debian])
    missing = absolute.model_copy(update={"snapshot_id": "0" * 32, "path": "snapshots/m/" + "0" * 32})
    with pytest.raises(NotFound):
        read_inputs(store, [missing])
    assert read_inputs(store, [kit.snapshot("m", {"pyproject.toml": "[tool.ruff]\nline-length = 100\n"})]) is None


def test_dynamic_dependencies_lock_per_snapshot(kit) -> None:
    store = StoreLayout(kit.store)
    files = kit.model_files()
    files["pyproject.toml"] = files["pyproject.toml"].replace(
        'version = "0.1.0"', 'version = "0.1.0"\ndynamic = ["dependencies"]'
    )
    one = read_inputs(store, [kit.snapshot("m", {**files, "requirements.txt": "tinydep==1.0\n"})])
    two = read_inputs(store, [kit.snapshot("m", {**files, "requirements.txt": "tinydep==2.0\n"})])
    assert one is not None and two is not None and one.digest() != two.digest()


def test_the_python_is_the_servers_when_it_fits_else_the_newest_that_does() -> None:
    own = (sys.version_info.major, sys.version_info.minor, 0)
    pythons = [Interpreter((3, 13, 0), "/p313"), Interpreter(own, "/own"), Interpreter((3, 11, 9), "/p311")]
    assert choose(">=3.11", pythons).path == "/own"
    assert choose(">=3.13", pythons).path == "/p313"
    assert choose(">=3.11", pythons, requested="3.13").path == "/p313"
    with pytest.raises(InvalidArgument, match=r"installed: 3\.11, .*3\.13"):
        choose(">=3.14", pythons)
    with pytest.raises(InvalidArgument, match="bad requires-python"):
        choose("three", pythons)
    assert any(i.path == sys.executable for i in installed())
