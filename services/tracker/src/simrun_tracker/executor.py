"""The executor port: how the run tracker starts, observes and stops pods, whichever adapter runs them."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Protocol

from simrun_planner import Node


class PodPhase(StrEnum):
    """The lifecycle of a pod as the tracker sees it."""

    PENDING = "pending"
    """Waiting for admission (new, preempted or retried)."""
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    """Final: a failing exit code, a second kill for memory, or stopped with its run."""


@dataclass(frozen=True)
class PodSpec:
    """One pod of a task: what to run, with which resources and at which priority.

    The executor retries it as Argo's retry strategy would: exit 143 (stopped on SIGTERM, e.g. preempted) is
    queued again with the same memory; a kill for memory or by SIGKILL (137) is retried once with
    `retry_memory_gb`; any other non-zero exit fails it.
    """

    run_id: str
    task_id: str
    worker: str
    """`w0` for the coordinator or an unsplit task's pod, `w1`… for extra workers."""
    command: list[str]
    env: dict[str, str]
    """The runtime contract (SIMRUN_RUN_DIR, SIMRUN_TASK, …); the executor adds SIMRUN_CGROUP."""
    cwd: Path
    log_path: Path
    cores: int
    memory_gb: float
    """The memory request and hard limit, GiB."""
    processes: int
    retry_memory_gb: float
    """The memory of the retry after a kill for memory, GiB."""
    priority_class: str
    """e.g. `simrun-agent-extra`; its value decides admission order and preemption."""
    grace_s: float = 30.0
    """Seconds between SIGTERM and SIGKILL when the pod is stopped or preempted."""
    retry_processes: int | None = None
    """The worker processes of the retry, fewer where 1.5 times the memory per process needs it; None: the same."""

    @property
    def pod_id(self) -> str:
        return f"{self.run_id}.{self.task_id}.{self.worker}"

    @property
    def per_worker_gb(self) -> float:
        return self.memory_gb / max(self.processes, 1)

    def processes_after(self, memory_kills: int) -> int:
        """The worker processes of an attempt after `memory_kills` kills for memory."""
        return self.retry_processes or self.processes if memory_kills else self.processes

    @property
    def retry_per_worker_gb(self) -> float:
        return self.retry_memory_gb / max(self.processes_after(1), 1)


@dataclass
class MemoryKill:
    """A pod killed for memory (evidence from its cgroup or the watchdog) or by SIGKILL."""

    memory_gb: float
    per_worker_gb: float
    evidence: str
    """`cgroup` (the kernel's OOM killer in the pod's cgroup), `watchdog` or `sigkill` (exit 137, no evidence)."""


@dataclass
class PodStatus:
    """What the executor knows of a pod now."""

    spec: PodSpec
    phase: PodPhase
    node: str | None = None
    attempts: int = 0
    """How many times it was started."""
    exit_code: int | None = None
    """The last exit code; negative for a signal."""
    memory_gb: float = 0.0
    """Its current memory limit (the retry memory once killed for memory)."""
    memory_kills: list[MemoryKill] = field(default_factory=list)
    preemptions: int = 0
    message: str = ""


class Executor(Protocol):
    """Starts the pods of tasks with their plans, observes them, stops a run's pods, reserves nodes."""

    def nodes(self) -> list[Node]:
        """The nodes pods run on, with `reserved_by` set to the run holding each reservation."""
        ...

    def start_pods(self, pods: list[PodSpec]) -> None:
        """Queues pods for admission; a pod whose id is known already is left as it is."""
        ...

    def pods(self, run_id: str) -> list[PodStatus]:
        """The pods of a run, in the order they were started."""
        ...

    def stop_pods(self, run_id: str, task_id: str | None = None) -> None:
        """Stops the pods of a run (or of one of its tasks) with SIGTERM, SIGKILL after their grace; no retry."""
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

    def close(self) -> None:
        """Stops every pod (SIGTERM, then SIGKILL after its grace) and the executor's own threads."""
        ...
