"""Pure-Python wheels written directly: simrun-runtime's wheel for every environment, without a build backend.

An environment installs the runtime the server runs with, and the server may run from a checkout (an editable
install): writing the wheel from the package's files needs no network and no backend, and its version carries a
hash of those files, so a changed runtime is a new lock and a new environment.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import os
import re
import zipfile
from collections.abc import Sequence
from pathlib import Path

RUNTIME_DISTRIBUTION = "simrun-runtime"
RUNTIME_PACKAGE = "simrun_runtime"
_EPOCH = (1980, 1, 1, 0, 0, 0)


def wheel_name(name: str, version: str, tag: str = "py3-none-any") -> str:
    """The file name of a wheel (PEP 427) of a distribution and version."""
    return f"{re.sub(r'[-_.]+', '_', name).lower()}-{version.replace('-', '_')}-{tag}.whl"


def write_wheel(
    dest: Path,
    name: str,
    version: str,
    files: dict[str, bytes],
    *,
    requires: Sequence[str] = (),
    requires_python: str = "",
    entry_points: str = "",
) -> Path:
    """Writes a pure wheel of `files` (paths inside site-packages) with its metadata; returns its path.

    The archive is reproducible: sorted members, fixed times, so the same files give the same bytes.
    """
    dist_info = f"{re.sub(r'[-_.]+', '_', name)}-{version}.dist-info"
    metadata = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    if requires_python:
        metadata.append(f"Requires-Python: {requires_python}")
    metadata += [f"Requires-Dist: {r}" for r in requires]
    members = dict(files)
    members[f"{dist_info}/METADATA"] = ("\n".join(metadata) + "\n").encode()
    members[f"{dist_info}/WHEEL"] = (
        b"Wheel-Version: 1.0\nGenerator: simrun-envbuilder\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    )
    if entry_points:
        members[f"{dist_info}/entry_points.txt"] = entry_points.encode()
    record = [f"{path},sha256={_digest(data)},{len(data)}" for path, data in sorted(members.items())]
    record.append(f"{dist_info}/RECORD,,")
    members[f"{dist_info}/RECORD"] = ("\n".join(record) + "\n").encode()
    dest.mkdir(parents=True, exist_ok=True)
    path = dest / wheel_name(name, version)
    temp = path.with_name(f".{path.name}.{os.getpid()}")
    with zipfile.ZipFile(temp, "w", zipfile.ZIP_DEFLATED) as archive:
        for member, data in sorted(members.items()):
            info = zipfile.ZipInfo(member, _EPOCH)
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, data)
    os.replace(temp, path)
    return path


def runtime_files() -> dict[str, bytes]:
    """The files of the simrun_runtime package this process imports, without bytecode."""
    import simrun_runtime

    root = Path(simrun_runtime.__file__).parent
    files: dict[str, bytes] = {}
    for path in sorted(root.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts and path.suffix not in (".pyc", ".pyo"):
            files[f"{RUNTIME_PACKAGE}/{path.relative_to(root).as_posix()}"] = path.read_bytes()
    return files


def runtime_version() -> str:
    """The runtime's version with a local label of its files' hash, e.g. `0.1.0+3f2a9c1d0b7e`."""
    digest = hashlib.sha256()
    for path, data in sorted(runtime_files().items()):
        digest.update(path.encode() + b"\0" + hashlib.sha256(data).digest())
    base = importlib.metadata.version(RUNTIME_DISTRIBUTION).split("+")[0]
    return f"{base}+{digest.hexdigest()[:12]}"


def write_runtime_wheel(dest: Path) -> Path:
    """The wheel of the runtime this process runs, written into `dest` once per version."""
    version = runtime_version()
    path = dest / wheel_name(RUNTIME_DISTRIBUTION, version)
    if path.is_file():
        return path
    distribution = importlib.metadata.distribution(RUNTIME_DISTRIBUTION)
    requires = [r for r in (distribution.requires or []) if "extra ==" not in r]
    lines: dict[str, list[str]] = {}
    for entry in distribution.entry_points:
        lines.setdefault(entry.group, []).append(f"{entry.name} = {entry.value}")
    entry_points = "".join(f"[{group}]\n" + "\n".join(items) + "\n\n" for group, items in sorted(lines.items()))
    return write_wheel(
        dest,
        RUNTIME_DISTRIBUTION,
        version,
        runtime_files(),
        requires=requires,
        requires_python=distribution.metadata["Requires-Python"] or "",
        entry_points=entry_points,
    )


def _digest(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
