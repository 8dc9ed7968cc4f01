"""The executor port: how the run tracker starts, observes and stops pods, whichever adapter runs them.

Nothing local crosses this port: a `PodSpec` names what to run (run, task, worker, role, environment id, resources,
priority class, grace and the runtime contract's variables with store-relative paths); each adapter maps the store
to its own mount and builds its own command. Exit codes are a container's: 128 + N for a process killed by signal N.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import PurePosixPath
from typing import Protocol

from simrun_planner import Node

COORDINATOR = "w0"
"""The worker name of a split task's coordinator and of an unsplit task's one pod."""

MERGE_WORKER = "merge"
"""The worker name of the merge pod of a plan recorded before the coordinator merged (the legacy `<task>-merge`)."""

STORE_PATH_VARIABLES = frozenset({"SIMRUN_RUN_DIR", "SIMRUN_PROVENANCE"})
"""Contract variables whose values are paths relative to the store root; an adapter prefixes its own mount."""

SIGKILL_EXIT = 137
SIGTERM_EXIT = 143


class PodRole(StrEnum):
    """What a pod runs: the runtime's entry point for its worker."""

    WORKER = "worker"
    """`simrun-worker`: a split task's coordinator (which merges) or an extra worker."""
    EXECUTE = "execute"
    """`simrun-exec`: an unsplit task's command or callable."""
    MERGE = "merge"
    """`simrun-merge`: the legacy merge pod after a coordinator that does not merge."""

    @property
    def module(self) -> str:
        """The runtime module the pod runs with `python -m`."""
        return {
            "worker": "simrun_runtime.worker",
            "execute": "simrun_runtime.execute",
            "merge": "simrun_runtime.merge",
        }[self.value]


class PodPhase(StrEnum):
    """The lifecycle of a pod as the tracker sees it."""

    PENDING = "pending"
    """Waiting for admission (new, preempted or retried)."""
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    """Final: a failing exit code, a second kill for memory, or stopped with its run."""

    @property
    def final(self) -> bool:
        return self in (PodPhase.SUCCEEDED, PodPhase.FAILED)


class TaskOrdering(StrEnum):
    """Who starts a run's tasks in the order of their inputs."""

    DRIVER = "driver"
    """The tracker's driver starts each task's pods once its inputs are merged (the local executor)."""
    ADAPTER = "adapter"
    """The adapter receives the whole run at once and orders its tasks itself (one Argo workflow per run)."""


class LocationError(ValueError):
    """A pod spec that names a host path: it would run on one machine only."""


@dataclass(frozen=True)
class PodSpec:
    """One pod of a task: what to run, with which resources and at which priority, and nothing local.

    The executor retries it as Argo's retry strategy would: exit 143 (stopped on SIGTERM, e.g. preempted) is
    queued again with the same memory; a kill for memory (evidence: the reason OOMKilled or kills counted in the
    pod's cgroup) or by SIGKILL (137) is retried once with `retry_memory_gb`; any other non-zero exit fails it.
    """

    run_id: str
    task_id: str
    worker: str
    """`w0` for the coordinator or an unsplit task's pod, `w1`… for extra workers, `merge` for a legacy merge pod."""
    role: PodRole
    environment_id: str
    """The run's environment (a venv on this machine, an image on a cluster), resolved by the adapter."""
    contract: dict[str, str]
    """The runtime contract's variables (SIMRUN_RUN_DIR, SIMRUN_TASK, …) with store-relative paths."""
    cores: int
    memory_gb: float
    """The memory request and hard limit, GiB."""
    processes: int
    retry_memory_gb: float
    """The memory of the retry after a kill for memory or by SIGKILL, GiB."""
    priority_class: str
    """e.g. `simrun-agent-extra`; its value decides admission order and preemption."""
    grace_s: float = 30.0
    """Seconds between SIGTERM and SIGKILL when the pod is stopped or preempted."""
    retry_processes: int | None = None
    """The worker processes of the retry, fewer where 1.5 times the memory per process needs it; None: the same."""
    image: str = ""
    """The run's image by digest, for adapters that run images; empty where the environment id suffices."""
    base_memory_gb: float = 0.0
    """The part of the memory that is not per process (the plan's base), GiB: per-process figures leave it out."""

    def __post_init__(self) -> None:
        for name in STORE_PATH_VARIABLES & self.contract.keys():
            path = PurePosixPath(self.contract[name])
            if path.is_absolute() or ".." in path.parts:
                raise LocationError(f"pod {self.pod_id}: {name} must be relative to the store, not {path}")

    @functools.cached_property
    def pod_id(self) -> str:
        return f"{self.run_id}.{self.task_id}.{self.worker}"

    @property
    def per_worker_gb(self) -> float:
        return self.per_process_gb(self.memory_gb, self.processes)

    def per_process_gb(self, memory_gb: float, processes: int) -> float:
        """The memory each process of an attempt has, as the plan counts it: the base left out."""
        return max(memory_gb - self.base_memory_gb, 0.0) / max(processes, 1)

    def processes_after(self, retried: bool) -> int:
        """The worker processes of an attempt: fewer after a kill for memory where the plan says so."""
        return (self.retry_processes or self.processes) if retried else self.processes

    @property
    def retry_per_worker_gb(self) -> float:
        return self.per_process_gb(self.retry_memory_gb, self.processes_after(True))


@dataclass(frozen=True)
class TaskSpec:
    """A task of a run handed to an adapter that orders tasks: its pods and the tasks whose outputs it reads."""

    task_id: str
    pods: list[PodSpec]
    depends_on: list[str] = field(default_factory=list)
    merge_pod: PodSpec | None = None
    """The legacy merge pod, run after the coordinator, for a plan whose coordinator does not merge."""


@dataclass(frozen=True)
class RunSpec:
    """A whole run for an adapter that orders tasks itself (`TaskOrdering.ADAPTER`)."""

    run_id: str
    tasks: list[TaskSpec]
    reservation: str | None = None
    snapshots: list[str] = field(default_factory=list)
    """The run's snapshot folders relative to the store (`snapshots/<name>/<id>`, the model's first): all of the
    store's snapshots its pods may read."""


@dataclass
class MemoryKill:
    """A pod killed for memory, with the evidence the concepts page asks for."""

    memory_gb: float
    per_worker_gb: float
    evidence: str
    """`cgroup` (kills counted in the pod's cgroup), `watchdog` (the local watchdog's sample) or `oomkilled`."""


@dataclass
class PodStatus:
    """What the executor knows of a pod now."""

    spec: PodSpec
    phase: PodPhase
    node: str | None = None
    attempts: int = 0
    """How many times it was started."""
    exit_code: int | None = None
    """The last exit code, a container's: 128 + N for a signal N."""
    memory_gb: float = 0.0
    """Its current memory limit (the retry memory once killed for memory or by SIGKILL)."""
    memory_kills: list[MemoryKill] = field(default_factory=list)
    sigkills: int = 0
    """Exits by SIGKILL without evidence of the OOM killer: retried once, not kills for memory."""
    preemptions: int = 0
    message: str = ""
    peak_memory_gb: float | None = None
    """The most anonymous memory the executor itself measured in the pod over its attempts, GiB (0.0 when it ran
    too briefly to be measured); None where the adapter measures nothing. It bounds what the pod's own worker
    report may claim to the learner: the report is written by the task's code."""


@dataclass(frozen=True)
class PodHistory:
    """What a run's record says of one of its pods, re-applied to an executor when the tracker starts."""

    task_id: str
    worker: str
    memory_kills: list[MemoryKill] = field(default_factory=list)
    attempts: int = 0
    sigkills: int = 0
    """Exits by SIGKILL without evidence of the OOM killer: after one the pod runs at its retry memory."""


@dataclass(frozen=True)
class RunRecovery:
    """What a restarted tracker re-applies for an active run: its reservation and its pods' history."""

    run_id: str
    reservation: str | None = None
    pods: list[PodHistory] = field(default_factory=list)


ChangeListener = Callable[[str], None]
"""Called with a run id whenever the executor observes a change of one of the run's pods."""


class Executor(Protocol):
    """Starts the pods of tasks with their plans, observes them, stops a run's pods, reserves nodes.

    Every method answers from the adapter's own state (its cache, as an informer keeps one) and never blocks on
    the network: a slow cluster API must not slow the driver or the read side. Stopping is a request.
    """

    ordering: TaskOrdering
    """Whether the driver starts tasks one by one (`start_pods`) or hands over the whole run (`start_run`)."""

    def subscribe(self, listener: ChangeListener) -> None:
        """Registers a listener woken with a run id when a pod of that run changes phase."""
        ...

    def nodes(self) -> list[Node]:
        """The nodes pods run on, with `reserved_by` set to the run holding each reservation."""
        ...

    def start_pods(self, pods: list[PodSpec]) -> None:
        """Queues pods for admission; a pod whose id is known already is left as it is."""
        ...

    def start_run(self, run: RunSpec) -> None:
        """Hands over a whole run (adapters with `TaskOrdering.ADAPTER`); a run known already is left as it is."""
        ...

    def pods(self, run_id: str) -> list[PodStatus]:
        """The pods of a run, in the order they were started, from the adapter's cache."""
        ...

    def stop_pods(self, run_id: str, task_id: str | None = None) -> None:
        """Asks the pods of a run (or of one of its tasks) to stop: SIGTERM, SIGKILL after their grace; no retry."""
        ...

    def reserve(self, node: str, run_id: str) -> None:
        """Reserves a node for a run: other runs' pods are not placed there and are evicted from it.

        Raises:
            NotFound: no such node.
            FailedPrecondition: another run holds it.
        """
        ...

    def release(self, run_id: str) -> None:
        """Releases the reservations of a run."""
        ...

    def restore(self, recovery: RunRecovery) -> None:
        """Re-applies what an active run's record says (memory kills, SIGKILLs, attempts, reservation) after a
        restart; the pods' history is kept even where the reservation cannot be taken again (`NotFound`: its node
        is gone)."""
        ...

    def logs(
        self, run_id: str, task_id: str, worker: str, follow: bool, alive: Callable[[], bool] = lambda: True
    ) -> Iterator[tuple[str, str]]:
        """Yields (pod log name, complete new lines) of a task's pods (one worker, or all for ""); with `follow`,
        until the task's pods are final or `alive` says the reader left (asked while it waits for lines, so an
        abandoned follower ends within a poll, not when the pods do). Logs of ended pods are archived in
        `tasks/<task>/logs/` of the store."""
        ...

    def forget(self, run_id: str) -> None:
        """The run has ended and the tracker asks no more of its pods: the adapter drops what it keeps of them
        once they have stopped, so a long-lived tracker's memory follows its active runs, not its history. The
        logs of the run's ended pods stay readable (`logs`) from their archive in the store."""
        ...

    def close(self) -> None:
        """Releases the executor's own resources (threads, connections); what it does to running pods is its own."""
        ...
