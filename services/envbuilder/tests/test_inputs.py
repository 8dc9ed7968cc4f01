"""What an environment is locked from, read from snapshots (no uv), and the choice of the Python."""

from __future__ import annotations

import sys
from pathlib import PurePosixPath

import pytest
from simrun_core.errors import InvalidArgument, NotFound
from simrun_envbuilder.inputs import read_inputs, tree_places
from simrun_envbuilder.lock import reason
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
    # the library has no [build-system]: uv's rule says it is not a package, so nothing builds it
    assert a.build_requires == ["tinyback==1.0"] and a.project_name == "tinymodel"
    assert [s.is_package for s in a.sources] == [True, False]


@pytest.mark.parametrize(
    ("text", "package"),
    [
        ('[project]\nname = "a"\n', False),
        ('[project]\nname = "a"\n[build-system]\nrequires = ["hatchling"]\n', True),
        ('[project]\nname = "a"\n[build-system]\nrequires = ["hatchling"]\n[tool.uv]\npackage = false\n', False),
        ('[project]\nname = "a"\n[tool.uv]\npackage = true\n', True),
    ],
)
def test_a_source_is_a_package_by_uvs_rule(kit, text: str, package: bool) -> None:
    """`[tool.uv] package = true`, or a `[build-system]` without `package = false`; one built without a
    `[build-system]` (package = true) gets setuptools' legacy backend, as uv builds it."""
    inputs = read_inputs(StoreLayout(kit.store), [kit.snapshot("m", {"pyproject.toml": text})])
    assert inputs is not None and inputs.model.is_package is package
    legacy = "build-system" not in text and package
    assert ("setuptools>=40.8.0" in inputs.build_requires) is legacy


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
    with pytest.raises(NotFound, match=r"not in the environment builder's store: take it first.*share one store"):
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


@pytest.mark.parametrize(
    ("dependencies", "said"),
    [
        ('["tinydep>=!!1.3"]', "'tinydep>=!!1.3' is not a requirement (Expected"),
        ('"tinydep"', "dependencies must be a list of requirements"),
        ('["tinydep", 3]', "dependencies must be a list of requirements"),
    ],
)
def test_a_dependency_that_is_no_requirement_is_refused_naming_it_before_uv(kit, dependencies: str, said: str) -> None:
    store = StoreLayout(kit.store)
    files = kit.model_files()
    files["pyproject.toml"] = files["pyproject.toml"].replace(
        'dependencies = ["tinydep==1.0"]', f"dependencies = {dependencies}"
    )
    assert f"dependencies = {dependencies}" in files["pyproject.toml"]
    with pytest.raises(InvalidArgument, match=r"cannot be locked: tinymodel/pyproject\.toml") as refused:
        read_inputs(store, [kit.snapshot("tinymodel", files)])
    assert said in str(refused.value)
    optional = kit.model_files(extra='\n[project.optional-dependencies]\nplots = ["matplotlib>"]\n')
    with pytest.raises(InvalidArgument, match=r"optional-dependencies.plots: 'matplotlib>' is not a requirement"):
        read_inputs(store, [kit.snapshot("tinymodel", optional)])


def test_a_build_backends_traceback_is_cut_to_its_exception() -> None:
    stderr = """Using CPython 3.11.7 interpreter at: /usr/bin/python3
error: Failed to build `bv @ file:///tmp/bv`
  cause: The build backend returned an error
  cause: Call to `hatchling.build.prepare_metadata_for_build_editable` failed (exit status: 1)

         [stderr]
         Traceback (most recent call last):
           File "<string>", line 14, in <module>
           File "/root/.cache/uv/builds-v0/.tmp/lib/python3.11/site-packages/hatchling/build.py", line 142, in x
             f.write(builder.config.core_metadata_constructor(builder.metadata))
                     ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
           File "/root/.cache/uv/builds-v0/.tmp/lib/python3.11/site-packages/hatchling/metadata/core.py", line 1223
             raise ValueError(message) from None
         ValueError: Dependency #1 of field `project.dependencies` is invalid: Expected semicolon
             mpmath>=!!1.3
                   ^

hint: Build failures usually indicate a problem with the package or the build environment
"""
    said = reason(stderr)
    assert "File " not in said and "Traceback" not in said
    assert "error: Failed to build `bv @ file:///tmp/bv`" in said
    assert "ValueError: Dependency #1 of field `project.dependencies` is invalid" in said
    assert "mpmath>=!!1.3" in said and said.endswith("build environment")
    plain = "error: No solution found\\n  cause: Because nosuch was not found we can conclude"
    assert reason(plain) == plain
