"""The client snapshots the working trees of a model's path sources beside the model, and submits them with it."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from simrun_client.libraries import library_trees
from simrun_client.snapshots import snapshot_to_store
from simrun_core.errors import InvalidArgument

GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}


def repo(path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(text)
    for args in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-q", "-m", "x"]):
        subprocess.run(
            ["git", *args], cwd=path, check=True, capture_output=True, env={**GIT_ENV, "PATH": "/usr/bin:/bin"}
        )
    return path


def pyproject(name: str, sources: str = "") -> str:
    return f'[project]\nname = "{name}"\nversion = "0.1"\n' + (f"[tool.uv.sources]\n{sources}\n" if sources else "")


def test_library_trees_follow_path_sources_out_of_the_model(tmp_path: Path) -> None:
    inner = 'inner = { path = "packages/inner" }'
    model = repo(
        tmp_path / "model",
        {
            "pyproject.toml": pyproject("m", f'lib = {{ path = "../lib" }}\n{inner}'),
            "packages/inner/pyproject.toml": pyproject("inner"),
        },
    )
    lib = repo(tmp_path / "lib", {"pyproject.toml": pyproject("lib", 'base = { path = "../base" }')})
    base = repo(tmp_path / "base", {"pyproject.toml": pyproject("base")})
    assert library_trees(model) == [lib, base]
    store = tmp_path / "store"
    names = [snapshot_to_store(tree, store).snapshot.name for tree in [model, *library_trees(model)]]
    assert names == ["model", "lib", "base"]


def test_library_trees_refuse_what_cannot_be_snapshotted(tmp_path: Path) -> None:
    model = repo(tmp_path / "model", {"pyproject.toml": pyproject("m", 'lib = { path = "../nothere" }')})
    with pytest.raises(InvalidArgument, match="does not exist"):
        library_trees(model)
    (tmp_path / "a" / "lib").mkdir(parents=True)
    (tmp_path / "b" / "lib").mkdir(parents=True)
    twins = repo(
        tmp_path / "twins", {"pyproject.toml": pyproject("m", 'x = { path = "../a/lib" }\ny = { path = "../b/lib" }')}
    )
    with pytest.raises(InvalidArgument, match="folders named 'lib'"):
        library_trees(twins)
    assert library_trees(repo(tmp_path / "plain", {"a.py": ""})) == []
