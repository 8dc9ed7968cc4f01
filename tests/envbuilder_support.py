"""Wheels for tests of environments without network: tiny wheels written here, a tiny PEP 517/660 build backend,
and pydantic with its dependencies re-packed from this test environment (simrun-runtime needs them in every lock)."""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import zipfile
from pathlib import Path

from simrun_envbuilder.wheels import write_wheel

BACKEND = '''
"""tinyback: a build backend small enough to read; editable installs are a .pth naming the source folder."""
import base64, hashlib, os, re, tomllib, zipfile

def _project(root="."):
    with open(os.path.join(root, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)["project"]

def _norm(name):
    return re.sub(r"[-_.]+", "_", name).lower()

def _dist_info(project):
    name, version = project["name"], project["version"]
    lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    lines += [f"Requires-Dist: {r}" for r in project.get("dependencies", [])]
    files = {"METADATA": "\\n".join(lines) + "\\n",
             "WHEEL": "Wheel-Version: 1.0\\nGenerator: tinyback\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n"}
    eps = project.get("entry-points", {})
    if eps:
        files["entry_points.txt"] = "".join(
            f"[{g}]\\n" + "".join(f"{k} = {v}\\n" for k, v in items.items()) + "\\n" for g, items in eps.items())
    return f"{_norm(name)}-{version}.dist-info", files

def _write(directory, project, members):
    info, files = _dist_info(project)
    members = dict(members)
    for k, v in files.items():
        members[f"{info}/{k}"] = v.encode()
    record = []
    for path, data in members.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append(f"{info}/RECORD,,")
    members[f"{info}/RECORD"] = ("\\n".join(record) + "\\n").encode()
    name = f"{_norm(project['name'])}-{project['version']}-py3-none-any.whl"
    with zipfile.ZipFile(os.path.join(directory, name), "w") as z:
        for path, data in members.items():
            z.writestr(path, data)
    return name

def get_requires_for_build_wheel(config_settings=None):
    return []

get_requires_for_build_editable = get_requires_for_build_wheel

def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    info, files = _dist_info(_project())
    os.makedirs(os.path.join(metadata_directory, info))
    for k, v in files.items():
        with open(os.path.join(metadata_directory, info, k), "w") as f:
            f.write(v)
    return info

prepare_metadata_for_build_editable = prepare_metadata_for_build_wheel

def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    project = _project()
    package = _norm(project["name"])
    members = {}
    for folder, _, names in os.walk(package):
        for n in names:
            if n.endswith(".py"):
                path = os.path.join(folder, n)
                with open(path, "rb") as f:
                    members[path.replace(os.sep, "/")] = f.read()
    return _write(wheel_directory, project, members)

def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    project = _project()
    return _write(wheel_directory, project, {f"_{_norm(project['name'])}_editable.pth": os.getcwd().encode() + b"\\n"})
'''


def wheel_from_installed(name: str, dest: Path) -> Path:
    """Re-packs an installed distribution of this test environment as a wheel (files from its RECORD)."""
    dist = importlib.metadata.distribution(name)
    files: dict[str, bytes] = {}
    info_dir = ""
    for item in dist.files or []:
        posix = item.as_posix()
        if posix.startswith("..") or posix.endswith((".pyc", "/RECORD", "INSTALLER", "REQUESTED")):
            continue
        if "__pycache__" in posix or posix.endswith("direct_url.json"):
            continue
        path = Path(str(dist.locate_file(item)))
        if path.is_file():
            files[posix] = path.read_bytes()
        if posix.endswith(".dist-info/METADATA"):
            info_dir = posix.rsplit("/", 1)[0]
    tag = next(
        line.split(":", 1)[1].strip()
        for line in files[f"{info_dir}/WHEEL"].decode().splitlines()
        if line.startswith("Tag:")
    )
    record = []
    for path, data in sorted(files.items()):
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append(f"{info_dir}/RECORD,,")
    files[f"{info_dir}/RECORD"] = ("\n".join(record) + "\n").encode()
    stem = info_dir.removesuffix(".dist-info")
    wheel = dest / f"{stem}-{tag}.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as archive:
        for path, data in sorted(files.items()):
            archive.writestr(path, data)
    return wheel


def build_wheelhouse(dest: Path) -> Path:
    """Writes tinydep 1.0 and 2.0, otherdep (needs tinydep 2.0), tinyback, pydantic and its dependencies."""
    dest.mkdir(parents=True, exist_ok=True)
    for version in ("1.0", "2.0"):
        write_wheel(dest, "tinydep", version, {"tinydep/__init__.py": f"VERSION = {version!r}\n".encode()})
    write_wheel(dest, "otherdep", "1.0", {"otherdep/__init__.py": b""}, requires=["tinydep==2.0"])
    write_wheel(dest, "tinyback", "1.0", {"tinyback/__init__.py": BACKEND.encode()})
    for name in ("pydantic", "pydantic-core", "typing-extensions", "annotated-types", "typing-inspection"):
        wheel_from_installed(name, dest)
    return dest
