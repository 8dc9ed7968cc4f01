"""A scripted executor for the driver's unit tests and the port's contract suite: pods in memory, no processes.

Admission is the local adapter's pure function (Kueue's rules); what a pod does is scripted by the test: it exits
with a code, is killed for memory, or by SIGKILL. It can answer slowly (as a cluster API can) and can order tasks
itself, as an Argo workflow does.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Iterator

from simrun_core.errors import FailedPrecondition, NotFound
from simrun_core.identity import priority_value
from simrun_planner import Node
from simrun_tracker.executor import (
    COORDINATOR,
    ChangeListener,
    MemoryKill,
    PodHistory,
    PodPhase,
    PodSpec,
    PodStatus,
    RunRecovery,
    RunSpec,
    TaskOrdering,
)
from simrun_tracker.local.admission import Placed, Slot, Waiting, decide


@dataclasses.dataclass
class _Pod:
    status: PodStatus
    priority: int
    seq: int
    claim: str | None = None


class FakeExecutor:
    """The executor port over pods that only the test moves."""

    def __init__(
        self,
        nodes: list[Node] | None = None,
        *,
        pods_delay_s: float = 0.0,
        ordering: TaskOrdering = TaskOrdering.DRIVER,
    ) -> None:
        self._nodes = nodes or [Node("n1", cores=4, memory_gb=16)]
        self.pods_delay_s = pods_delay_s
        self.ordering = ordering
        self._lock = threading.RLock()
        self._pods: dict[str, _Pod] = {}
        self._by_run: dict[str, list[str]] = {}
        self._reservations: dict[str, str] = {}
        self._history: dict[tuple[str, str, str], PodHistory] = {}
        self._listeners: list[ChangeListener] = []
        self._runs: dict[str, RunSpec] = {}
        self._logs: dict[tuple[str, str, str], list[str]] = {}
        self._seq = 0
        self.calls: dict[str, int] = {}
        self.forgotten: dict[str, PodStatus] = {}
        """The last status of each pod dropped by `forget`, by pod id, for tests to look at after a run ended."""
        self.events_lost = False  # as a broken watch: pods change and nobody is told

    # --- the port --------------------------------------------------------------------------------------------

    def subscribe(self, listener: ChangeListener) -> None:
        self._listeners.append(listener)

    def nodes(self) -> list[Node]:
        with self._lock:
            return [dataclasses.replace(n, reserved_by=self._reservations.get(n.name)) for n in self._nodes]

    def start_pods(self, pods: list[PodSpec]) -> None:
        self._count("start_pods")
        with self._lock:
            for spec in pods:
                if spec.pod_id in self._pods:
                    continue
                history = self._history.pop((spec.run_id, spec.task_id, spec.worker), None)
                kills = list(history.memory_kills) if history else []
                sigkills = history.sigkills if history else 0
                memory = spec.retry_memory_gb if kills or sigkills else spec.memory_gb
                status = PodStatus(
                    spec,
                    PodPhase.PENDING,
                    memory_gb=memory,
                    attempts=history.attempts if history else 0,
                    memory_kills=kills,
                    sigkills=sigkills,
                )
                self._pods[spec.pod_id] = _Pod(status, priority_value(spec.priority_class), self._next())
                self._by_run.setdefault(spec.run_id, []).append(spec.pod_id)
            self._admit()
        self._notify({p.run_id for p in pods})

    def start_run(self, run: RunSpec) -> None:
        self._count("start_run")
        if self.ordering != TaskOrdering.ADAPTER:
            raise FailedPrecondition("this fake starts tasks one by one")
        with self._lock:
            if run.run_id in self._runs:
                return
            self._runs[run.run_id] = run
        self._start_ready_tasks(run.run_id)

    def pods(self, run_id: str) -> list[PodStatus]:
        self._count("pods")
        if self.pods_delay_s:
            time.sleep(self.pods_delay_s)
        with self._lock:
            return [_copy(self._pods[p].status) for p in self._by_run.get(run_id, [])]

    def stop_pods(self, run_id: str, task_id: str | None = None) -> None:
        self._count("stop_pods")
        with self._lock:
            for pod_id in self._by_run.get(run_id, []):
                pod = self._pods[pod_id]
                if (task_id is None or pod.status.spec.task_id == task_id) and not pod.status.phase.final:
                    pod.status.phase = PodPhase.FAILED
                    pod.status.message = "stopped"
            self._admit()
        self._notify({run_id})

    def reserve(self, node: str, run_id: str) -> None:
        with self._lock:
            if node not in {n.name for n in self._nodes}:
                raise NotFound(f"no node {node!r}")
            holder = self._reservations.get(node)
            if holder not in (None, run_id):
                raise FailedPrecondition(f"node {node!r} is reserved by run {holder}")
            self._reservations[node] = run_id

    def release(self, run_id: str) -> None:
        with self._lock:
            for node in [n for n, holder in self._reservations.items() if holder == run_id]:
                del self._reservations[node]
            self._admit()

    def forget(self, run_id: str) -> None:
        """Drops a run's pods if they have all stopped (a pod that has not is kept, as the adapters keep it)."""
        self._count("forget")
        with self._lock:
            pod_ids = self._by_run.get(run_id, [])
            if all(self._pods[p].status.phase.final for p in pod_ids):
                for pod_id in self._by_run.pop(run_id, []):
                    self.forgotten[pod_id] = self._pods.pop(pod_id).status
                self._runs.pop(run_id, None)

    def restore(self, recovery: RunRecovery) -> None:
        with self._lock:
            for pod in recovery.pods:
                self._history[(recovery.run_id, pod.task_id, pod.worker)] = pod
        if recovery.reservation:
            self.reserve(recovery.reservation, recovery.run_id)

    def logs(
        self, run_id: str, task_id: str, worker: str, follow: bool, alive: Callable[[], bool] = lambda: True
    ) -> Iterator[tuple[str, str]]:
        """What the test wrote of the task's pods; with `follow`, new lines until the task's pods are final."""
        sent: dict[str, int] = {}
        while True:
            with self._lock:
                found = [
                    (k[2], list(v))
                    for k, v in self._logs.items()
                    if k[:2] == (run_id, task_id) and worker in ("", k[2])
                ]
                live = follow and any(
                    not self._pods[p].status.phase.final
                    for p in self._by_run.get(run_id, [])
                    if self._pods[p].status.spec.task_id == task_id
                )
            for name, lines in sorted(found):
                if len(lines) > sent.get(name, 0):
                    yield f"{name}.log", "".join(lines[sent.get(name, 0) :])
                    sent[name] = len(lines)
            if not live or not alive():
                return
            time.sleep(0.02)

    def close(self) -> None:
        return None

    # --- what the test scripts -------------------------------------------------------------------------------

    def status(self, run_id: str, task_id: str, worker: str = COORDINATOR) -> PodStatus:
        """A pod's status, also after its run was forgotten."""
        pod_id = f"{run_id}.{task_id}.{worker}"
        with self._lock:
            return _copy(self._pods[pod_id].status if pod_id in self._pods else self.forgotten[pod_id])

    def exit(self, run_id: str, task_id: str, worker: str = COORDINATOR, code: int = 0) -> None:
        """The pod's process exits with `code`: 0 succeeds, 143 is requeued, anything else fails it."""
        with self._lock:
            pod = self._running(run_id, task_id, worker)
            pod.status.exit_code = code
            if code == 0:
                pod.status.phase = PodPhase.SUCCEEDED
            elif code == 143:
                pod.status.phase = PodPhase.PENDING
                pod.status.preemptions += 1
                pod.seq = self._next()
            elif code == 137:
                self._killed(pod, evidence=None)
            else:
                pod.status.phase = PodPhase.FAILED
                pod.status.message = f"failed with exit code {code}"
            self._admit()
        self._after_change(run_id)

    def kill_for_memory(self, run_id: str, task_id: str, worker: str = COORDINATOR) -> None:
        """The OOM killer ends the pod (the evidence a cgroup or the reason OOMKilled gives)."""
        with self._lock:
            pod = self._running(run_id, task_id, worker)
            pod.status.exit_code = 137
            self._killed(pod, evidence="oomkilled")
            self._admit()
        self._after_change(run_id)

    def write_log(self, run_id: str, task_id: str, worker: str, text: str) -> None:
        with self._lock:
            self._logs.setdefault((run_id, task_id, worker), []).append(text)

    # --- inside ----------------------------------------------------------------------------------------------

    def _killed(self, pod: _Pod, evidence: str | None) -> None:
        status, spec = pod.status, pod.status.spec
        retried = bool(status.memory_kills) or status.sigkills > 0
        processes = spec.processes_after(retried)
        if evidence is not None:
            per_process = spec.per_process_gb(status.memory_gb, processes)
            status.memory_kills.append(MemoryKill(status.memory_gb, per_process, evidence))
        else:
            status.sigkills += 1
        if not retried:
            status.phase = PodPhase.PENDING
            status.memory_gb = spec.retry_memory_gb
            pod.seq = self._next()
        elif evidence is not None:
            status.phase = PodPhase.FAILED
            status.message = (
                f"killed for memory twice; the retry had {status.memory_gb:g} GiB "
                f"({spec.per_process_gb(status.memory_gb, processes):g} GiB per process)"
            )
        else:
            status.phase = PodPhase.FAILED
            status.message = "killed (SIGKILL), not for memory, after its retry; not retried again"

    def _running(self, run_id: str, task_id: str, worker: str) -> _Pod:
        pod = self._pods[f"{run_id}.{task_id}.{worker}"]
        assert pod.status.phase is PodPhase.RUNNING, f"{pod.status.spec.pod_id} is {pod.status.phase}"
        return pod

    def _admit(self) -> None:
        slots = [
            Slot(n.name, n.allocatable_cores, n.allocatable_memory_gb, self._reservations.get(n.name))
            for n in self._nodes
        ]
        running = [
            Placed(
                p.status.spec.pod_id,
                p.status.spec.run_id,
                p.status.node or "",
                p.status.spec.cores,
                p.status.memory_gb,
                p.priority,
                p.seq,
            )
            for p in self._pods.values()
            if p.status.phase is PodPhase.RUNNING
        ]
        pending = [
            Waiting(
                p.status.spec.pod_id,
                p.status.spec.run_id,
                p.status.spec.cores,
                p.status.memory_gb,
                p.priority,
                p.seq,
                p.claim,
            )
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
                pod = self._pods[victim]
                pod.status.phase = PodPhase.PENDING
                pod.status.node = None
                pod.status.preemptions += 1
                pod.status.exit_code = 143
                pod.seq = self._next()
        for pod_id in decisions.unschedulable:
            self._pods[pod_id].status.phase = PodPhase.FAILED
            self._pods[pod_id].status.message = "no node has that much"
        if decisions.preempt:
            self._admit()
            return
        for pod_id, node in decisions.admit:
            pod = self._pods[pod_id]
            pod.status.phase = PodPhase.RUNNING
            pod.status.node = node
            pod.status.attempts += 1
            pod.claim = None
            pod.seq = self._next()

    def _after_change(self, run_id: str) -> None:
        if self.ordering == TaskOrdering.ADAPTER:
            self._start_ready_tasks(run_id)
        self._notify(set(self._by_run))

    def _start_ready_tasks(self, run_id: str) -> None:
        """As Argo's DAG does: a task's pods start once each task it depends on has a succeeded coordinator."""
        run = self._runs.get(run_id)
        if run is None:
            return
        with self._lock:
            succeeded = {
                p.status.spec.task_id
                for p in self._pods.values()
                if p.status.spec.run_id == run_id
                and p.status.spec.worker == COORDINATOR
                and p.status.phase is PodPhase.SUCCEEDED
            }
            ready = [t for t in run.tasks if set(t.depends_on) <= succeeded]
        for task in ready:
            self.start_pods(task.pods)

    def _notify(self, run_ids: set[str]) -> None:
        if self.events_lost:
            return
        for run_id in run_ids:
            for listener in self._listeners:
                listener(run_id)

    def _count(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1

    def _next(self) -> int:
        self._seq += 1
        return self._seq


def _copy(status: PodStatus) -> PodStatus:
    return dataclasses.replace(status, memory_kills=[dataclasses.replace(k) for k in status.memory_kills])
