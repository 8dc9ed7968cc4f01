"""The containers executor: every pod of a plan as a container of its run's image, run with podman on this machine.

It is the local executor's scheduler (admission by cores and memory, priorities, preemption by SIGTERM, retries by
exit code, the log bound) with another way of running an attempt: `podman run` of the container spec every image
adapter renders (`simrun_tracker.container`), so a pod here is the pod a cluster runs. Memory is limited by the
pod's own cgroup, which podman nests the container under (`--cgroup-parent`): it outlives the container, so the
evidence of a kill for memory is read there after the exit (v2 counts the kill in it; v1 counts it in the
container's own cgroup, gone with the container, so there the evidence is that the pod's cgroup reached its limit).
Each container carries labels naming its executor, run, task and worker; a starting executor removes the
containers of executors that died (a server killed), whose runs its driver starts again from their ledgers.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import resource
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from simrun_core.config import ContainersConfig, LocalExecutorConfig
from simrun_core.errors import FailedPrecondition, InvalidArgument
from simrun_planner import Node

from simrun_tracker.container import ContainerSpec, container_spec
from simrun_tracker.executor import PodSpec
from simrun_tracker.local.config import configured_nodes
from simrun_tracker.local.confinement import PodConfinement
from simrun_tracker.local.executor import LocalExecutor, _Pod, _snapshots
from simrun_tracker.local.memory import CGROUP_MOUNT, _alive

logger = logging.getLogger(__name__)

STORE_MOUNT = "/store"
"""Where a container sees the store (the kubernetes adapter's default mount, so paths in logs read the same)."""
EXECUTOR_LABEL = "io.simrun.executor"
RUN_LABEL = "io.simrun.run"
TASK_LABEL = "io.simrun.task"
WORKER_LABEL = "io.simrun.worker"
PODMAN_TIMEOUT_S = 60.0
PODMAN_EXITS = {
    125: "podman's own error, e.g. an image it cannot pull",
    126: "the command cannot be run",
    127: "the command is not in the image",
}
"""`podman run`'s exit codes that are podman's, not the container's."""

ImageOf = Callable[[PodSpec], str]
"""The image (by digest) a pod runs: its environment's, or the default image for a model without a lock."""


class ContainerExecutor(LocalExecutor):
    """Runs pods as podman containers of their run's image (see `simrun_tracker.executor.Executor`).

    Args:
        store_root: the run store on this machine, mounted into each container at `STORE_MOUNT` in parts.
        image_of: the image a pod runs, by digest.
        settings: the podman command, the network, the interpreter, the user and the limits of a container.
        cgroup_root: the memory cgroup mount; `"auto"` to detect it. Containers need it: it holds their limits.
        Other arguments as `LocalExecutor`'s.

    Raises:
        FailedPrecondition: no memory cgroups can be made here, or podman does not answer.
    """

    def __init__(
        self,
        store_root: Path,
        image_of: ImageOf,
        settings: ContainersConfig | None = None,
        nodes: list[Node] | None = None,
        cgroup_root: Path | Literal["auto"] | None = "auto",
        poll_s: float = 0.1,
        log_bytes: int = 1 << 30,
    ) -> None:
        self._settings = settings or ContainersConfig()
        self._podman = list(self._settings.podman)
        self._image_of = image_of
        self._signalling: list[subprocess.Popen[bytes]] = []
        """`podman kill` commands under way, reaped by the scheduler's passes."""
        self._ulimits = [
            *("--ulimit", _ulimit("nofile", resource.RLIMIT_NOFILE, self._settings.ulimit_nofile)),
            *("--ulimit", _ulimit("nproc", resource.RLIMIT_NPROC, self._settings.ulimit_nproc)),
        ]
        version = self._podman_version()
        # No niceness (a container's processes are conmon's children, not podman's) and no Landlock: the container
        # confines the pod.
        super().__init__(
            store_root,
            lambda spec: [],
            nodes,
            cgroup_root,
            poll_s,
            confinement=PodConfinement("off"),
            log_bytes=log_bytes,
            pod_nice=0,
        )
        if self._cgroups is None:
            self.close()
            raise FailedPrecondition(
                "the containers executor needs memory cgroups (they hold each container's limit): run the server "
                "as root where /sys/fs/cgroup has the memory controller, or use executor.kind: local"
            )
        self._podman_describe = f"podman {version}"
        self._remove_stale_containers()

    @classmethod
    def from_configs(
        cls, containers: ContainersConfig, local: LocalExecutorConfig, store_root: Path, image_of: ImageOf
    ) -> ContainerExecutor:
        """The executor of a server config's `executor.containers`, scheduled as `executor.local` says."""
        return cls(
            store_root,
            image_of,
            containers,
            nodes=configured_nodes(local.nodes),
            cgroup_root=local.cgroup_root,
            poll_s=local.poll_s,
            log_bytes=local.log_bytes_per_pod,
        )

    def _podman_version(self) -> str:
        try:
            done = subprocess.run(
                [*self._podman, "version", "--format", "{{.Client.Version}}"],
                capture_output=True,
                text=True,
                timeout=PODMAN_TIMEOUT_S,
                check=False,
            )
        except (OSError, subprocess.SubprocessError) as exc:
            raise FailedPrecondition(
                f"the containers executor cannot run {self._podman[0]}: {exc}; install podman and runc "
                "(apt-get install podman runc) or set executor.containers.podman"
            ) from None
        if done.returncode != 0:
            raise FailedPrecondition(f"`{' '.join(self._podman)} version` failed: {done.stderr.strip()[-300:]}")
        return done.stdout.strip()

    # How an attempt runs.

    def _attempt(self, pod: _Pod, name: str, processes: int, limit: int) -> tuple[list[str], dict[str, str]]:
        spec = pod.spec
        image = spec.image or self._image_of(spec) or self._settings.default_image
        if not image:
            raise FailedPrecondition(
                f"pod {spec.pod_id} has no image: its environment was built as a venv (set environments.kind: image) "
                "and executor.containers.default_image is not set"
            )
        pod.image = image
        snapshots = [f"snapshots/{n}/{i}" for n, i in _snapshots(self._store.run(spec.run_id).record)]
        container = container_spec(
            spec,
            image=image,
            store_mount=STORE_MOUNT,
            python=self._settings.python,
            snapshots=snapshots,
            processes=processes,
            memory_gb=limit / (1 << 30),
            user=self._settings.run_as_user,
        )
        assert self._cgroups is not None
        pod.cgroup = self._cgroups.create(name, limit, nested=True)
        self._own_task_folder(spec)
        parent = "/" + pod.cgroup.path.relative_to(self._cgroups.root).as_posix()
        command = [*self._podman, *self._run_arguments(container, _container_name(name), parent, spec)]
        # podman's own environment (the container gets only the spec's variables): where its helpers are.
        return command, {"PATH": os.environ.get("PATH", os.defpath), "HOME": os.environ.get("HOME", "/root")}

    def _run_arguments(self, container: ContainerSpec, name: str, cgroup_parent: str, spec: PodSpec) -> list[str]:
        """`podman run` of a container spec, attached (its output is the attempt's log), removed when it ends."""
        arguments = [
            "run",
            "--rm",
            "--name",
            name,
            "--pull",
            "missing",
            f"--tls-verify={str(self._settings.tls_verify).lower()}",
            "--cgroup-parent",
            cgroup_parent,
            "--read-only",
            "--read-only-tmpfs=false",
            "--user",
            f"{container.user}:{container.user}",
            "--cap-drop",
            "all",
            "--security-opt",
            "no-new-privileges",
            *(() if self._settings.network else ("--network", "none")),
            "--stop-timeout",
            str(max(1, round(spec.grace_s))),
            *self._ulimits,
            *("--label", f"{EXECUTOR_LABEL}={self.executor_id}"),
            *("--label", f"{RUN_LABEL}={spec.run_id}"),
            *("--label", f"{TASK_LABEL}={spec.task_id}"),
            *("--label", f"{WORKER_LABEL}={spec.worker}"),
        ]
        if container.cores > 0:
            arguments += ["--cpus", str(container.cores)]
        for folder in container.tmpfs:
            arguments += ["--tmpfs", f"{folder}:rw,nosuid,nodev,mode=1777"]
        for mount in container.mounts:
            source = self._store.root / mount.subpath
            options = "ro" if mount.read_only else "rw"
            arguments += ["--volume", f"{source}:{mount.target}:{options}"]
        for key, value in sorted(container.env.items()):
            arguments += ["--env", f"{key}={value}"]
        return [*arguments, "--workdir", STORE_MOUNT, container.image, *container.command]

    def _own_task_folder(self, spec: PodSpec) -> None:
        """Makes the task's folder (its only writable mount) and gives it to the pods' user: the server writes the
        store as its own user, the container runs as another. Never through a link the task's code left there."""
        task = self._store.run(spec.run_id).task(spec.task_id).root
        task.mkdir(parents=True, exist_ok=True)
        if os.geteuid() != 0:
            return
        user = self._settings.run_as_user
        for folder, folders, files in os.walk(task, followlinks=False):
            for entry in [folder, *(os.path.join(folder, n) for n in folders + files)]:
                with contextlib.suppress(OSError):
                    os.chown(entry, user, user, follow_symlinks=False)

    def _failure(self, code: int, described: str) -> str:
        if code in PODMAN_EXITS:
            return (
                f"podman could not run the container ({described}: {PODMAN_EXITS[code]}); "
                "the pod's log (simrun logs RUN TASK) has podman's reason"
            )
        return super()._failure(code, described)

    def _limit_by(self) -> str:
        assert self._cgroups is not None
        return f"the pod's cgroup v{self._cgroups.version}"

    def _contained(self, pod: _Pod) -> str:
        return f"container of {pod.image} ({self._podman_describe})"

    def _signal(self, pod: _Pod, sig: signal.Signals) -> None:
        """Sends `sig` to the container's first process: `podman kill` (signalling the attached client would
        leave the container running when the signal is SIGKILL)."""
        if pod.process is None:
            return
        name = _container_name(pod.attempt)
        with contextlib.suppress(OSError):
            self._signalling.append(
                subprocess.Popen(
                    [*self._podman, "kill", "--signal", sig.name, name],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )

    def _tick(self) -> None:
        super()._tick()
        self._signalling = [p for p in self._signalling if p.poll() is None]

    def _ended(self, pod: _Pod) -> None:
        """The container is gone once `podman run --rm` returns; its cgroup dirs in the other v1 hierarchies stay
        behind (podman makes the parent path in each), and go with the pod's memory cgroup."""
        assert self._cgroups is not None
        if pod.cgroup is not None:
            relative = pod.cgroup.path.relative_to(self._cgroups.root)
            pod.cgroup.remove()
            _remove_other_hierarchies(relative)

    def close(self) -> None:
        super().close()
        for kill in self._signalling:
            with contextlib.suppress(subprocess.TimeoutExpired):
                kill.wait(PODMAN_TIMEOUT_S)
        if self._cgroups is not None:
            _remove_other_hierarchies(self._cgroups.parent.relative_to(self._cgroups.root))

    def _remove_stale_containers(self) -> None:
        """Removes the containers of executors whose server died: their runs start again from their ledgers."""
        try:
            done = subprocess.run(
                [*self._podman, "ps", "--all", "--filter", f"label={EXECUTOR_LABEL}", "--format", "json"],
                capture_output=True,
                text=True,
                timeout=PODMAN_TIMEOUT_S,
                check=False,
            )
            listed = json.loads(done.stdout or "[]") if done.returncode == 0 else []
        except (OSError, subprocess.SubprocessError, json.JSONDecodeError):
            logger.exception("cannot list the containers of earlier executors")
            return
        stale = []
        for container in listed:
            owner = (container.get("Labels") or {}).get(EXECUTOR_LABEL, "")
            pid = owner.split("-")[0]
            if owner != self.executor_id and not (pid.isdigit() and _alive(int(pid))):
                stale.append(container.get("Id") or "")
        if stale:
            logger.warning("removing %d containers of executors that died", len(stale))
            subprocess.run(
                [*self._podman, "rm", "--force", "--ignore", *filter(None, stale)],
                capture_output=True,
                timeout=PODMAN_TIMEOUT_S,
                check=False,
            )


def _container_name(attempt: str) -> str:
    return "simrun-" + attempt.replace(".", "-")


def _ulimit(name: str, kind: int, wanted: int) -> str:
    """`name=N:N` within this machine's hard limit (podman's default nofile is above it here, and runc refuses
    no nproc)."""
    hard = resource.getrlimit(kind)[1]
    value = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    return f"{name}={value}:{value}"


def _remove_other_hierarchies(relative: Path) -> None:
    """Removes the (empty) folders podman made for a cgroup path in the v1 hierarchies other than memory, and
    their parents that are left empty (another executor's folders are not)."""
    if not relative.parts or ".." in relative.parts or relative.is_absolute():
        raise InvalidArgument(f"not a cgroup path below the root: {relative}")
    with contextlib.suppress(OSError):
        for hierarchy in CGROUP_MOUNT.iterdir():
            if hierarchy.name == "memory" or not hierarchy.is_dir() or hierarchy.is_symlink():
                continue
            folder = hierarchy / relative
            if folder.is_dir():
                for path in sorted((p for p in folder.rglob("*") if p.is_dir()), reverse=True):
                    with contextlib.suppress(OSError):
                        path.rmdir()
            for path in [folder, *folder.parents][: len(relative.parts)]:
                try:
                    path.rmdir()
                except FileNotFoundError:
                    continue
                except OSError:
                    break
