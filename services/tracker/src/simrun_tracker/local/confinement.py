"""What a local pod may see: the variables it gets (an allow-list) and the paths Landlock lets it read and write.

A pod runs as the server's user on this machine, so without these it would be the server: its environment
(`SIMRUN_TOKEN`, `HOME`, `SIMRUN_HOME`), the tokens file, every run and snapshot. The local executor starts each
pod as `python -I …/simrun_runtime/confine.py --read … --write … -- <the pod's command>` with the environment of
`pod_environment`; `simrun_runtime.confine` restricts the process tree with Landlock before the runtime starts.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from simrun_core.errors import InvalidArgument
from simrun_runtime.confine import LAUNCHER, SHARED_MEMORY, landlock_abi
from simrun_runtime.layout import StoreLayout

log = logging.getLogger(__name__)

PASSED_VARIABLES = ("PATH", "LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "LC_NUMERIC", "LC_MESSAGES", "TZ")
"""The server's variables a pod inherits: where programs are and how text and time are shown. Nothing else
of the server's environment reaches a pod; a config may name more (`pod_variables`)."""

FIXED_VARIABLES = {"PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1", "PYTHONNOUSERSITE": "1"}
"""Set in every pod: no bytecode written next to read-only snapshots, unbuffered logs, no user site-packages."""

DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"

TRACE_VARIABLES = ("TRACEPARENT", "TRACESTATE")
"""The runtime contract's trace context (the W3C environment carrier): not `SIMRUN_` variables, but the contract's."""


class ConfinementMode(StrEnum):
    """How the local executor confines pods: `auto` (Landlock where the kernel has it), `landlock`, or `off`."""

    AUTO = "auto"
    LANDLOCK = "landlock"
    OFF = "off"


def pod_environment(
    contract: Mapping[str, str],
    scratch: Path,
    server_environ: Mapping[str, str] | None = None,
    extra: Iterable[str] = (),
) -> dict[str, str]:
    """The whole environment of a pod: the runtime contract, a private `HOME`/`TMPDIR`, a few of the server's.

    Args:
        contract: the runtime contract's variables (`SIMRUN_RUN_DIR`, `SIMRUN_TASK`, …).
        scratch: the pod's own scratch folder; it is also its `HOME`, `TMPDIR` and `SIMRUN_SCRATCH`.
        server_environ: the server's environment (default `os.environ`); only `PASSED_VARIABLES` and `extra` pass.
        extra: more variable names the server's config lets through (`pod_variables`).
    """
    source = os.environ if server_environ is None else server_environ
    passed = {name: source[name] for name in (*PASSED_VARIABLES, *extra) if name in source}
    passed.setdefault("PATH", DEFAULT_PATH)
    unexpected = sorted(
        k for k in contract if not k.startswith("SIMRUN_") and k not in FIXED_VARIABLES and k not in TRACE_VARIABLES
    )
    if unexpected:
        raise ValueError(f"not runtime contract variables: {', '.join(unexpected)}")
    home = str(scratch)
    return {
        **passed,
        **FIXED_VARIABLES,
        **contract,
        "HOME": home,
        "TMPDIR": home,
        "SIMRUN_SCRATCH": home,
    }


@dataclass(frozen=True)
class PodPaths:
    """The paths of one pod: read the run and its snapshots, write the task's own folder and the scratch."""

    read: tuple[Path, ...]
    write: tuple[Path, ...]

    @classmethod
    def of(
        cls,
        store: StoreLayout,
        run_id: str,
        task_id: str,
        snapshots: Iterable[tuple[str, str]],
        scratch: Path,
        cgroup: Path | None = None,
    ) -> PodPaths:
        """A pod of `task_id` of `run_id`; `snapshots` are the run's (name, snapshot id) pairs."""
        run = store.run(run_id)
        read = [run.root, *(store.snapshot(name, snapshot_id) for name, snapshot_id in snapshots)]
        if cgroup is not None:
            read.append(cgroup)
        return cls(tuple(read), (run.task(task_id).root, scratch))


class PodConfinement:
    """Builds the confined command of a pod, or the plain one where confinement is off or impossible.

    Args:
        mode: `auto` confines with Landlock where the kernel has it and warns once where it does not;
            `landlock` refuses to start without it; `off` runs pods unconfined (a warning says so).
        network: whether pods reach the network; False puts each in a network namespace of its own with only its
            loopback (`simrun_runtime.confine.isolate_network`), which only a confined pod can be given.
    """

    def __init__(self, mode: ConfinementMode | str = ConfinementMode.AUTO, *, network: bool = True) -> None:
        self.mode = ConfinementMode(mode)
        self.network = network
        self.abi = landlock_abi() if self.mode is not ConfinementMode.OFF else 0
        if self.mode is ConfinementMode.LANDLOCK and self.abi < 1:
            raise RuntimeError("confinement: landlock is configured but this kernel has no Landlock (Linux 5.13+)")
        if not network and self.abi < 1:
            raise RuntimeError(
                "executor.local.pod_network: false needs confined pods (confinement auto or landlock, on Linux "
                "5.13+ with Landlock): set pod_network: true or turn confinement on"
            )
        if self.mode is ConfinementMode.OFF:
            log.warning("confinement is off: pods run with the server's rights and can read and write the store")
        elif self.abi < 1:
            log.warning(
                "this kernel has no Landlock: pods run unconfined with the server's rights (the store, the tokens); "
                "run simrun on Linux 5.13+ or give each submitter their own server"
            )

    @property
    def confining(self) -> bool:
        """Whether pods run confined."""
        return self.abi >= 1

    def describe(self) -> str:
        """One line for the server's start and the pod logs."""
        if not self.confining:
            return "unconfined"
        return f"landlock ABI {self.abi}" + ("" if self.network else ", no network")

    def command(self, interpreter: str, command: list[str], paths: PodPaths) -> list[str]:
        """`command` run by the Landlock launcher with the pod's paths, or `command` unconfined.

        The launcher is run as a script in isolated mode (`-I`): it needs the standard library only, so the pod
        pays one interpreter start for it, not the runtime's imports twice.
        """
        if not self.confining:
            return list(command)
        launcher = [interpreter, "-I", LAUNCHER, *([] if self.network else ["--no-network"])]
        for path in paths.read:
            launcher += ["--read", str(path)]
        for path in paths.write:
            launcher += ["--write", str(path)]
        return [*launcher, "--", *command]


def check_visible_to_pods(mode: ConfinementMode | str, folders: Mapping[str, Path]) -> None:
    """Refuses a folder that confined pods would not see: each of them (and the describer) gets a /dev/shm of its
    own, so a store or environments under /dev/shm would look empty to them, found out only at a first submission
    as a model that cannot be imported.

    Raises:
        InvalidArgument: a folder of `folders` (what it is, its path) is /dev/shm or under it while pods are
            confined.
    """
    if ConfinementMode(mode) is ConfinementMode.OFF or landlock_abi() < 1:
        return
    for what, path in folders.items():
        if path.resolve().is_relative_to(SHARED_MEMORY):
            raise InvalidArgument(
                f"{what} {path} is under {SHARED_MEMORY}, which every confined pod has a private one of, so pods "
                "would not see it: put it elsewhere, or set executor.local.confinement: off"
            )
