"""Installing sources editable, offline, with their own build backends (PEP 660): one frontend for the
environment builder's overlays on this machine and for a pod in an image, which installs the run's snapshots that
are packages into its scratch at its start (`SIMRUN_INSTALL_SNAPSHOTS`: an image holds the locked dependencies and
their backends, no snapshot).

Depends on the standard library only: it runs in every image.
"""

from __future__ import annotations

import json
import os
import site
import subprocess
import sys
import zipfile
from collections.abc import Sequence
from pathlib import Path

from simrun_runtime.sources import put_first, root_is_package


class EditableError(ValueError):
    """An editable install that cannot be made: a wheel that is not fit, or a backend that failed."""


EDITABLE_FRONTEND = r"""
import contextlib, importlib, json, os, sys, tomllib
out, results = sys.argv[1], []

def failed(index, kind, backend, why):
    print(json.dumps({"failed": index, "kind": kind, "backend": backend, "reason": why}))
    sys.exit(1)

for index, source in enumerate(sys.argv[2:]):
    with open(os.path.join(source, "pyproject.toml"), "rb") as f:
        system = tomllib.load(f).get("build-system", {})
    backend = system.get("build-backend", "setuptools.build_meta:__legacy__")
    sys.path[:0] = [os.path.join(source, p) for p in system.get("backend-path", [])]
    os.chdir(source)
    module, _, attrs = backend.partition(":")
    try:
        hooks = importlib.import_module(module)
        for attr in filter(None, attrs.split(".")):
            hooks = getattr(hooks, attr)
    except (ImportError, AttributeError) as exc:
        failed(index, "missing-backend", backend, f"{type(exc).__name__}: {exc}")
    if not hasattr(hooks, "build_editable"):
        failed(index, "no-editable", backend, "the backend has no build_editable hook")
    folder = os.path.join(out, str(index))
    os.makedirs(folder)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            results.append(os.path.join(folder, hooks.build_editable(folder)))
    except SystemExit as exc:
        failed(index, "failed", backend, str(exc.code) if exc.code not in (None, 0) else "the backend exited")
    except BaseException as exc:
        failed(index, "failed", backend, f"{type(exc).__name__}: {exc}")
print(json.dumps(results))
"""


def project_view(root: Path, view: Path) -> Path:
    """A writable folder of links to each entry of a read-only snapshot, kept with the overlay: a backend that
    writes beside the project while it builds (pdm-backend's `.pdm-build`) writes here, and the editable install
    it makes leads through the links into the snapshot."""
    view.mkdir(parents=True)
    for entry in root.iterdir():
        (view / entry.name).symlink_to(entry, target_is_directory=entry.is_dir())
    return view


def json_line(line: str) -> object:
    try:
        return json.loads(line)
    except json.JSONDecodeError:
        return None


def install_wheel(wheel: Path, site: Path) -> None:
    """Installs a pure wheel (an editable one: a `.pth`, a finder, its dist-info) into `site`, as an installer
    would: its purelib and platlib files, its dist-info with INSTALLER and a RECORD of what was written.

    An editable wheel is a few small files; unpacking them here costs milliseconds where an installer process
    costs a start and an interpreter query per overlay.

    Raises:
        EditableError: a member that would land outside `site`, or scripts, headers or data the overlay cannot hold.
    """
    written: list[str] = []
    with zipfile.ZipFile(wheel) as archive:
        dist_info = next(n.split("/")[0] for n in archive.namelist() if n.split("/")[0].endswith(".dist-info"))
        for member in archive.infolist():
            if member.is_dir():
                continue
            name = member.filename
            top, _, rest = name.partition("/")
            if top.endswith(".data"):
                kind, _, rest = rest.partition("/")
                if kind not in ("purelib", "platlib"):
                    continue  # scripts, headers and data: pods run `python -m`, an editable wheel has none to speak of
                name = rest
            dest = (site / name).resolve()
            if site.resolve() not in dest.parents:
                raise EditableError(f"{wheel.name}: member {member.filename!r} lands outside site-packages")
            if name.endswith("/RECORD") and name.startswith(dist_info):
                continue
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(archive.read(member))
            written.append(dest.relative_to(site.resolve()).as_posix())
    (site / dist_info / "INSTALLER").write_text("simrun\n")
    written.append(f"{dist_info}/INSTALLER")
    (site / dist_info / "RECORD").write_text("".join(f"{path},,\n" for path in [*written, f"{dist_info}/RECORD"]))


def install_snapshots(roots: Sequence[Path], scratch: Path, python: str = sys.executable) -> list[str]:
    """Installs the sources at `roots` that are packages editable into `<scratch>/site-packages` and puts that
    folder on `sys.path` (its `.pth` files run); returns the names of the sources installed.

    The backends run in one child process of this interpreter, offline: the image provides them (the lock locks
    every package's `[build-system] requires`). A backend that writes beside its project writes into a view of
    links in the scratch, never into the read-only snapshot.

    Raises:
        EditableError: a backend missing from the image, or a build that failed, with the backend's reason.
    """
    packages = [root for root in roots if root_is_package(root)]
    if not packages:
        return []
    work = scratch / "simrun-editables"
    target = scratch / "site-packages"
    target.mkdir(parents=True, exist_ok=True)
    views = [project_view(root, work / "sources" / str(i)) for i, root in enumerate(packages)]
    (work / "wheels").mkdir(parents=True)
    # As a PEP 517 frontend does, the build environment's scripts come first on PATH (uv_build runs its binary).
    env = {**os.environ, "PATH": os.pathsep.join([str(Path(python).parent), os.environ.get("PATH", os.defpath)])}
    result = subprocess.run(
        [python, "-c", EDITABLE_FRONTEND, str(work / "wheels"), *map(str, views)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    lines = result.stdout.strip().splitlines()
    answer = json_line(lines[-1]) if lines else None
    if isinstance(answer, dict) and isinstance(answer.get("failed"), int) and answer["failed"] < len(packages):
        why = " ".join(str(answer.get("reason", "")).split()) or "no reason given"
        raise EditableError(
            f"installing the snapshot {packages[answer['failed']]} editable with {answer.get('backend')} failed: {why}"
        )
    if result.returncode != 0 or not isinstance(answer, list):
        why = " ".join((result.stderr + result.stdout).strip().splitlines()[-3:]) or f"exit {result.returncode}"
        raise EditableError(f"installing the run's snapshots editable failed: {why}")
    for wheel in answer:
        install_wheel(Path(wheel), target)
    site.addsitedir(str(target))
    # addsitedir appends: the snapshots' finders and paths come before the image's own site-packages.
    put_first([str(target)])
    return [root.name for root in packages]
