"""Hatchling build hook: compiles the simulator's hot modules with mypyc, from the same typed source.

Every wheel (the editable one of ``uv sync`` too) gets the C extensions of :data:`COMPILED` and a
build record, ``cluster_sim/_build.json``, naming the SHA-256 of each compiled source. The package
(:mod:`cluster_sim._build`) runs a compiled module only while its source is the one it was compiled
from, so an edited ``simulator.py`` runs as edited, never shadowed by a stale extension. The
extensions are compiled from a copy of the sources in a temporary folder, never beside them: an
editable install leaves the source tree as it was, its extensions sit in site-packages.

Where compiling fails (no C compiler, no Python headers) or ``CLUSTER_SIM_PURE`` is set, the wheel
is pure Python, and the record says why.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

COMPILED = ("_structures", "simulator")
"""The modules of ``cluster_sim`` compiled, in the order they import one another."""

GROUP = "cluster_sim"
"""mypyc's group name: the shared library is the top-level module ``cluster_sim__mypyc``."""

_SETUP = """
import sys
from setuptools import setup
from mypyc.build import mypycify

extensions = mypycify(["--ignore-missing-imports", *sys.argv[1:]], opt_level="3", group_name="{group}")
for extension in extensions:
    # No fused multiply-add (a compiler may contract a * b + c where the target has one): every float
    # operation rounds as the interpreter's does, so both builds give the same results bit for bit.
    extension.extra_compile_args.append("-ffp-contract=off")
setup(name="cluster-sim-compiled", ext_modules=extensions, script_args=["build_ext", "--inplace"])
"""


def source_digest(path: Path) -> str:
    """The SHA-256 of a source file's bytes (the same function as in ``cluster_sim._build``)."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


class MypycBuildHook(BuildHookInterface):
    """Compile :data:`COMPILED` into the wheel, or record why the wheel is pure Python."""

    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if self.target_name != "wheel":
            return
        package = Path(self.root, "src", "cluster_sim")
        self._work = Path(tempfile.mkdtemp(prefix="cluster-sim-mypyc-"))
        tree = self._work / "src"
        # A snapshot of the package: what is compiled is exactly what the record's digests name.
        shutil.copytree(package, tree / "cluster_sim", ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.pyd"))
        sources = {name: source_digest(tree / "cluster_sim" / f"{name}.py") for name in COMPILED}
        record: dict[str, Any] = {"sources": sources}
        files: dict[str, str] = {}
        if os.environ.get("CLUSTER_SIM_PURE"):
            record.update(compiled=False, reason="CLUSTER_SIM_PURE was set when it was built")
        else:
            reason = self._compile(tree)
            if reason is None:
                import mypy.version

                suffix = sysconfig.get_config_var("EXT_SUFFIX")
                for name in COMPILED:
                    files[str(tree / "cluster_sim" / f"{name}{suffix}")] = f"cluster_sim/{name}{suffix}"
                files[str(tree / f"{GROUP}__mypyc{suffix}")] = f"{GROUP}__mypyc{suffix}"
                record.update(compiled=True, mypy=mypy.version.__version__, ext_suffix=suffix)
            else:
                record.update(compiled=False, reason=reason)
                self.app.display_warning(f"cluster-sim: installing the pure-Python simulator: {reason}")
        record_path = self._work / "_build.json"
        record_path.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
        files[str(record_path)] = "cluster_sim/_build.json"
        # An editable wheel takes its files from force_include_editable (beside the .pth file that
        # points at the source tree), a standard one from force_include.
        build_data["force_include_editable" if version == "editable" else "force_include"].update(files)
        if record["compiled"]:
            build_data["pure_python"] = False
            build_data["infer_tag"] = True

    def finalize(self, version: str, build_data: dict[str, Any], artifact_path: str) -> None:
        work = getattr(self, "_work", None)
        if work is not None:
            shutil.rmtree(work, ignore_errors=True)

    def _compile(self, tree: Path) -> str | None:
        """Compile the modules in ``tree``; None on success, else why not (one line)."""
        headers = Path(sysconfig.get_paths()["include"], "Python.h")
        if not headers.is_file():
            return f"no Python headers ({headers} is missing)"
        compiler = (os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc").split()[0]
        if shutil.which(compiler) is None:
            return f"no C compiler ({compiler!r} is not on PATH)"
        env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
        process = subprocess.run(
            [sys.executable, "-c", _SETUP.format(group=GROUP), *(f"cluster_sim/{name}.py" for name in COMPILED)],
            cwd=tree,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        if process.returncode != 0:
            lines = [line for line in process.stdout.splitlines() if line.strip()]
            errors = [line for line in lines if "error" in line.lower()] or lines
            return "mypyc failed: " + (errors[0] if errors else f"exit status {process.returncode}")
        return None
