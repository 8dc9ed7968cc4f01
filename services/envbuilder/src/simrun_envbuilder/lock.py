"""The lock of an environment: a generated root project over the snapshots' tree, locked with `uv lock`.

uv honours build constraints only from the root project of a lock (`tool.uv.build-constraint-dependencies`;
`UV_BUILD_CONSTRAINT` is ignored by `uv lock`), and simrun-runtime must be resolved with the model's dependencies,
so the builder writes its own root project: the model (editable, from the tree), simrun-runtime's wheel, the build
backends the snapshots name, and the service's constraints for backends and dependencies alike.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from simrun_core.errors import InvalidArgument

from simrun_envbuilder.inputs import ModelInputs, tree_places
from simrun_envbuilder.pythons import Interpreter
from simrun_envbuilder.sandbox import build_variables, confined, interpreter_prefixes, linked_roots

ROOT_NAME = "simrun-environment"
log = logging.getLogger(__name__)

REASON_LINES = 12
"""How many lines of uv's reason a refusal quotes."""


def default_uv_command() -> tuple[str, ...]:
    """uv as this machine has it: the `uv` on PATH, else `python3 -m uv` (how the workspace installs it)."""
    found = shutil.which("uv")
    if found:
        return (_behind_wrapper(found),)
    for python in (sys.executable, shutil.which("python3") or "python3"):
        probe = subprocess.run([python, "-m", "uv", "--version"], capture_output=True, check=False)
        if probe.returncode == 0:
            return (python, "-m", "uv")
    return ("uv",)


def _behind_wrapper(program: str) -> str:
    """The uv binary a wrapper script (a pyenv shim) runs, which uv names in `UV` for what it runs; else `program`.

    Build steps run confined with a private HOME, where a shim cannot find its own installation.
    """
    with open(program, "rb") as f:
        if f.read(2) != b"#!":
            return program
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        probe = subprocess.run(
            [program, "run", "--no-project", "--no-config", "printenv", "UV"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        binary = probe.stdout.strip()
        if probe.returncode == 0 and os.path.isfile(binary):
            return binary
    return program


@dataclass(frozen=True)
class UvSettings:
    """How the builder runs uv: the command, its cache, the index, and a time limit per call."""

    command: tuple[str, ...]
    cache_dir: Path | None = None
    index_url: str = ""
    find_links: tuple[str, ...] = ()
    local_git_roots: tuple[Path, ...] = ()
    """Folders whose git repositories a lock may clone by `git+file://`; a lock reads those it names."""
    no_index: bool = False
    offline: bool = False
    timeout_s: float = 900.0
    confine: bool = True
    """Run uv confined (`sandbox.confined`): it runs the submitter's build backends and `setup.py` files."""

    def index_args(self) -> list[str]:
        args: list[str] = []
        if self.index_url:
            args += ["--default-index", self.index_url]
        for link in self.find_links:
            args += ["--find-links", link]
        if self.no_index:
            args.append("--no-index")
        if self.offline:
            args.append("--offline")
        return args

    def env(self, interpreter: Interpreter | None = None) -> dict[str, str]:
        """The process environment of a uv call: the build allow-list (`sandbox.PASSED_VARIABLES`, never the server's
        secrets or home), no downloads of Pythons, no user config, our cache."""
        env = {
            "UV_PYTHON_DOWNLOADS": "never",
            "UV_NO_CONFIG": "1",
            "UV_NO_PROGRESS": "1",
            "UV_CACHE_DIR": str(self.cache()),
            # git reads no system config (url rewrites and helpers there may hold the server's credentials).
            "GIT_CONFIG_NOSYSTEM": "1",
            # A venv's files are copies, never hard links into the cache: a build step, a package's `.pth` at
            # an interpreter's start, may write the venv it builds, and through a link the cache every other
            # environment is installed from.
            "UV_LINK_MODE": "copy",
        }
        if interpreter is not None:
            env["UV_PYTHON"] = interpreter.path
        return build_variables(env)

    def cache(self) -> Path:
        """uv's cache: the configured folder, else uv's own default of the server's user (made if missing)."""
        cache = self.cache_dir or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "uv"
        cache.mkdir(parents=True, exist_ok=True)
        return cache

    def reads(self, *interpreters: str | Path) -> list[Path]:
        """What a confined uv call reads beyond the system: uv itself, the interpreters, local `find_links`, the
        local git repositories the configuration allows."""
        local = [Path(link) for link in self.find_links if "://" not in link]
        # `python -m uv` reads its interpreter's installation; a uv binary is one file (never its folder's
        # parent: `~/bin/uv` would open the whole home, the server's tokens with it).
        uv = interpreter_prefixes(self.command[0]) if "-m" in self.command else [Path(self.command[0]).resolve()]
        return [*uv, *interpreter_prefixes(*interpreters), *local, *self.local_git_roots]

    def describe(self) -> str:
        """What of the settings changes a resolution, for the inputs digest."""
        return json.dumps([self.index_url, list(self.find_links), self.no_index])


@dataclass(frozen=True)
class LockedEnvironment:
    """A lock and what the builder keeps of it.

    Attributes:
        lock: the bytes of `uv.lock`.
        lock_sha256: SHA-256 of those bytes.
        identity: SHA-256 of its third-party packages and manifest (local packages left out).
        packages: third-party packages as `name==version`, sorted.
        uses_git: whether a locked package comes from a git repository.
        builds_from_source: whether a locked package has no wheel (an sdist, a git source): installing it runs
            its build backend.
    """

    lock: bytes
    lock_sha256: str
    identity: str
    packages: list[str]
    uses_git: bool
    builds_from_source: bool = False


def write_project(
    folder: Path,
    inputs: ModelInputs,
    interpreter: Interpreter,
    runtime_wheel: Path,
    constraints: list[str],
    seed: bytes | None,
) -> None:
    """Writes the lock project into an empty `folder`: pyproject.toml, the runtime wheel, the tree of symlinks to
    the snapshots, and the seed as `uv.lock` so a resolution keeps the versions it had."""
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(runtime_wheel, folder / runtime_wheel.name)
    places = tree_places(inputs)
    model_place = next(p for p, s in places.items() if s is inputs.model)
    for place, source in places.items():
        link = folder / place
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(source.root, target_is_directory=True)
    requirements = [inputs.project_name, "simrun-runtime", *inputs.build_requires]
    if any(_requirement_name(r) == "hatchling" for r in inputs.build_requires):
        requirements.append("editables")  # hatchling's editable install imports it
    # A model that is not a package is a virtual member: uv locks its dependencies and builds nothing. A model
    # of a uv workspace is one member of the lock project's own workspace, beside the members it uses.
    model_source: dict[str, Any] = (
        {"workspace": True}
        if inputs.model.member
        else {"path": model_place.as_posix(), **({"editable": True} if inputs.model.is_package else {"package": False})}
    )
    sources: dict[str, Any] = {inputs.project_name: model_source, "simrun-runtime": {"path": runtime_wheel.name}}
    members = sorted(place.as_posix() for place, source in places.items() if source.member)
    text = "\n".join(
        [
            "# Generated by simrun's environment builder: the lock project of one environment.",
            "[project]",
            f"name = {json.dumps(ROOT_NAME)}",
            'version = "0"',
            f"requires-python = {json.dumps(f'=={interpreter.minor}.*')}",
            f"dependencies = {json.dumps(_unique(requirements))}",
            "",
            "[tool.uv]",
            "package = false",
            f"constraint-dependencies = {json.dumps(constraints)}",
            f"build-constraint-dependencies = {json.dumps(constraints)}",
            "",
            *([f"[tool.uv.workspace]\nmembers = {json.dumps(members)}", ""] if members else []),
            "[tool.uv.sources]",
            *(f"{json.dumps(name)} = {_inline(value)}" for name, value in sources.items()),
            "",
        ]
    )
    (folder / "pyproject.toml").write_text(text)
    if seed is not None:
        (folder / "uv.lock").write_bytes(seed)


def run_lock(folder: Path, uv: UvSettings, interpreter: Interpreter, seeded: bool) -> LockedEnvironment:
    """Runs `uv lock` in the lock project; a seed uv cannot use is dropped and the lock made afresh.

    Raises:
        InvalidArgument: the dependencies cannot be locked (an unknown package, a conflict, a bad version), with
            the first lines of uv's reason.
    """
    result = _uv_lock(folder, uv, interpreter)
    if result.returncode != 0 and seeded:
        (folder / "uv.lock").unlink(missing_ok=True)
        refused = reason(result.stderr)
        result = _uv_lock(folder, uv, interpreter)
        if result.returncode == 0:  # the seed, not the model, was the trouble: say so, its versions are not kept
            log.warning(
                "the seed lock (the model's uv.lock or its previous lock) was not usable, locked afresh: %s",
                refused.splitlines()[0] if refused else "",
            )
    if result.returncode != 0:
        raise InvalidArgument(f"the model's dependencies cannot be locked: {reason(result.stderr)}")
    return read_lock((folder / "uv.lock").read_bytes())


def read_lock(data: bytes) -> LockedEnvironment:
    """The identity and packages of a `uv.lock`: local packages (editable, directory, virtual, path) left out."""
    lock = tomllib.loads(data.decode())
    third_party = []
    for package in lock.get("package", []):
        source = package.get("source", {})
        if set(source) & {"editable", "directory", "virtual", "path"}:
            continue
        third_party.append(package)
    identity = hashlib.sha256(
        json.dumps({"packages": third_party, "manifest": lock.get("manifest", {})}, sort_keys=True).encode()
    ).hexdigest()
    packages = sorted(f"{p['name']}=={p.get('version', '')}" for p in third_party)
    uses_git = any("git" in p.get("source", {}) for p in third_party)
    from_source = any(not p.get("wheels") for p in third_party)
    return LockedEnvironment(data, hashlib.sha256(data).hexdigest(), identity, packages, uses_git, from_source)


def reason(stderr: str) -> str:
    """The first lines of uv's reason: what it says after its progress lines, hints kept, a build backend's
    traceback cut to its exception (its frames, the lines uv would show first, say nothing to a model's author)."""
    lines = [line.rstrip() for line in stderr.splitlines() if line.strip()]
    lines = [line for line in lines if not line.startswith(("Using CPython", "Resolved ", "Building ", "Built "))]
    lines = _without_frames(lines)
    text = "\n".join(lines[:REASON_LINES])
    return text or "uv failed without a message"


_EXCEPTION = re.compile(r"^\s*[A-Za-z_][\w.]*(Error|Exception|Exit|Warning)\b(:.*)?$")


def _without_frames(lines: list[str]) -> list[str]:
    """`lines` with each `Traceback (most recent call last):` and its frames left out, up to its last exception
    line (a chained traceback's last one), which is kept with what follows."""
    out: list[str] = []
    i = 0
    while i < len(lines):
        if lines[i].strip() != "Traceback (most recent call last):":
            out.append(lines[i])
            i += 1
            continue
        last = next(
            (j for j in range(len(lines) - 1, i, -1) if _EXCEPTION.match(lines[j]) and not lines[j].startswith("hint")),
            None,
        )
        if last is None:
            out.append(lines[i])
            i += 1
            continue
        i = last
    return out


def local_git_repositories(inputs: ModelInputs, roots: tuple[Path, ...]) -> list[Path]:
    """The local repositories the sources name by `git+file://` (in a requirement or `[tool.uv.sources]`), each
    of which a lock reads.

    Raises:
        InvalidArgument: one outside the configured `environments.local_git_roots`.
    """
    found: list[Path] = []
    for source in inputs.sources:
        project = source.project
        texts = [*project.get("project", {}).get("dependencies", [])]
        for group in project.get("project", {}).get("optional-dependencies", {}).values():
            texts += list(group)
        for value in project.get("tool", {}).get("uv", {}).get("sources", {}).values():
            for item in value if isinstance(value, list) else [value]:
                if isinstance(item, dict) and isinstance(item.get("git"), str):
                    texts.append(item["git"])
        for text in texts:
            match = _GIT_FILE.search(str(text))
            if match is None:
                continue
            path = Path(match.group(1))
            if not any(path == root or root in path.parents for root in (r.resolve() for r in roots)):
                raise InvalidArgument(
                    f"{source.ref.name}/pyproject.toml names the local git repository {path}: this server clones "
                    "local repositories only under environments.local_git_roots; add its folder there, or "
                    "name a repository the server can fetch (git+https://…)"
                )
            found.append(path)
    return found


_GIT_FILE = re.compile(r"(?:git\+)?file://(/[^@#?\s]*)")


def needs_build(uv_output: str) -> bool:
    """Whether uv refused a step for `--no-build` (`Building source distributions for … is disabled` when it
    locks, `marked as --no-build but has no binary distribution` when it installs)."""
    return "Building source distributions for" in uv_output or "marked as `--no-build`" in uv_output


@contextlib.contextmanager
def cache_for_builds(uv: UvSettings, beside: Path) -> Iterator[UvSettings]:
    """uv's settings with a private cache beside `beside`, removed afterwards: for a step that builds from
    source, which runs a submitter's code (a backend, a `setup.py`) that may write the cache it is given. The
    shared cache is only ever written by steps that run none (`--no-build`)."""
    private = beside.parent / f".{beside.name}.uv-cache"
    shutil.rmtree(private, ignore_errors=True)
    private.mkdir(parents=True)
    try:
        yield replace(uv, cache_dir=private)
    finally:
        shutil.rmtree(private, ignore_errors=True)


def _uv_lock(folder: Path, uv: UvSettings, interpreter: Interpreter) -> subprocess.CompletedProcess[str]:
    """`uv lock` without building anything, on the shared cache; where the lock needs a build (an sdist, a git
    or dynamic-metadata source), again with a cache of its own, since a build runs the submitter's code."""
    result = _uv_lock_once(folder, uv, interpreter, ["--no-build"])
    if result.returncode == 0 or not needs_build(result.stderr):
        return result
    with cache_for_builds(uv, folder) as private:
        return _uv_lock_once(folder, private, interpreter, [])


def _uv_lock_once(
    folder: Path, uv: UvSettings, interpreter: Interpreter, extra: list[str]
) -> subprocess.CompletedProcess[str]:
    command = [*uv.command, "lock", "--python", interpreter.path, *uv.index_args(), *extra]
    # uv asks the model's build backend (the submitter's code) for its metadata: it reads the snapshots (and the
    # local git repositories the configuration allows) and writes the lock project and uv's cache only.
    reads = [*linked_roots(folder), *uv.reads(interpreter.path)]
    with confined(command, uv.env(interpreter), read=reads, write=[folder, uv.cache()], enabled=uv.confine) as (
        argv,
        env,
    ):
        try:
            return subprocess.run(
                argv, cwd=folder, capture_output=True, text=True, env=env, timeout=uv.timeout_s, check=False
            )
        except subprocess.TimeoutExpired:
            raise InvalidArgument(f"locking the model's dependencies took more than {uv.timeout_s:.0f} s") from None


def _requirement_name(requirement: str) -> str:
    from packaging.requirements import InvalidRequirement, Requirement

    try:
        return Requirement(requirement).name.lower().replace("_", "-")
    except InvalidRequirement:
        return requirement


def _unique(items: list[str]) -> list[str]:
    return list(dict.fromkeys(items))


def _inline(value: dict[str, Any]) -> str:
    return "{ " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in value.items()) + " }"
