"""Local environments: a venv per environment built once from its lock, and a per-run overlay of the snapshots.

A venv shared by runs of different code cannot hold editable installs (their `.pth` and dist-info name one
snapshot), so each run gets an overlay: a small venv whose `.pth` adds the shared venv's site-packages with
`site.addsitedir` (so the shared venv's own `.pth` files apply), and the run's snapshots installed editable into it
offline, without build isolation (the backends are in the shared venv). Both are built under a file lock and marked
ready by a file written last: concurrent requests build once, a half-built one is removed and built again.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

from simrun_runtime.editable import EDITABLE_FRONTEND, EditableError, install_wheel, json_line, project_view

from simrun_envbuilder.lock import UvSettings, cache_for_builds, needs_build, reason
from simrun_envbuilder.pythons import Interpreter
from simrun_envbuilder.sandbox import confined, interpreter_prefixes, linked_roots

READY = "ready"
LOG_TAIL_LINES = 20

Progress = Callable[[str], None]

# The lines of a build tool's output that are whole statements of its progress, shown as they are: uv's counts and
# downloads, buildah's steps, BuildKit's step headers; none that names a path of this machine. Every other line (a
# warning continued on the next line, a backend's chatter) goes to the build's log only: a progress line never
# shows a fragment of another tool's message.
_STATUS_LINE = re.compile(
    r"(?:(?:Resolved|Prepared|Installed|Uninstalled|Audited) \d+ packages? in \S+"
    r"|Downloading [\w.-]+ \([\d.]+\s?[KMG]i?B\)"
    r"|Built [\w.-]+(?:==[\w.+!-]+)?"
    r"|Bytecode compiled \d+ files? in \S+"
    r"|STEP \d+/\d+: .+"
    r"|#\d+ \[[^\]]+\] .+)"
)


class BuildError(RuntimeError):
    """A step of a build failed; the message names the step and quotes the tool's reason."""


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive `flock` on `path` (made if missing): one builder per environment across processes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def is_locked(path: Path) -> bool:
    """Whether a process holds the `flock` on `path` now (a build under way somewhere on this machine)."""
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing releases a lock this probe took
    return False


def is_ready(folder: Path) -> bool:
    return (folder / READY).is_file()


def mark_ready(folder: Path) -> None:
    temp = folder / f".{READY}.{os.getpid()}"
    temp.write_text(f"{time.time()}\n")
    os.replace(temp, folder / READY)


def remove(folder: Path) -> None:
    """Removes a folder (a half-built or expired environment); unmarks it first so no reader takes it as ready."""
    with contextlib.suppress(FileNotFoundError):
        (folder / READY).unlink()
    shutil.rmtree(folder, ignore_errors=True)


def python_of(venv: Path) -> Path:
    return venv / "bin" / "python"


def site_packages(venv: Path) -> Path:
    found = sorted((venv / "lib").glob("python3*/site-packages"))
    if not found:
        raise BuildError(f"{venv} has no site-packages")
    return found[0]


@dataclass(frozen=True)
class VenvBuild:
    """The steps of building a shared venv from a lock project (pyproject.toml, uv.lock, the runtime wheel)."""

    uv: UvSettings
    interpreter: Interpreter
    project: Path
    venv: Path
    runtime_wheel: Path
    log: Path
    niceness: int = 0
    """Added to uv's nice value (and idle I/O class when above 0): a venv built beside an image, for describers
    only, yields the machine to the image's build."""

    def run(self, progress: Progress) -> None:
        """Creates the venv, installs the locked third-party packages, then simrun-runtime last.

        Raises:
            BuildError: a step failed, with uv's reason and the log's tail.
        """
        version = ".".join(map(str, self.interpreter.version))
        progress(f"installing the locked packages into a venv with Python {version}")
        # uv sync makes the venv itself (UV_PROJECT_ENVIRONMENT): one process fewer than `uv venv` first.
        sync = [
            "sync",
            "--python",
            self.interpreter.path,
            "--frozen",
            "--no-install-local",
            "--no-install-package",
            "simrun-runtime",
            *self.uv.index_args(),
        ]
        env = {"UV_PROJECT_ENVIRONMENT": str(self.venv)}
        try:
            # Wheels only, on the shared cache: nothing of a submitter's runs while that cache is writable.
            self._uv([*sync, "--no-build"], "uv sync", progress, env=env, cwd=self.project)
        except BuildError as exc:
            if not needs_build(str(exc)):
                raise
            progress("building packages from source, with a uv cache of this environment's own")
            shutil.rmtree(self.venv, ignore_errors=True)
            with cache_for_builds(self.uv, self.venv) as private:
                replace(self, uv=private)._uv(sync, "uv sync", progress, env=env, cwd=self.project)
        progress("installing simrun-runtime")
        self._uv(
            [
                "pip",
                "install",
                "--python",
                str(python_of(self.venv)),
                "--no-deps",
                "--offline",
                str(self.runtime_wheel),
            ],
            "installing simrun-runtime",
            progress,
        )

    def _uv(
        self,
        args: list[str],
        step: str,
        progress: Progress,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        # An sdist's setup.py runs here: the step writes the environment's own folder (its venv) and uv's cache.
        reads = [*linked_roots(self.project), *self.uv.reads(self.interpreter.path), self.runtime_wheel]
        with confined(
            [*self.uv.command, *args],
            {**self.uv.env(self.interpreter), **(env or {})},
            read=reads,
            write=[self.venv.parent, self.uv.cache()],
            enabled=self.uv.confine,
        ) as (command, variables):
            run_logged(command, step, self.log, progress, variables, cwd, self.uv.timeout_s, self.niceness)


def run_logged(
    command: list[str],
    step: str,
    log: Path,
    progress: Progress,
    env: dict[str, str],
    cwd: Path | None = None,
    timeout_s: float = 900.0,
    niceness: int = 0,
) -> None:
    """Runs one step of a build with its output appended to the build's log; the tool's whole status lines
    (`_STATUS_LINE`) and the step's time are also sent to `progress`, prefixed by the step. A `niceness` above 0
    runs it under `nice` and `ionice -c 3` (idle I/O) where this machine has them."""
    started = time.monotonic()
    if niceness > 0:
        command = [*_lower_priority(niceness), *command]
    with log.open("a") as out:
        out.write(f"$ {' '.join(command)}\n")
        out.flush()
        try:
            proc = subprocess.Popen(
                command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
        except OSError as exc:
            raise BuildError(f"{step} could not start: {exc}") from exc
        lines: list[str] = []
        deadline = time.monotonic() + timeout_s
        with proc:
            assert proc.stdout is not None
            for line in proc.stdout:
                out.write(line)
                lines.append(line.rstrip())
                if _STATUS_LINE.fullmatch(line.strip()):
                    progress(f"{step}: {line.strip()}")
                if time.monotonic() > deadline:
                    proc.kill()
                    break
            code = proc.wait()
    if code != 0:
        raise BuildError(f"{step} failed (exit {code}): {reason(chr(10).join(lines))}\nlog tail:\n{tail(log)}")
    progress(f"{step}: done in {time.monotonic() - started:.1f} s")


def _lower_priority(niceness: int) -> list[str]:
    """The prefix that runs a command at a lower CPU and I/O priority: `nice` and `ionice` of util-linux and
    coreutils where found (a machine without them runs it at the server's priority)."""
    prefix = []
    if ionice := shutil.which("ionice"):
        prefix += [ionice, "-c", "3"]
    if nice := shutil.which("nice"):
        prefix += [nice, "-n", str(niceness)]
    return prefix


def tail(log: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return ""


def compile_bytecode(venv: Path, log: Path, confine: bool = True) -> bool:
    """Compiles the venv's site-packages to bytecode, so pods do not compile what they import; True if it did.

    Runs after the venv is marked ready: `py_compile` replaces each `.pyc` atomically, so a pod importing at the
    same time reads a whole file or none. The venv's interpreter runs its packages' `.pth` files: confined to the
    venv.
    """
    python = python_of(venv)
    command = [str(python), "-m", "compileall", "-q", "-j", "0", str(site_packages(venv))]
    reads = interpreter_prefixes(python)
    with confined(command, {}, read=reads, write=[venv], enabled=confine) as (argv, env), log.open("a") as out:
        code = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, env=env, check=False).returncode
    return code == 0


@dataclass(frozen=True)
class Editable:
    """A source to install editable into an overlay: its root and how a submitter names it (its snapshot's name
    and folder), for a failure's message."""

    root: Path
    label: str


def make_overlay(base_venv: Path, overlay: Path, editables: list[Editable], log: Path, confine: bool = True) -> Path:
    """Builds the overlay of one set of snapshots on a shared venv and returns its interpreter: a bare venv, a
    `.pth` adding the shared site-packages, and the snapshots' editable wheels built by their backends offline.

    Raises:
        BuildError: the venv or an editable install failed, naming the source, its backend, its reason and a fix.
    """
    _bare_venv(base_venv, overlay)
    shared = site_packages(base_venv)
    (site_packages(overlay) / "_simrun_environment.pth").write_text(f"import site; site.addsitedir({str(shared)!r})\n")
    if editables:
        wheels = _editable_wheels(python_of(overlay), editables, overlay / ".editables", log, base_venv, confine)
        target = site_packages(overlay)
        try:
            for wheel in wheels:
                install_wheel(wheel, target)
        except EditableError as exc:
            raise BuildError(str(exc)) from None
        shutil.rmtree(overlay / ".editables", ignore_errors=True)
    return python_of(overlay)


REASON_LINES = 3
"""How many lines of a build backend's reason a failed editable build quotes."""


def _editable_wheels(
    python: Path, sources: list[Editable], dest: Path, log: Path, base_venv: Path, confine: bool = True
) -> list[Path]:
    """Builds the editable wheels of `sources` with their own backends (PEP 660), all in one process of the
    overlay's interpreter, where the shared venv provides the backends: one backend import instead of one per
    hook and source, offline.

    The backends (an in-tree one is the model's own code) run confined: they read the sources and the venvs and
    write `dest` only."""
    dest.mkdir(parents=True)
    roots = [s.root for s in sources]
    projects = [project_view(root, dest.parent / "sources" / str(i)) for i, root in enumerate(roots)]
    command = [str(python), "-c", EDITABLE_FRONTEND, str(dest), *map(str, projects)]
    reads = [*roots, *interpreter_prefixes(python, python_of(base_venv)), base_venv]
    # As a PEP 517 frontend does, the build environment's scripts come first on PATH (uv_build runs its binary).
    path = {"PATH": os.pathsep.join([str(base_venv / "bin"), os.environ.get("PATH", os.defpath)])}
    with (
        confined(command, path, read=reads, write=[dest, *projects], enabled=confine) as (argv, env),
        log.open("a") as out,
    ):
        out.write(f"$ building editable wheels of {', '.join(map(str, roots))}\n")
        result = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600, check=False)
        out.write(result.stderr + result.stdout)
    lines = result.stdout.strip().splitlines()
    answer = json_line(lines[-1]) if lines else None
    if isinstance(answer, dict) and isinstance(answer.get("failed"), int) and answer["failed"] < len(sources):
        raise BuildError(_failed_build(sources[answer["failed"]], answer))
    if result.returncode != 0 or not isinstance(answer, list):
        raise BuildError(f"building the snapshots editable failed: {reason(result.stderr + result.stdout)}")
    return [Path(p) for p in answer]


def _failed_build(source: Editable, answer: dict[str, object]) -> str:
    """What a submitter reads when a source's editable build failed: the source, the backend, its reason in at
    most three lines, and the fix that fits."""
    backend, kind = str(answer.get("backend", "")), answer.get("kind")
    lines = [line.strip() for line in str(answer.get("reason", "")).splitlines() if line.strip()]
    why = "\n".join(line.removeprefix("error: ") for line in lines[:REASON_LINES]) or "no reason given"
    not_a_package = (
        "or, if it is not meant to be installed, set `[tool.uv] package = false` (it is then imported from its root)"
    )
    if kind == "missing-backend":
        module = backend.partition(":")[0]
        fix = (
            f"name the package that provides {module!r} in its `[build-system] requires` (for example "
            f'`requires = ["hatchling"]` with `build-backend = "hatchling.build"`), {not_a_package}'
        )
    elif kind == "no-editable":
        fix = (
            f"{backend} cannot build an editable install (no PEP 660 build_editable): use a backend that can "
            f"(setuptools>=64, hatchling, flit-core>=3.4, pdm-backend, uv_build), {not_a_package}"
        )
    elif "flat-layout" in why:
        fix = f'name its packages in `[tool.setuptools] packages = ["..."]` in its pyproject.toml, {not_a_package}'
    else:
        fix = f"fix its build (`uv build` in its folder shows the whole output), {not_a_package}"
    return f"building {source.label} editable with {backend} failed: {why}\nfix: {fix}"


def _bare_venv(base_venv: Path, overlay: Path) -> None:
    """A venv without pip or scripts made by hand (what `uv venv` makes, in a millisecond instead of a process):
    the shared venv's `pyvenv.cfg`, `bin/python` naming the same base interpreter, an empty site-packages."""
    config = (base_venv / "pyvenv.cfg").read_text()
    base = Path(os.path.realpath(python_of(base_venv)))
    lib = site_packages(base_venv).relative_to(base_venv)
    (overlay / lib).mkdir(parents=True)
    (overlay / "bin").mkdir()
    (overlay / "pyvenv.cfg").write_text(config)
    for name in ("python", "python3", lib.parent.name):
        (overlay / "bin" / name).symlink_to(base)
    if (base_venv / "lib64").is_symlink():
        (overlay / "lib64").symlink_to("lib")


def folder_size(folder: Path) -> int:
    """Bytes a folder takes on disk (blocks), not following symlinks."""
    total = 0
    for dirpath, dirnames, filenames in os.walk(folder):
        for name in filenames + dirnames:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
    return total
