"""Which build of the simulator's hot modules runs: the C extensions mypyc compiled at install, or the source.

The build hook (``libs/cluster-sim/hatch_build.py``) compiles :data:`COMPILED` from a snapshot of
their source and writes a record, ``cluster_sim/_build.json``, with each one's SHA-256. A compiled
module runs only while every compiled module's source is still the one it was compiled from: an edited
``simulator.py`` runs as edited (pure Python, with a warning that says how to rebuild), never shadowed
by a stale extension. In an editable install the extensions and the record sit in site-packages, away
from the source tree; in a standard install they sit beside the sources, and the sources are loaded
explicitly when the pure modules must run. ``CLUSTER_SIM_PURE=1`` runs the pure modules whatever was
built. Both builds give the same results bit for bit (the tests compare them).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import sys
import warnings
from collections.abc import MutableSequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["COMPILED", "SELECTED", "Build", "confirm", "select"]

COMPILED = ("_structures", "simulator")
"""The modules compiled, in the order they import one another (as in the build hook)."""

_RECORD = "_build.json"
_REBUILD = "uv sync --reinstall-package cluster-sim"


@dataclass(frozen=True, slots=True)
class Build:
    """The build in use.

    Attributes:
        compiled: Whether the compiled modules run (else the pure-Python source).
        detail: Why, in a sentence: where the extensions come from, or why they do not run.
    """

    compiled: bool
    detail: str

    @property
    def name(self) -> str:
        """``"compiled"`` or ``"pure"``."""
        return "compiled" if self.compiled else "pure"


def _find_record(package: Path) -> Path | None:
    """The folder holding the build record: the package's own, else (editable install) a ``cluster_sim``
    folder without ``__init__.py`` on ``sys.path``."""
    if (package / _RECORD).is_file():
        return package
    for entry in sys.path:
        folder = Path(entry or ".", "cluster_sim")
        if (folder / _RECORD).is_file():
            return folder
    return None


def _load_sources(package: Path, name: str) -> None:
    """Import the pure-Python sources of :data:`COMPILED` as ``{name}.<module>``, ahead of any extension."""
    for module in COMPILED:
        qualified = f"{name}.{module}"
        spec = importlib.util.spec_from_file_location(qualified, package / f"{module}.py")
        if spec is None or spec.loader is None:  # pragma: no cover - a .py path always has a spec
            raise ImportError(f"cannot load {package / f'{module}.py'}")
        loaded = importlib.util.module_from_spec(spec)
        sys.modules[qualified] = loaded
        spec.loader.exec_module(loaded)


def select(package: Path, name: str, path: MutableSequence[str]) -> Build:
    """Choose the build before any of :data:`COMPILED` is imported: put the extensions' folder first on
    the package's ``path`` (``__path__``), or make the imports find the sources."""
    record_folder = _find_record(package)
    extensions_beside = record_folder == package
    if os.environ.get("CLUSTER_SIM_PURE"):
        if extensions_beside:
            _load_sources(package, name)
        return Build(False, "CLUSTER_SIM_PURE is set")
    if record_folder is None:
        return Build(False, "no build record: the package was not installed by its build hook")
    record = json.loads((record_folder / _RECORD).read_text())
    if not record.get("compiled"):
        return Build(False, f"not compiled when installed: {record.get('reason', 'no reason recorded')}")
    sources = record.get("sources", {})
    changed = [
        f"{module}.py"
        for module in COMPILED
        if hashlib.sha256((package / f"{module}.py").read_bytes()).hexdigest() != sources.get(module)
    ]
    if changed:
        warnings.warn(
            f"cluster_sim: {', '.join(changed)} changed since the compiled build; running the pure-Python "
            f"source (rebuild with `{_REBUILD}`, or set CLUSTER_SIM_PURE=1)",
            RuntimeWarning,
            stacklevel=2,
        )
        if extensions_beside:
            _load_sources(package, name)
        return Build(False, f"{', '.join(changed)} changed since the compiled build ({_REBUILD})")
    if not extensions_beside:
        path.insert(0, str(record_folder))
    return Build(True, f"compiled by mypyc {record.get('mypy', '?')} from these sources ({record_folder})")


def confirm(build: Build, name: str) -> Build:
    """The build as it turned out: compiled only if every module of :data:`COMPILED` was loaded from an extension."""
    if not build.compiled:
        return build
    loaded = [sys.modules[f"{name}.{module}"] for module in COMPILED]
    missing = [m.__name__ for m in loaded if not str(getattr(m, "__file__", "")).endswith((".so", ".pyd"))]
    if missing:
        return Build(False, f"the compiled modules did not load (from source: {', '.join(missing)})")
    return build


_package = sys.modules[__name__.rpartition(".")[0]]
SELECTED: Build = select(Path(str(_package.__file__)).parent, _package.__name__, _package.__path__)
"""The build chosen when the package was first imported (:func:`confirm` checks what then loaded)."""
