"""Build steps that run a submitter's code (uv locking and installing, build backends, `.pth` files) run confined.

Locking a model asks its build backend for metadata (an in-tree backend is the model's own code), installing runs
the `setup.py` of an sdist, building the editable wheels of a run's snapshots runs their backends, and every start
of an environment's interpreter runs the `.pth` files of its packages. All of it is code a submitter chose, so it
gets what a pod gets (DESIGN.md, "Containment"): an environment built from an allow-list (never the server's
`SIMRUN_TOKEN`, `SIMRUN_HOME` or `HOME`), a private `HOME`/`TMPDIR`, and, where the kernel has Landlock, the
launcher of `simrun_runtime.confine` with reads of the step's inputs only and writes of its own output, uv's cache
and its scratch only; never the home (tokens, token), the runs or other environments.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path

from simrun_runtime.confine import landlock_abi, launcher_command

PASSED_VARIABLES = (
    "PATH",
    "LANG",
    "LANGUAGE",
    "LC_ALL",
    "LC_CTYPE",
    "LC_NUMERIC",
    "LC_MESSAGES",
    "TZ",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "ALL_PROXY",
    "NO_PROXY",
    "http_proxy",
    "https_proxy",
    "all_proxy",
    "no_proxy",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
)
"""The server's variables a build step inherits: where programs are, how text and time are shown, and how to reach
the package index (proxies, certificates). Nothing else of the server's environment reaches a build."""

_CERTIFICATE_VARIABLES = ("SSL_CERT_FILE", "SSL_CERT_DIR")


def build_variables(overrides: Mapping[str, str], server_environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The whole environment of a build step: the allow-list of the server's variables, then `overrides`."""
    source = os.environ if server_environ is None else server_environ
    return {**{name: source[name] for name in PASSED_VARIABLES if name in source}, **overrides}


def interpreter_prefixes(*interpreters: str | Path) -> list[Path]:
    """The installations of interpreters (a venv's and the one it was made from): what running them reads."""
    found: list[Path] = []
    for interpreter in interpreters:
        path = Path(interpreter)
        for candidate in (path, path.resolve()):
            found.append(candidate.parent.parent)
    return found


def linked_roots(folder: Path) -> list[Path]:
    """The targets of the symbolic links in `folder` (a lock project links the snapshots' trees): reads of a step."""
    found: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(folder):
        for name in (*dirnames, *filenames):
            path = Path(dirpath) / name
            if path.is_symlink():
                found.append(path.resolve())
    return found


def current_umask() -> int:
    """This process's umask, read without changing it (`os.umask` sets it, racing other threads)."""
    with contextlib.suppress(OSError, ValueError, StopIteration):
        status = Path("/proc/self/status").read_text().splitlines()
        return int(next(line for line in status if line.startswith("Umask:")).split()[1], 8)
    return 0o022


@contextlib.contextmanager
def confined(
    command: Sequence[str],
    variables: Mapping[str, str],
    *,
    read: Iterable[str | Path] = (),
    write: Iterable[str | Path] = (),
    enabled: bool = True,
) -> Iterator[tuple[list[str], dict[str, str]]]:
    """The command and environment a build step runs with; a private scratch folder lives until the block ends.

    Args:
        command: the step's command.
        variables: the step's own variables (uv's settings), on top of the allow-list.
        read: what the step reads beyond the system and the server's interpreter.
        write: what it writes (folders that exist); nothing else is writable.
        enabled: False runs the command unconfined (`confinement: off`); the environment is the allow-list anyway.
    """
    scratch = Path(tempfile.mkdtemp(prefix="simrun-build-"))
    try:
        env = {**build_variables(variables), "HOME": str(scratch), "TMPDIR": str(scratch)}
        if not enabled or landlock_abi() < 1:
            yield list(command), env
            return
        reads = [Path(p) for p in read]
        reads += [Path(env[name]) for name in _CERTIFICATE_VARIABLES if name in env]
        program = shutil.which(command[0], path=env.get("PATH")) or command[0]
        reads.append(Path(program).resolve())  # the program itself; an interpreter's installation is the caller's
        yield launcher_command([*command], read=reads, write=[*map(Path, write), scratch], umask=current_umask()), env
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
