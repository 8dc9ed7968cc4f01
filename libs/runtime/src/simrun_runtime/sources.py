"""Which of a run's sources are packages, and the import path of those that are not: uv's rule, in one place.

A source (the model, or a library snapshot reached through `[tool.uv.sources]` paths) is a package when its
`[tool.uv] package` is true, or when it has a `[build-system]` and `package` is not false; a package is
installed editable. A source that is not one is never built: its dependencies are installed like any other's and
its root is put first on `sys.path`, as `python -m` in its checkout would (the examples of sbmlsim, a research
repository with `models/` and `data/` beside its package and no `[build-system]`).
"""

from __future__ import annotations

import importlib
import sys
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any


def is_package(pyproject: Mapping[str, Any]) -> bool:
    """uv's rule for a parsed `pyproject.toml`: `[tool.uv] package = true`, or a `[build-system]` without
    `package = false`."""
    tool = pyproject.get("tool", {})
    package = tool.get("uv", {}).get("package") if isinstance(tool, Mapping) else None
    if package is not None:
        return bool(package)
    return "build-system" in pyproject


def root_is_package(root: Path) -> bool:
    """Whether the source at `root` is a package; one without a readable `pyproject.toml` is not."""
    try:
        return is_package(tomllib.loads((root / "pyproject.toml").read_text()))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return False


def import_roots(model_root: Path | str | None, libraries: Iterable[Path | str] = ()) -> list[str]:
    """The folders first on a task's `sys.path`: the model's root, then each library that is not a package."""
    roots = [str(Path(model_root).resolve())] if model_root is not None else []
    for library in libraries:
        path = Path(library)
        if not root_is_package(path) and str(path.resolve()) not in roots:
            roots.append(str(path.resolve()))
    return roots


def put_first(roots: list[str]) -> None:
    """Puts `roots` first on `sys.path`, in their order."""
    if sys.path[: len(roots)] == roots:
        return
    sys.path[:] = [*roots, *(p for p in sys.path if p not in roots)]
    importlib.invalidate_caches()
