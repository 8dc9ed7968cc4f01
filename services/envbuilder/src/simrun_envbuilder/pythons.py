"""The Python interpreters installed on this machine, and the one a model's `requires-python` chooses.

uv cannot download a Python here, so environments use what is installed: uv's own listing, pyenv's versions and
the system's `python3.X`, each asked for its version once per process.
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import Version
from simrun_core.errors import InvalidArgument

MINIMUM = (3, 11)
"""simrun-runtime's own requires-python: no environment runs an older interpreter."""

_SEARCH_GLOBS = (
    "~/.pyenv/versions/*/bin/python3",
    "/usr/bin/python3.*",
    "/usr/local/bin/python3.*",
    "/opt/python*/bin/python3",
)


@dataclass(frozen=True, order=True)
class Interpreter:
    """An installed interpreter: its version (major, minor, micro) and its path."""

    version: tuple[int, int, int]
    path: str

    @property
    def minor(self) -> str:
        """`3.11`: what an environment records as its Python version."""
        return f"{self.version[0]}.{self.version[1]}"


_lock = threading.Lock()
_cache: dict[tuple[str, ...], list[Interpreter]] = {}


def installed(extra: list[str] | tuple[str, ...] = (), uv: list[str] | None = None) -> list[Interpreter]:
    """The interpreters of this machine at Python 3.11 or newer, one per real path, newest first (cached)."""
    key = tuple(extra)
    with _lock:
        if key in _cache:
            return _cache[key]
    candidates: list[str] = [*extra, sys.executable]
    if uv:
        candidates += _uv_listing(uv)
    for pattern in _SEARCH_GLOBS:
        candidates += sorted(glob.glob(os.path.expanduser(pattern)))
    seen: set[str] = set()
    found: list[Interpreter] = []
    for path in candidates:
        if "/shims/" in path or path.endswith("-config"):
            continue
        real = os.path.realpath(path)
        if real in seen or not os.access(real, os.X_OK) or not Path(real).is_file():
            continue
        seen.add(real)
        version = _version(path)
        if version is not None and version[:2] >= MINIMUM:
            found.append(Interpreter(version, path))
    found.sort(reverse=True)
    with _lock:
        _cache[key] = found
    return found


def choose(requires_python: str, interpreters: list[Interpreter], requested: str = "") -> Interpreter:
    """The interpreter of an environment: the requested minor version, else the server's own Python when it
    satisfies `requires-python` (what the model ran with before it had an environment), else the newest that does.

    Raises:
        InvalidArgument: a bad `requires-python`, or no installed interpreter satisfies it (naming what is installed).
    """
    try:
        spec = SpecifierSet(requires_python or "")
    except InvalidSpecifier:
        raise InvalidArgument(f"bad requires-python {requires_python!r} in the model's pyproject.toml") from None
    fitting = [i for i in interpreters if Version(".".join(map(str, i.version))) in spec]
    if requested:
        fitting = [i for i in fitting if i.minor == requested]
    if not fitting:
        have = ", ".join(sorted({i.minor for i in interpreters}, key=Version)) or "none"
        want = f"Python {requested} with " if requested else ""
        raise InvalidArgument(
            f"no installed Python satisfies {want}requires-python {requires_python!r} (installed: {have}); "
            "change requires-python or install that Python on the server"
        )
    own = (sys.version_info.major, sys.version_info.minor)
    for interpreter in fitting:
        if interpreter.version[:2] == own:
            return interpreter
    return fitting[0]


def _uv_listing(uv: list[str]) -> list[str]:
    try:
        out = subprocess.run(
            [*uv, "python", "list", "--only-installed", "--output-format", "json"],
            capture_output=True,
            text=True,
            timeout=30,
            env={**os.environ, "UV_PYTHON_DOWNLOADS": "never"},
            check=False,
        ).stdout
        return [str(item["path"]) for item in json.loads(out or "[]") if item.get("path")]
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return []


def _version(path: str) -> tuple[int, int, int] | None:
    try:
        out = subprocess.run(
            [path, "-I", "-c", "import sys; print(*sys.version_info[:3])"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    parts = out.stdout.split()
    if out.returncode != 0 or len(parts) != 3:
        return None
    return int(parts[0]), int(parts[1]), int(parts[2])
