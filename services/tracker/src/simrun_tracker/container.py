"""The container of a pod: the one function that turns a pod spec into what a container runtime runs.

Both adapters that run images render it: the kubernetes adapter as a Workflow template's container
(`kubernetes.render`), the containers adapter as `podman run` (`containers.podman`). So a pod on one machine's
containers is the pod a cluster runs: the image by digest, `python -m` of the runtime's entry point, only the runtime
contract's variables, requests = limits, a read-only root with `/tmp` and `/scratch` on empty folders, a non-root
user, the run read-only with the task's folder read-write over it and each of the run's snapshots read-only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from simrun_core.errors import FailedPrecondition, InvalidArgument
from simrun_runtime.layout import NAME, TASK_ID

from simrun_tracker.executor import STORE_PATH_VARIABLES, PodSpec

SCRATCH = "/scratch"
TMP = "/tmp"
RUN_AS_USER = 1000

_ALLOWED_VARIABLES = re.compile(r"^(SIMRUN_[A-Z0-9_]+|PYTHONDONTWRITEBYTECODE|PYTHONUNBUFFERED|TRACEPARENT)$")


@dataclass(frozen=True)
class StoreMount:
    """A folder of the store mounted into the container: `subpath` relative to the store, at `target`."""

    subpath: str
    target: str
    read_only: bool


@dataclass(frozen=True)
class ContainerSpec:
    """What a container runtime runs for one pod (one attempt's memory and processes)."""

    image: str
    """By digest: `repo@sha256:…`."""
    command: list[str]
    env: dict[str, str]
    cores: int
    memory_gb: float
    """The memory request and hard limit, GiB."""
    mounts: list[StoreMount]
    """The store's folders, in mount order: a later mount lies over an earlier one."""
    tmpfs: tuple[str, ...] = (TMP, SCRATCH)
    """Empty writable folders; everything else of the root file system is read-only."""
    user: int = RUN_AS_USER


def container_spec(
    pod: PodSpec,
    *,
    image: str,
    store_mount: str,
    python: str,
    snapshots: list[str],
    worker: str | None = None,
    processes: int | None = None,
    memory_gb: float | None = None,
    user: int = RUN_AS_USER,
) -> ContainerSpec:
    """The container of `pod`: `image` (by digest), the store mounted at `store_mount`, `python` running the
    runtime's module, and `snapshots` (`snapshots/<name>/<id>`, relative to the store) the run's snapshots.

    Args:
        worker: the worker name the container gets (an Argo parameter for extra workers), the pod's by default.
        processes, memory_gb: the attempt's (after a kill for memory they are the retry's), the plan's by default.

    Raises:
        FailedPrecondition: an image not named by digest.
        InvalidArgument: a variable outside the runtime contract, a run directory that is not the pod's run, a task
            id or snapshot folder a store path may not have.
    """
    if "@sha256:" not in image:
        raise FailedPrecondition(f"pod {pod.pod_id}: image {image!r} is not named by digest (repo@sha256:…)")
    if not TASK_ID.fullmatch(pod.task_id):  # it names the pod's writable mount
        raise InvalidArgument(f"pod {pod.pod_id}: task id {pod.task_id!r} is not a task id ({TASK_ID.pattern})")
    variables: dict[str, str] = {}
    for key, value in pod.contract.items():
        if not _ALLOWED_VARIABLES.match(key):
            raise InvalidArgument(f"pod {pod.pod_id}: {key} is not a variable of the runtime contract")
        variables[key] = f"{store_mount}/{value}" if key in STORE_PATH_VARIABLES else value
    run_dir = f"{store_mount}/runs/{pod.run_id}"
    if variables.setdefault("SIMRUN_RUN_DIR", run_dir) != run_dir:
        raise InvalidArgument(
            f"pod {pod.pod_id}: SIMRUN_RUN_DIR must be runs/{pod.run_id}, not {variables['SIMRUN_RUN_DIR']}"
        )
    variables.update(
        SIMRUN_WORKER=worker or pod.worker,
        SIMRUN_PROCESSES=str(processes or pod.processes),
        SIMRUN_GRACE_S=f"{pod.grace_s:g}",
        SIMRUN_SCRATCH=SCRATCH,
        # The container's own cgroup (cgroup namespaces): the runtime samples its memory and counts its OOM kills.
        SIMRUN_CGROUP="self",
        # An image holds the locked dependencies but no snapshot: the pod installs the run's packages editable
        # into its scratch at its start, offline, with their own backends (`simrun_runtime.editable`).
        SIMRUN_INSTALL_SNAPSHOTS="1",
        # As a pod on this machine (DESIGN's containment): its scratch is its home (the root file system is
        # read-only), output reaches the log at once (live logs), no user site-packages.
        HOME=SCRATCH,
        TMPDIR=SCRATCH,
        PYTHONUNBUFFERED="1",
        PYTHONNOUSERSITE="1",
    )
    task_folder = f"runs/{pod.run_id}/tasks/{pod.task_id}"
    mounts = [
        # The run read-only (its record, its inputs), the task's own folder the only writable part of the store
        # (mounted after, over it), and the run's snapshots only, read-only: as a pod on this machine is confined.
        StoreMount(f"runs/{pod.run_id}", run_dir, read_only=True),
        StoreMount(task_folder, f"{store_mount}/{task_folder}", read_only=False),
        *(StoreMount(s, f"{store_mount}/{s}", read_only=True) for s in snapshot_folders(pod.run_id, snapshots)),
    ]
    return ContainerSpec(
        image=image,
        command=[python, "-m", pod.role.module],
        env=variables,
        cores=pod.cores,
        memory_gb=memory_gb or pod.memory_gb,
        mounts=mounts,
        user=user,
    )


def snapshot_folders(run_id: str, snapshots: list[str]) -> list[str]:
    """A run's snapshot folders, each `snapshots/<name>/<id>` with names a store path may have, once each."""
    folders = []
    for folder in snapshots:
        parts = folder.split("/")
        if len(parts) != 3 or parts[0] != "snapshots" or not all(NAME.fullmatch(p) for p in parts[1:]):
            raise InvalidArgument(f"run {run_id}: {folder!r} is not a snapshot folder snapshots/<name>/<id>")
        if folder not in folders:
            folders.append(folder)
    return folders
