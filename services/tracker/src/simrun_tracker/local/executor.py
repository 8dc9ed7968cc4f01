"""The local executor: pods as process groups on this machine, admitted, preempted and retried by Kueue's rules."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import re
import signal
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from simrun_core.config import ServerConfig
from simrun_core.errors import FailedPrecondition, InvalidArgument, NotFound
from simrun_core.identity import priority_value
from simrun_planner import Node

from simrun_tracker.executor import MemoryKill, PodPhase, PodSpec, PodStatus
from simrun_tracker.local.admission import Placed, Slot, Waiting, decide
from simrun_tracker.local.config import configured_nodes, default_nodes
from simrun_tracker.local.memory import (
    GIB,
    CgroupPool,
    PodCgroup,
    anon_memory_by_group,
    detect_cgroup_root,
    open_cgroups,
)

logger = logging.getLogger(__name__)

WATCHDOG_INTERVAL_S = 0.2
"""Seconds between two samples of the anonymous memory of the pods the watchdog limits."""

STOPPED = "stopped"
"""The message of a pod stopped with its run or task."""

_SIGTERM_EXITS = {143, -signal.SIGTERM}
_SIGKILL_EXITS = {137, -signal.SIGKILL}
# `sh -c` puts the pod into its cgroup before the command is exec'd, so no byte of user code runs outside of it.
_ENTER_CGROUP = 'echo $$ > "$0" && exec "$@"'


def gib(value: float) -> str:
    """GiB for a message: `3`, `1.5`, `0.375`."""
    return f"{round(value, 3):g}"


@dataclass
class _Pod:
    spec: PodSpec
    status: PodStatus
    priority: int
    seq: int
    """Queue order while pending, admission order while running."""
    process: subprocess.Popen[bytes] | None = None
    cgroup: PodCgroup | None = None
    stopping: str | None = None
    """Why it was sent SIGTERM: `preempted`, `evicted` or `stopped`."""
    kill_at: float | None = None
    watchdog_bytes: int | None = None
    """The anonymous memory the watchdog saw when it killed the pod."""
    claim: str | None = None


class LocalExecutor:
    """Runs pods as process groups on this machine's nodes (see `simrun_tracker.executor.Executor`).

    One scheduler thread admits pending pods in priority order (then first in, first out) onto nodes with their
    cores and memory free, preempts running pods of strictly lower priority with SIGTERM when a pod fits nowhere,
    reaps exits and retries them by their exit code, and enforces memory limits: by the pod's memory cgroup where
    one can be made, else by killing its process group once its anonymous memory passes the limit.

    Args:
        nodes: the nodes; None for this machine as one node (`default_nodes`).
        cgroup_root: the memory cgroup mount (v1 `/sys/fs/cgroup/memory` or v2 `/sys/fs/cgroup`), `"auto"` to detect
            it, or None to enforce limits with the watchdog only.
        poll_s: seconds between two passes of the scheduler.
    """

    def __init__(
        self,
        nodes: list[Node] | None = None,
        cgroup_root: Path | Literal["auto"] | None = "auto",
        poll_s: float = 0.1,
    ) -> None:
        self._nodes = list(nodes) if nodes is not None else default_nodes()
        if not self._nodes:
            raise InvalidArgument("the local executor needs at least one node")
        names = [n.name for n in self._nodes]
        if len(set(names)) != len(names):
            raise InvalidArgument(f"node names must be unique: {names}")
        self.executor_id = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        root = detect_cgroup_root() if cgroup_root == "auto" else cgroup_root
        self._cgroups: CgroupPool | None = open_cgroups(root, self.executor_id)
        self._poll_s = poll_s
        self._reservations: dict[str, str] = {}
        self._pods: dict[str, _Pod] = {}
        self._by_run: dict[str, list[str]] = {}
        self._seq = 0
        self._lock = threading.RLock()
        self._wake = threading.Event()
        self._halt = threading.Event()
        self._closed = False
        self._next_watchdog = 0.0
        self._thread = threading.Thread(target=self._loop, name=f"simrun-local-{self.executor_id}", daemon=True)
        self._thread.start()

    @classmethod
    def from_config(cls, config: ServerConfig) -> LocalExecutor:
        """The executor a server config describes: its nodes (or this machine), cgroup root and poll interval."""
        return cls(nodes=configured_nodes(config.nodes), cgroup_root=config.cgroup_root, poll_s=config.poll_s)

    @property
    def cgroup_version(self) -> int | None:
        """1 or 2 where pods get memory cgroups; None where the watchdog limits them."""
        return self._cgroups.version if self._cgroups else None

    def __enter__(self) -> LocalExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # The port.

    def nodes(self) -> list[Node]:
        with self._lock:
            return [dataclasses.replace(n, reserved_by=self._reservations.get(n.name)) for n in self._nodes]

    def start_pods(self, pods: list[PodSpec]) -> None:
        priorities = {}
        for spec in pods:
            priorities[spec.pod_id] = priority_value(spec.priority_class)
            if spec.cores < 0 or spec.memory_gb <= 0 or spec.processes < 1:
                raise InvalidArgument(f"pod {spec.pod_id}: cores >= 0, memory_gb > 0 and processes >= 1 are required")
        with self._lock:
            if self._closed:
                raise FailedPrecondition("the local executor is closed")
            for spec in pods:
                if spec.pod_id in self._pods:
                    continue
                status = PodStatus(spec=spec, phase=PodPhase.PENDING, memory_gb=spec.memory_gb)
                self._pods[spec.pod_id] = _Pod(spec, status, priorities[spec.pod_id], self._next_seq())
                self._by_run.setdefault(spec.run_id, []).append(spec.pod_id)
        self._wake.set()

    def pods(self, run_id: str) -> list[PodStatus]:
        with self._lock:
            return [_copy(self._pods[pod_id].status) for pod_id in self._by_run.get(run_id, [])]

    def stop_pods(self, run_id: str, task_id: str | None = None) -> None:
        with self._lock:
            for pod_id in self._by_run.get(run_id, []):
                pod = self._pods[pod_id]
                if task_id is None or pod.spec.task_id == task_id:
                    self._stop(pod)
        self._wake.set()

    def reserve(self, node: str, run_id: str) -> None:
        with self._lock:
            if node not in {n.name for n in self._nodes}:
                raise NotFound(f"no node {node!r}; the nodes are {', '.join(n.name for n in self._nodes)}")
            holder = self._reservations.get(node)
            if holder is not None and holder != run_id:
                raise FailedPrecondition(f"node {node!r} is reserved by run {holder}")
            self._reservations[node] = run_id
            # As a NoExecute taint: the pods of other runs leave the node and wait for admission elsewhere.
            for pod in self._pods.values():
                if pod.status.phase is PodPhase.RUNNING and pod.status.node == node and pod.spec.run_id != run_id:
                    self._terminate(pod, "evicted")
        self._wake.set()

    def release(self, run_id: str) -> None:
        with self._lock:
            for node in [n for n, holder in self._reservations.items() if holder == run_id]:
                del self._reservations[node]
        self._wake.set()

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for pod in self._pods.values():
                self._stop(pod)
            grace = max((p.spec.grace_s for p in self._pods.values() if p.process is not None), default=0.0)
        self._wake.set()
        deadline = time.monotonic() + grace + 5.0
        while time.monotonic() < deadline:
            with self._lock:
                if not any(p.process is not None for p in self._pods.values()):
                    break
            time.sleep(self._poll_s / 2)
        self._halt.set()
        self._wake.set()
        self._thread.join()
        with self._lock:
            for pod in self._pods.values():
                if pod.process is not None:
                    _signal_group(pod.process.pid, signal.SIGKILL)
                    self._exited(pod, pod.process.wait())
            if self._cgroups is not None:
                self._cgroups.close()

    # The scheduler thread.

    def _loop(self) -> None:
        while not self._halt.is_set():
            try:
                with self._lock:
                    self._tick()
            except Exception:
                logger.exception("the local executor's scheduler pass failed")
            self._wake.wait(self._poll_s)
            self._wake.clear()

    def _tick(self) -> None:
        now = time.monotonic()
        for pod in self._pods.values():
            if pod.process is None:
                continue
            code = pod.process.poll()
            if code is not None:
                self._exited(pod, code)
            elif pod.kill_at is not None and now >= pod.kill_at:
                _signal_group(pod.process.pid, signal.SIGKILL)
                pod.kill_at = None
        if now >= self._next_watchdog:
            self._next_watchdog = now + WATCHDOG_INTERVAL_S
            self._watchdog()
        if not self._closed:
            self._admit()

    def _admit(self) -> None:
        slots = [
            Slot(n.name, n.allocatable_cores, n.allocatable_memory_gb, self._reservations.get(n.name))
            for n in self._nodes
        ]
        running = [
            Placed(
                p.spec.pod_id,
                p.spec.run_id,
                p.status.node or "",
                p.spec.cores,
                p.status.memory_gb,
                p.priority,
                p.seq,
                terminating=p.stopping is not None,
            )
            for p in self._pods.values()
            if p.process is not None
        ]
        pending = [
            Waiting(p.spec.pod_id, p.spec.run_id, p.spec.cores, p.status.memory_gb, p.priority, p.seq, p.claim)
            for p in self._pods.values()
            if p.status.phase is PodPhase.PENDING
        ]
        if not pending:
            return
        decisions = decide(slots, running, pending)
        for pod_id, node in decisions.claims.items():
            self._pods[pod_id].claim = node
        for preemption in decisions.preempt:
            for victim in preemption.victims:
                self._terminate(self._pods[victim], "preempted")
        for pod_id in decisions.unschedulable:
            pod = self._pods[pod_id]
            need = f"needs {gib(pod.spec.cores)} cores and {gib(pod.status.memory_gb)} GiB"
            if pod.status.memory_kills:
                need = f"the retry after a kill for memory {need}"
            self._final(pod, PodPhase.FAILED, f"{need}; no node has that much")
        for pod_id, node in decisions.admit:
            self._launch(self._pods[pod_id], node)

    def _launch(self, pod: _Pod, node: str) -> None:
        spec, status = pod.spec, pod.status
        status.attempts += 1
        status.node = node
        status.phase = PodPhase.RUNNING
        status.message = ""
        pod.claim = None
        pod.seq = self._next_seq()
        limit = int(status.memory_gb * GIB)
        processes = spec.processes_after(len(status.memory_kills))
        env = {**os.environ, **spec.env, "SIMRUN_PROCESSES": str(processes)}
        env.pop("SIMRUN_CGROUP", None)
        command = list(spec.command)
        try:
            if self._cgroups is not None:
                name = f"{re.sub(r'[^A-Za-z0-9._-]', '_', spec.pod_id)}.{status.attempts}"
                pod.cgroup = self._cgroups.create(name, limit)
                env["SIMRUN_CGROUP"] = str(pod.cgroup.path)
                command = ["/bin/sh", "-c", _ENTER_CGROUP, str(pod.cgroup.procs_file), *command]
            spec.log_path.parent.mkdir(parents=True, exist_ok=True)
            with spec.log_path.open("ab") as log:
                limit_by = f"cgroup v{self._cgroups.version}" if self._cgroups else "watchdog"
                log.write(
                    f"=== simrun: attempt {status.attempts} of pod {spec.pod_id} on node {node}, "
                    f"memory limit {gib(status.memory_gb)} GiB ({gib(status.memory_gb / max(processes, 1))} "
                    f"GiB per process, {limit_by}), cores {spec.cores}, {_now()} ===\n".encode()
                )
                log.flush()
                pod.process = subprocess.Popen(
                    command,
                    cwd=spec.cwd,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
        except (OSError, ValueError, subprocess.SubprocessError) as exc:
            # A pod that cannot be started fails rather than staying "running" with no process.
            if pod.cgroup is not None:
                pod.cgroup.remove()
                pod.cgroup = None
            self._final(pod, PodPhase.FAILED, f"cannot start: {exc}")

    def _watchdog(self) -> None:
        watched = {p.process.pid: p for p in self._pods.values() if p.process is not None and p.cgroup is None}
        if not watched:
            return
        for pgid, anon in anon_memory_by_group(watched).items():
            pod = watched[pgid]
            if pod.watchdog_bytes is None and anon > pod.status.memory_gb * GIB:
                pod.watchdog_bytes = anon
                _signal_group(pgid, signal.SIGKILL)

    def _exited(self, pod: _Pod, code: int) -> None:
        """Records an exit and decides what follows, as Argo's retry strategy and Kueue's requeueing would."""
        assert pod.process is not None
        status = pod.status
        status.exit_code = code
        evidence = None
        if pod.watchdog_bytes is not None:
            evidence = "watchdog"
        elif pod.cgroup is not None and pod.cgroup.killed_for_memory(sigkilled=code in _SIGKILL_EXITS):
            evidence = "cgroup"
        seen = ""
        if evidence == "watchdog" and pod.watchdog_bytes:
            seen = f", {gib(pod.watchdog_bytes / GIB)} GiB of anonymous memory sampled"
        elif evidence == "cgroup" and pod.cgroup is not None and (peak := pod.cgroup.peak_bytes()):
            seen = f", peak {gib(peak / GIB)} GiB"
        # Whatever the pod left behind dies with it: its process group, then its cgroup.
        _signal_group(pod.process.pid, signal.SIGKILL)
        if pod.cgroup is not None:
            pod.cgroup.remove()
        pod.process = None
        pod.cgroup = None
        stopping, pod.stopping, pod.kill_at = pod.stopping, None, None
        pod.watchdog_bytes = None

        if code == 0:
            self._final(pod, PodPhase.SUCCEEDED, "", code)
        elif stopping == STOPPED:
            self._final(pod, PodPhase.FAILED, STOPPED, code)
        elif evidence is not None or (code in _SIGKILL_EXITS and stopping is None):
            processes = pod.spec.processes_after(len(status.memory_kills))
            kill = MemoryKill(status.memory_gb, status.memory_gb / max(processes, 1), evidence or "sigkill")
            status.memory_kills.append(kill)
            if len(status.memory_kills) == 1:
                self._requeue(
                    pod,
                    f"killed for memory ({kill.evidence}{seen}) with {gib(kill.memory_gb)} GiB; "
                    f"retried with {gib(pod.spec.retry_memory_gb)} GiB",
                    code,
                )
                status.memory_gb = pod.spec.retry_memory_gb
            else:
                self._final(
                    pod,
                    PodPhase.FAILED,
                    f"killed for memory twice; the retry had {gib(kill.memory_gb)} GiB "
                    f"({gib(kill.per_worker_gb)} GiB per process)",
                    code,
                )
        elif stopping is not None or code in _SIGTERM_EXITS:
            status.preemptions += 1
            why = {"preempted": "preempted by a higher priority", "evicted": "evicted by a reservation"}
            self._requeue(pod, f"{why.get(stopping or '', 'stopped on SIGTERM')}; queued again", code)
        else:
            self._final(pod, PodPhase.FAILED, f"failed with {_describe(code)}", code)

    def _requeue(self, pod: _Pod, message: str, code: int) -> None:
        self._log(pod, f"exited with {_describe(code)}: {message}")
        pod.status.phase = PodPhase.PENDING
        pod.status.node = None
        pod.status.message = message
        pod.seq = self._next_seq()

    def _final(self, pod: _Pod, phase: PodPhase, message: str, code: int | None = None) -> None:
        if code is not None:
            self._log(pod, f"exited with {_describe(code)}: {phase.value}{'; ' + message if message else ''}")
        pod.status.phase = phase
        pod.status.message = message
        pod.claim = None

    def _stop(self, pod: _Pod) -> None:
        if pod.status.phase is PodPhase.PENDING:
            self._final(pod, PodPhase.FAILED, STOPPED)
        elif pod.process is not None:
            self._terminate(pod, STOPPED)

    def _terminate(self, pod: _Pod, why: str) -> None:
        """SIGTERM to the pod's process group, SIGKILL after its grace; a stop overrides a preemption or eviction."""
        assert pod.process is not None
        if pod.stopping == STOPPED or pod.stopping == why:
            return
        first = pod.stopping is None
        pod.stopping = why
        if first:
            pod.kill_at = time.monotonic() + pod.spec.grace_s
            _signal_group(pod.process.pid, signal.SIGTERM)

    def _log(self, pod: _Pod, line: str) -> None:
        with contextlib.suppress(OSError), pod.spec.log_path.open("a") as log:
            log.write(f"=== simrun: attempt {pod.status.attempts} {line} ===\n")

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _describe(code: int) -> str:
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _copy(status: PodStatus) -> PodStatus:
    return dataclasses.replace(status, memory_kills=[dataclasses.replace(k) for k in status.memory_kills])
