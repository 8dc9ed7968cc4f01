"""The states of Argo's pods mapped to the port's pod status, as pure functions (table-tested like admission.py).

A worker (`w0`, `w1`…, `merge`) of a task is one or more *attempts*: the pods Argo created for its DAG node, each
seen through the pod informer or, once a pod is gone (Kueue deletes preempted pods, Argo collects them), through
the Workflow's status nodes, which survive both. `attempt_from_pod` and `attempt_from_node` read one attempt;
`worker_status` folds a worker's attempts into a `PodStatus`, counting kills for memory, exits by SIGKILL without
evidence and preemptions, and deciding what Argo does next (retry: pending again) or what the tracker decides
(a second kill for memory fails the task, naming the retry memory).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from simrun_tracker.executor import SIGKILL_EXIT, SIGTERM_EXIT, MemoryKill, PodHistory, PodPhase, PodSpec, PodStatus
from simrun_tracker.kubernetes.builders import CONTAINER
from simrun_tracker.kubernetes.names import NODE_NAME_ANNOTATION, parse_quantity_gib

KUEUE_GATE = "kueue.x-k8s.io/admission"
PREEMPTION_CONDITIONS = ("TerminationTarget", "DisruptionTarget")
"""Kueue marks the pods it preempts with `TerminationTarget`; Kubernetes marks evictions (a NoExecute taint,
the scheduler's preemption) with `DisruptionTarget`."""
STOPPED = "stopped"


class AttemptPhase(StrEnum):
    """An attempt's lifecycle: waiting (gated by Kueue or unscheduled), running, or ended."""

    WAITING = "waiting"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    ENDED = "ended"
    """Ended without success: an exit code, a preemption or a deletion; Argo's retry strategy decides what next."""


@dataclass(frozen=True)
class Attempt:
    """One pod of a worker, from the pod itself or from the Workflow node that remembers it."""

    key: str
    """The Workflow node's name, which the pod carries in Argo's node-name annotation: one key from both sources."""
    phase: AttemptPhase
    order: str = ""
    """Its creation time (RFC 3339), to order a worker's attempts."""
    node: str | None = None
    exit_code: int | None = None
    oom_killed: bool = False
    """The container's reason OOMKilled."""
    cgroup_kills: int = 0
    """Kills counted in the pod's cgroup by its worker report (a killed pool process does not mark OOMKilled)."""
    preempted: bool = False
    memory_gb: float | None = None
    """The memory limit the attempt ran with, where known."""
    message: str = ""
    started: bool = False
    """It ran (a container started), so it counts as an attempt of the port."""


def attempt_from_pod(pod: Mapping[str, Any], deleted: bool = False) -> Attempt:
    """An attempt from a pod object as the API returns it (a dict in the API's camelCase)."""
    meta = pod.get("metadata", {})
    spec = pod.get("spec", {})
    status = pod.get("status", {})
    key = (meta.get("annotations") or {}).get(NODE_NAME_ANNOTATION) or meta.get("name", "")
    conditions = {c.get("type"): c for c in status.get("conditions") or []}
    preempted = any(conditions.get(t, {}).get("status") == "True" for t in PREEMPTION_CONDITIONS)
    main: Mapping[str, Any] = next((c for c in status.get("containerStatuses") or [] if c.get("name") == CONTAINER), {})
    state = main.get("state") or {}
    terminated = state.get("terminated") or (main.get("lastState") or {}).get("terminated")
    started = "running" in state or bool(terminated) or bool(main.get("started"))
    memory = _limit_gb(spec)
    common = {
        "key": key,
        "order": meta.get("creationTimestamp") or "",
        "node": spec.get("nodeName"),
        "preempted": preempted,
        "memory_gb": memory,
        "started": started,
    }
    phase = status.get("phase", "Pending")
    if terminated:
        code = terminated.get("exitCode")
        oom = terminated.get("reason") == "OOMKilled"
        if code == 0 and phase == "Succeeded":  # also once deleted: Argo collects succeeded pods
            return Attempt(phase=AttemptPhase.SUCCEEDED, exit_code=0, **common)
        if phase in ("Failed", "Succeeded") or deleted:
            message = terminated.get("reason") or terminated.get("message") or ""
            return Attempt(phase=AttemptPhase.ENDED, exit_code=code, oom_killed=oom, message=message, **common)
    if phase == "Succeeded":
        return Attempt(phase=AttemptPhase.SUCCEEDED, exit_code=0, **common)
    if phase == "Failed" or deleted:
        reason = status.get("reason") or ("deleted" if deleted else "failed")
        return Attempt(phase=AttemptPhase.ENDED, message=status.get("message") or reason, **common)
    if phase == "Running":
        return Attempt(phase=AttemptPhase.RUNNING, **common)
    return Attempt(phase=AttemptPhase.WAITING, message=_waiting_message(spec, status, conditions), **common)


STARTING = frozenset({"ContainerCreating", "PodInitializing"})
"""The waiting reasons of a container on its way to start; any other (ErrImagePull, ImagePullBackOff,
CreateContainerConfigError, …) is what a person must fix, so the message says it."""


def _waiting_message(spec: Mapping[str, Any], status: Mapping[str, Any], conditions: Mapping[str, Any]) -> str:
    if any(g.get("name") == KUEUE_GATE for g in spec.get("schedulingGates") or []):
        return "waiting for admission by Kueue"
    scheduled = conditions.get("PodScheduled", {})
    if scheduled.get("status") == "False":
        return f"admitted, not scheduled: {scheduled.get('message') or scheduled.get('reason') or 'no node yet'}"
    for container in [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]:
        waiting = (container.get("state") or {}).get("waiting") or {}
        reason = waiting.get("reason") or ""
        if reason and reason not in STARTING:
            detail = f": {waiting['message']}" if waiting.get("message") else ""
            return f"not starting: container {container.get('name', '?')} {reason}{detail}"
    return "starting"


def _limit_gb(spec: Mapping[str, Any]) -> float | None:
    for container in spec.get("containers") or []:
        if container.get("name") == CONTAINER:
            limit = ((container.get("resources") or {}).get("limits") or {}).get("memory")
            return parse_quantity_gib(limit) if limit is not None else None
    return None


def attempt_from_node(node: Mapping[str, Any]) -> Attempt | None:
    """An attempt from a Workflow status node of type Pod (None for other nodes): what survives a pod's deletion."""
    if node.get("type") != "Pod":
        return None
    phase = node.get("phase", "Pending")
    message = node.get("message") or ""
    raw = (node.get("outputs") or {}).get("exitCode")
    code = int(raw) if raw not in (None, "") and str(raw).lstrip("-").isdigit() else None
    common = {
        "key": node.get("name", ""),
        "order": node.get("startedAt") or "",
        "node": node.get("hostNodeName"),
        "started": phase != "Pending",
    }
    if phase == "Succeeded":
        return Attempt(phase=AttemptPhase.SUCCEEDED, exit_code=0, **common)
    if phase in ("Failed", "Error"):
        return Attempt(
            phase=AttemptPhase.ENDED,
            exit_code=code,
            oom_killed="OOMKilled" in message,
            preempted=code == SIGTERM_EXIT or "deleted" in message,
            message=message,
            **common,
        )
    if phase == "Running":
        return Attempt(phase=AttemptPhase.RUNNING, **common)
    return Attempt(phase=AttemptPhase.WAITING, message=message or "pending", **common)


def merge_attempts(from_pods: Iterable[Attempt], from_nodes: Iterable[Attempt]) -> list[Attempt]:
    """A worker's attempts, oldest first: a live pod's view wins over its Workflow node, which fills in the gone."""
    merged = {a.key: a for a in from_nodes}
    for attempt in from_pods:
        merged[attempt.key] = attempt
    return sorted(merged.values(), key=lambda a: (a.order, a.key))


@dataclass(frozen=True)
class WorkerContext:
    """What the tracker knows of a worker beyond its attempts."""

    stopped: bool = False
    """The run (or its task) was stopped: no further attempt counts, a pending pod is final."""
    workflow_message: str = ""
    """The Workflow failed or was refused with this message before this worker ran (e.g. a pod the API refused)."""
    retries_exhausted: bool = False
    """Argo's node of this worker is final (its retry limit reached): an ended attempt is not retried."""
    history: PodHistory | None = None
    """What the run's record remembers of it (after a restart): a floor for kills and attempts."""


def gib(value: float) -> str:
    """GiB for a message: `3`, `1.5`, `0.375`."""
    return f"{round(value, 3):g}"


def worker_status(spec: PodSpec, attempts: list[Attempt], context: WorkerContext = WorkerContext()) -> PodStatus:
    """Folds a worker's attempts, oldest first, into the port's pod status.

    Exit 0: succeeded. A kill for memory (OOMKilled, or kills in the worker report's cgroup count) is retried once
    with the retry memory, as Argo's pod spec patch gives an attempt after exit 137; a second fails it, naming the
    retry memory. Exit 137 without evidence is counted in `sigkills` and retried (a second also fails it). A
    preemption, an eviction or exit 143 is queued again. Any other exit fails it; so does anything once stopped.
    """
    status = PodStatus(spec=spec, phase=PodPhase.PENDING, memory_gb=spec.memory_gb)
    kills: list[MemoryKill] = []
    memory = spec.memory_gb
    failure: str | None = None
    for attempt in attempts:
        if attempt.started:
            status.attempts += 1
        if attempt.phase is not AttemptPhase.ENDED:
            continue
        status.exit_code = attempt.exit_code
        ran_with = attempt.memory_gb if attempt.memory_gb is not None else memory
        retried = ran_with > spec.memory_gb + 1e-9
        per_worker = spec.per_process_gb(ran_with, spec.processes_after(retried))
        evidence = "oomkilled" if attempt.oom_killed else "cgroup" if attempt.cgroup_kills else None
        if evidence is not None:
            kills.append(MemoryKill(ran_with, per_worker, evidence))
            memory = spec.retry_memory_gb
            if len(kills) >= 2:
                failure = (
                    f"killed for memory twice; the retry had {gib(ran_with)} GiB ({gib(per_worker)} GiB per process)"
                )
            else:
                status.message = (
                    f"killed for memory ({evidence}) with {gib(ran_with)} GiB; "
                    f"retried with {gib(spec.retry_memory_gb)} GiB"
                )
        elif attempt.exit_code == SIGKILL_EXIT and not attempt.preempted:
            status.sigkills += 1
            memory = spec.retry_memory_gb
            if status.sigkills >= 2:
                failure = "killed by SIGKILL twice without evidence of the OOM killer"
            else:
                status.message = f"killed by SIGKILL; retried with {gib(spec.retry_memory_gb)} GiB"
        elif attempt.preempted or attempt.exit_code in (SIGTERM_EXIT, None):
            status.preemptions += 1
            memory = spec.memory_gb
            status.message = (
                "preempted by a higher priority; queued again"
                if attempt.preempted
                else (f"stopped ({attempt.message or 'exit code 143'}); queued again")
            )
        else:
            detail = f" ({attempt.message})" if attempt.message else ""
            failure = f"failed with exit code {attempt.exit_code}{detail}"
        if failure is not None:
            break
    history = context.history
    if history is not None:
        # The record's kills that the API no longer shows come first (kills go from the planned memory to the
        # retry memory): a recorded kill matches a seen one of the same memory, in order.
        seen = iter(kills)
        upcoming = next(seen, None)
        forgotten = []
        for kill in history.memory_kills:
            if upcoming is not None and abs(upcoming.memory_gb - kill.memory_gb) < 1e-6:
                upcoming = next(seen, None)
            else:
                forgotten.append(kill)
        if forgotten:
            kills = [*forgotten, *kills]
            memory = spec.retry_memory_gb
            if len(kills) >= 2 and failure is None:
                second = kills[-1]
                failure = (
                    f"killed for memory twice; the retry had {gib(second.memory_gb)} GiB "
                    f"({gib(second.per_worker_gb)} GiB per process)"
                )
        status.attempts = max(status.attempts, history.attempts)
    status.memory_kills = kills
    status.memory_gb = memory
    last = attempts[-1] if attempts else None
    # The node of its latest attempt that was placed (its pod's `spec.nodeName`, or the Workflow node's host).
    placed = next((a.node for a in reversed(attempts) if a.node), None)
    if failure is not None:
        return _final(status, PodPhase.FAILED, failure, node=placed)
    if last is not None and last.phase is AttemptPhase.SUCCEEDED:
        status.exit_code = 0
        return _final(status, PodPhase.SUCCEEDED, "", node=last.node)
    if context.stopped and (last is None or last.phase is not AttemptPhase.RUNNING):
        # A running pod of a stopped run ends when Argo terminates it; one of a stopped task runs on until its
        # ledger has nothing pending (Argo cannot stop one DAG node). Neither is counted final before it ends.
        return _final(status, PodPhase.FAILED, STOPPED, node=placed)
    if last is None:
        if context.workflow_message:
            return _final(status, PodPhase.FAILED, context.workflow_message)
        status.message = "waiting for Argo to create its pod"
        return status
    if last.phase is AttemptPhase.RUNNING:
        status.phase, status.node = PodPhase.RUNNING, last.node
        status.message = "preempted; stopping" if last.preempted else ""
        return status
    if last.phase is AttemptPhase.WAITING:
        status.message = last.message if not status.message else f"{status.message}; {last.message}"
        return status
    if context.retries_exhausted or context.workflow_message:
        reason = context.workflow_message or "Argo's retry limit (the preemption budget) is reached"
        return _final(status, PodPhase.FAILED, f"{status.message}; {reason}" if status.message else reason, node=placed)
    return status


def _final(status: PodStatus, phase: PodPhase, message: str, node: str | None = None) -> PodStatus:
    status.phase = phase
    status.message = message
    status.node = node
    return status
