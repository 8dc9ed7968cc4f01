"""The kubernetes executor: submits one Argo Workflow per run, observes its pods and itself through informers.

Every port method answers from memory: informers keep the pods, Workflows and nodes of simrun as dicts; one
background thread carries out what changes the cluster (create a Workflow, stop it, reserve and release nodes,
archive the logs of ended pods) and backs off while the API is unavailable. A refused object fails its run with
the API's message. Closing stops the threads and nothing on the cluster: a restarted tracker lists everything
again, re-applies each run's record (`restore`) and hands the run over again (`start_run`), which adopts the
Workflow that exists.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import logging
import math
import queue
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from simrun_core.errors import FailedPrecondition, InvalidArgument, NotFound, SimrunError, Unavailable
from simrun_planner import Node
from simrun_runtime.files import write_bytes_atomic
from simrun_runtime.layout import StoreLayout
from simrun_runtime.record import RunRecord, RunState
from simrun_runtime.reports import load_reports

from simrun_tracker.executor import (
    SIGKILL_EXIT,
    ChangeListener,
    PodHistory,
    PodPhase,
    PodSpec,
    PodStatus,
    RunRecovery,
    RunSpec,
    TaskOrdering,
    TaskSpec,
)
from simrun_tracker.kubernetes.api import (
    CONFLICT,
    api_client,
    classify,
    is_api_error,
    is_transient,
    status_of,
)
from simrun_tracker.kubernetes.config import KubernetesSettings
from simrun_tracker.kubernetes.informer import Informer
from simrun_tracker.kubernetes.names import (
    NODE_NAME_ANNOTATION,
    RESERVED,
    RUN_LABEL,
    TASK_ANNOTATION,
    TASK_LABEL,
    WORKER_LABEL,
    parse_quantity_cores,
    parse_quantity_gib,
    task_node,
    workflow_name,
)
from simrun_tracker.kubernetes.phase import (
    Attempt,
    AttemptPhase,
    WorkerContext,
    attempt_from_node,
    attempt_from_pod,
    merge_attempts,
    worker_status,
)
from simrun_tracker.kubernetes.render import WORKER_PARAMETER, render_workflow
from simrun_tracker.pods import run_spec

log = logging.getLogger(__name__)

Obj = dict[str, Any]
ARGO = ("argoproj.io", "v1alpha1", "workflows")
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"
FINAL_WORKFLOW = ("Succeeded", "Failed", "Error")


@dataclass
class _Run:
    spec: RunSpec
    workflow: Obj
    tasks: dict[str, TaskSpec]
    """By DAG node prefix (the sanitised task id the pods' labels carry)."""
    submitted: bool = False
    refused: str = ""
    stopped: bool = False
    stopped_tasks: set[str] = field(default_factory=set)
    history: dict[tuple[str, str], PodHistory] = field(default_factory=dict)
    dirty: bool = True
    statuses: list[PodStatus] = field(default_factory=list)
    gone: dict[str, tuple[tuple[str, str], Attempt]] = field(default_factory=dict)
    """Pods deleted from the API (Kueue's preemptions, Argo's pod GC) by name: (task prefix, worker) and their
    last state."""
    workflow_ended: bool = False
    """The Workflow was seen in a final phase (it may since have been collected)."""
    forgotten: bool = False
    """The run has ended for the tracker: dropped once its Workflow has ended and its ended pods' logs are archived."""


class KubernetesExecutor:
    """The executor port on a k3s cluster with Argo Workflows and Kueue (see `simrun_tracker.executor.Executor`).

    Args:
        settings: the `executor:` section of the server config.
        store: the run store as this tracker mounts it (worker reports are read, ended pods' logs written there).
        client: a `kubernetes.client.ApiClient`; None: made from the settings.
        sync_timeout_s: how long the constructor waits for the first list of nodes, pods and Workflows.
        grace_s: the tracker's termination grace, for the pods of runs rebuilt from their records after a restart.
    """

    ordering = TaskOrdering.ADAPTER

    def __init__(
        self,
        settings: KubernetesSettings,
        store: StoreLayout,
        client: Any = None,
        sync_timeout_s: float = 10.0,
        grace_s: float = 30.0,
    ) -> None:
        from kubernetes import client as k8s  # imported only when this executor is chosen

        self.settings = settings
        self.store = store
        self.grace_s = grace_s
        self._client = client if client is not None else api_client(settings)
        self._core = k8s.CoreV1Api(self._client)
        self._custom = k8s.CustomObjectsApi(self._client)
        self._lock = threading.RLock()
        self._runs: dict[str, _Run] = {}
        self._pods: dict[str, dict[str, Obj]] = {}
        self._workflows: dict[str, Obj] = {}
        self._reserving: dict[str, str | None] = {}
        """Reservations asked for and not yet seen on the node: node -> run (None: a release under way)."""
        self._listeners: list[ChangeListener] = []
        self._archived: set[str] = set()
        """Ended pods whose log is archived or queued to be, whatever their run: a pod seen ended (also in the
        first list after a restart, for a run the tracker no longer follows) is archived unless its file exists."""
        self._pending_history: dict[str, dict[tuple[str, str], PodHistory]] = {}
        """What `restore` re-applied for runs not handed over again yet."""
        self._ops: queue.Queue[tuple[str, Callable[[], None], bool] | None] = queue.Queue()
        self._archives: queue.Queue[tuple[str, Callable[[], None], bool] | None] = queue.Queue()
        """Logs to archive, apart from `_ops`, so a backlog of logs never delays a stop or a reservation."""
        self._closed = threading.Event()
        self.events_seen = 0
        ns = settings.namespace
        selector = ",".join(f"{k}={v}" for k, v in settings.node_selector.items())
        common: dict[str, Any] = {
            "watch_timeout_s": settings.watch_timeout_s,
            "request_timeout_s": settings.request_timeout_s,
            "backoff_max_s": settings.backoff_max_s,
        }
        self._informers = [
            Informer("nodes", self._core.list_node, self._changed, label_selector=selector, **common),
            Informer(
                "pods",
                lambda **kw: self._core.list_namespaced_pod(ns, **kw),
                self._changed,
                label_selector=RUN_LABEL,
                **common,
            ),
            Informer(
                "workflows",
                lambda **kw: self._custom.list_namespaced_custom_object(*ARGO[:2], ns, ARGO[2], **kw),
                self._changed,
                label_selector=RUN_LABEL,
                **common,
            ),
        ]
        self._nodes_informer = self._informers[0]
        for informer in self._informers:
            informer.start()
        self._worker = threading.Thread(target=self._carry_out, args=(self._ops,), name="simrun-k8s-actions")
        self._archiver = threading.Thread(target=self._carry_out, args=(self._archives,), name="simrun-k8s-logs")
        for thread in (self._worker, self._archiver):
            thread.daemon = True
            thread.start()
        deadline = time.monotonic() + sync_timeout_s
        for informer in self._informers:
            informer.wait_synced(max(0.0, deadline - time.monotonic()))

    # The port.

    def subscribe(self, listener: ChangeListener) -> None:
        with self._lock:
            self._listeners.append(listener)

    def nodes(self) -> list[Node]:
        if not self._nodes_informer.synced:
            error = self._nodes_informer.last_error or "no answer yet"
            raise Unavailable(f"the cluster's nodes are not listed yet ({error}); try again shortly")
        sidecar = self.settings.sidecar
        nodes = []
        with self._lock:
            for obj in sorted(self._nodes_informer.items(), key=lambda o: o["metadata"]["name"]):
                if (obj.get("spec") or {}).get("unschedulable"):
                    continue
                name = obj["metadata"]["name"]
                allocatable = (obj.get("status") or {}).get("allocatable") or {}
                cores = parse_quantity_cores(allocatable.get("cpu", "0"))
                memory = parse_quantity_gib(allocatable.get("memory", "0"))
                holder = (obj["metadata"].get("labels") or {}).get(RESERVED)
                holder = self._reserving.get(name, holder) if name in self._reserving else holder
                nodes.append(
                    Node(
                        name=name,
                        cores=max(0, math.floor(cores - sidecar.cores + 1e-9)),
                        memory_gb=max(0.0, memory - sidecar.memory_gb),
                        gpus=int(parse_quantity_cores(allocatable.get("nvidia.com/gpu", "0"))),
                        reserved_by=holder,
                        allocatable_cores=cores,
                        allocatable_memory_gb=memory,
                    )
                )
        return nodes

    def start_pods(self, pods: list[PodSpec]) -> None:
        raise FailedPrecondition("the kubernetes executor orders a run's tasks itself: hand it over with start_run")

    def start_run(self, run: RunSpec) -> None:
        workflow = render_workflow(run, self.settings)
        # Each pod mounts its task's folder read-write over the read-only run: made here, by the store's owner,
        # before any pod can start (a missing subPath the kubelet would make as root); the pods lay out its files.
        for task in run.tasks:
            self.store.run(run.run_id).task(task.task_id).root.mkdir(parents=True, exist_ok=True)
        with self._lock:
            if self._closed.is_set():
                raise FailedPrecondition("the kubernetes executor is closed")
            if run.run_id in self._runs:
                return
            state = _Run(run, workflow, {task_node(t.task_id): t for t in run.tasks})
            state.history.update(self._pending_history.pop(run.run_id, {}))
            self._runs[run.run_id] = state
        self._queue(f"create the workflow of run {run.run_id}", lambda: self._create(run.run_id))

    def pods(self, run_id: str) -> list[PodStatus]:
        with self._lock:
            run = self._runs.get(run_id)
            if run is None:
                return []
            if run.dirty:
                run.statuses = self._statuses(run)
                run.dirty = False
                finished = self._finished(run)
            else:
                finished = False
            statuses = [_copy(s) for s in run.statuses]
        if finished:
            # Every task is done (merged, or its pods succeeded): what is left are extra workers waiting for
            # admission, which would hold the Workflow open; the run is over, so its Workflow is stopped.
            self._queue(f"stop the finished workflow of run {run_id}", lambda: self._shutdown(run_id))
        return statuses

    def _finished(self, run: _Run) -> bool:
        """Whether every task is done while pods that would hold the Workflow open remain; marks the run stopped.

        When every pod succeeded, Argo ends the Workflow itself (Succeeded, its pods collected): stopping it then
        would only race Argo and mark a successful run's Workflow failed.
        """
        if run.stopped or not run.submitted or not run.statuses:
            return False
        phases: dict[str, set[PodPhase]] = {}
        for status in run.statuses:
            phases.setdefault(status.spec.task_id, set()).add(status.phase)
        done = all(t in run.stopped_tasks or phases.get(t) == {PodPhase.SUCCEEDED} for t in phases)
        left = any(status.phase is not PodPhase.SUCCEEDED for status in run.statuses)
        workflow = (self._workflows.get(run.spec.run_id) or {}).get("status") or {}
        if done and left and workflow.get("phase") not in FINAL_WORKFLOW:
            run.stopped = True
            return True
        return False

    def stop_pods(self, run_id: str, task_id: str | None = None) -> None:
        with self._lock:
            run = self._runs.get(run_id)
            if run is None:
                return
            run.dirty = True
            if task_id is not None:
                run.stopped_tasks.add(task_id)
                return
            if run.stopped:
                return
            run.stopped = True
        self._queue(f"stop the workflow of run {run_id}", lambda: self._shutdown(run_id))
        self._notify(run_id)

    def reserve(self, node: str, run_id: str) -> None:
        with self._lock:
            holders = {n.name: n.reserved_by for n in self.nodes()}
            if node not in holders:
                known = ", ".join(holders) or "none"
                raise NotFound(f"no node {node!r} among the cluster's simrun nodes ({known})")
            holder = holders[node]
            if holder is not None and holder != run_id:
                raise FailedPrecondition(f"node {node!r} is reserved by run {holder}")
            self._reserving[node] = run_id
        self._queue(f"reserve node {node} for run {run_id}", lambda: self._label_node(node, run_id))

    def release(self, run_id: str) -> None:
        with self._lock:
            # Every node the run holds, a cordoned one too (`nodes()` leaves those out, and its taint would stay).
            labelled = {
                o["metadata"]["name"]: (o["metadata"].get("labels") or {}).get(RESERVED)
                for o in self._nodes_informer.items()
            }
            holders = {**labelled, **self._reserving}
            held = sorted(node for node, holder in holders.items() if holder == run_id)
            for node in held:
                self._reserving[node] = None
        for node in held:
            self._queue(f"release node {node} of run {run_id}", functools.partial(self._label_node, node, None))

    def forget(self, run_id: str) -> None:
        with self._lock:
            self._pending_history.pop(run_id, None)
            run = self._runs.get(run_id)
            if run is not None:
                run.forgotten = True
                self._drop_if_done(run_id, run)

    def _drop_if_done(self, run_id: str, run: _Run) -> None:
        """Drops a forgotten run once nothing it needs is still to come: its Workflow has ended (or was never made)
        and every pod of it has ended, its log archived or queued (a pod still stopping is archived once it ends)."""
        phase = ((self._workflows.get(run_id) or {}).get("status") or {}).get("phase")
        # The Workflow may have ended before this tracker knew the run (adopted after a restart): no event follows.
        if not (run.workflow_ended or not run.submitted or phase in FINAL_WORKFLOW):
            return
        for name, obj in self._pods.get(run_id, {}).items():
            if (obj.get("status") or {}).get("phase") not in ("Succeeded", "Failed") or name not in self._archived:
                return
        del self._runs[run_id]

    def restore(self, recovery: RunRecovery) -> None:
        """Re-applies a run's record after a restart and adopts its Workflow, rebuilt from the record and the API.

        The run's pods come from its record (`run.json`), their image and grace from the Workflow the API holds,
        so the driver follows the run without handing it over again; nothing on the cluster is changed.
        """
        history = {(p.task_id, p.worker): p for p in recovery.pods}
        with self._lock:
            run = self._runs.get(recovery.run_id)
            if run is None:
                run = self._adopt_from_record(recovery.run_id)
            if run is not None:
                run.history.update(history)
                run.dirty = True
            else:
                self._pending_history[recovery.run_id] = history
            if recovery.reservation:
                node = self._nodes_informer.get(f"/{recovery.reservation}")
                label = ((node or {}).get("metadata", {}).get("labels") or {}).get(RESERVED)
                if label != recovery.run_id:
                    self._reserving[recovery.reservation] = recovery.run_id
                    self._queue(
                        f"reserve node {recovery.reservation} again for run {recovery.run_id}",
                        lambda: self._label_node(recovery.reservation or "", recovery.run_id),
                    )

    def logs(
        self, run_id: str, task_id: str, worker: str, follow: bool, alive: Callable[[], bool] = lambda: True
    ) -> Iterator[tuple[str, str]]:
        """The logs of a task's pods, attempt by attempt (`<worker>.<attempt>.log`): those of ended pods from their
        archive in the store (pods are collected once their Workflow succeeds), live ones from the API."""
        if worker and not re.fullmatch(r"w[0-9]+|merge", worker):
            raise InvalidArgument(f"no worker {worker!r}: w0 (the coordinator), w1, …, or merge")
        logs_dir = self.store.run(run_id).task(task_id).logs
        done: set[str] = set()
        while True:
            live = {self._log_name(obj, number): obj for number, obj, _ in self._task_pods(run_id, task_id, worker)}
            for log_name, obj in live.items():
                if log_name in done:
                    continue
                phase = attempt_from_pod(obj).phase
                if phase is AttemptPhase.WAITING:
                    continue
                ended = phase in (AttemptPhase.SUCCEEDED, AttemptPhase.ENDED)
                archive = logs_dir / log_name
                done.add(log_name)
                if ended and archive.is_file():
                    if text := archive.read_text(errors="replace"):
                        yield log_name, text
                    continue
                yield from self._live_log(obj, log_name, follow and not ended, alive)
            archived = sorted(logs_dir.glob(f"{worker or '*'}.*.log")) if logs_dir.is_dir() else []
            for path in archived:
                if path.name not in done and path.name not in live:
                    done.add(path.name)
                    if text := path.read_text(errors="replace"):
                        yield path.name, text
            statuses = [s for s in self.pods(run_id) if s.spec.task_id == task_id]
            # No pods known of the task (a run this adapter does not follow, or no longer): nothing more will come.
            if not follow or not statuses or all(s.phase.final for s in statuses) or self._closed.is_set():
                return
            if not alive():
                return
            time.sleep(0.25)

    @staticmethod
    def _log_name(obj: Obj, number: int) -> str:
        """`<worker>.<attempt>.log`, the attempt from Argo's node name (`…-w0(2)` is the third), else its order."""
        meta = obj["metadata"]
        node_name = (meta.get("annotations") or {}).get(NODE_NAME_ANNOTATION, "")
        match = re.search(r"\(([0-9]+)\)$", node_name)
        attempt = int(match.group(1)) + 1 if match else number
        return f"{(meta.get('labels') or {}).get(WORKER_LABEL, '')}.{attempt}.log"

    def close(self) -> None:
        """Stops the informers and the action thread after what is queued (a few seconds at most); nothing else."""
        if self._closed.is_set():
            return
        self._closed.set()
        self._ops.put(None)
        self._archives.put(None)
        self._worker.join(timeout=10)
        self._archiver.join(timeout=10)
        for informer in self._informers:
            informer.stop()

    def _adopt_from_record(self, run_id: str) -> _Run | None:
        """The run of an active record after a restart, its Workflow adopted from the API.

        None where the API shows no Workflow of the run (the tracker stopped before creating it, or the first list
        has not arrived): the run's image is its environment's, which only the driver knows, so the driver hands
        the run over again (`start_run`), which creates the Workflow or adopts the one that exists (409).
        """
        layout = self.store.run(run_id)
        if not layout.record.is_file():
            return None
        record = RunRecord.load(layout)
        if record.state not in (RunState.QUEUED, RunState.RUNNING) or not record.environment:
            return None
        if any(task.plan is None for task in record.tasks.values()):
            return None
        workflow = self._workflows.get(run_id)
        if workflow is None:
            return None
        main = next((t["container"] for t in workflow.get("spec", {}).get("templates", []) if "container" in t), None)
        if main is None:
            return None
        variables = {e["name"]: e.get("value", "") for e in main.get("env") or []}
        try:
            grace_s = float(variables.get("SIMRUN_GRACE_S", self.grace_s))
        except ValueError:
            grace_s = self.grace_s
        spec = run_spec(record, record.environment, grace_s, main.get("image", ""))
        run = _Run(spec, workflow, {task_node(t.task_id): t for t in spec.tasks}, submitted=True)
        self._runs[run_id] = run
        return run

    # Observation.

    def _changed(self, kind: str, event: str, obj: Obj) -> None:
        self.events_seen += 1
        if kind == "nodes":
            with self._lock:
                name = obj["metadata"]["name"]
                label = (obj["metadata"].get("labels") or {}).get(RESERVED)
                if name in self._reserving and self._reserving[name] == label:
                    del self._reserving[name]
            return
        run_id = (obj.get("metadata", {}).get("labels") or {}).get(RUN_LABEL)
        if not run_id:
            return
        archive = None
        with self._lock:
            name = obj["metadata"]["name"]
            if kind == "pods":
                pods = self._pods.setdefault(run_id, {})
                if event == "DELETED":
                    pods.pop(name, None)
                    self._archived.discard(name)
                    run = self._runs.get(run_id)
                    if run is not None:
                        labels = obj["metadata"].get("labels") or {}
                        worker = (labels.get(TASK_LABEL, ""), labels.get(WORKER_LABEL, ""))
                        run.gone[name] = (worker, attempt_from_pod(obj, deleted=True))
                else:
                    pods[name] = obj
                    phase = (obj.get("status") or {}).get("phase")
                    if phase in ("Succeeded", "Failed") and name not in self._archived:
                        self._archived.add(name)
                        archive = obj
            else:
                if event == "DELETED":
                    self._workflows.pop(run_id, None)
                else:
                    self._workflows[run_id] = obj
                run = self._runs.get(run_id)
                if run is not None and (event == "DELETED" or (obj.get("status") or {}).get("phase") in FINAL_WORKFLOW):
                    run.workflow_ended = True
            run = self._runs.get(run_id)
            if run is not None:
                run.dirty = True
                if run.forgotten:
                    self._drop_if_done(run_id, run)
            elif kind == "pods" and not self._pods.get(run_id):
                self._pods.pop(run_id, None)  # the informer's last pod of a dropped run is gone
        if archive is not None:
            self._queue(
                f"archive the log of pod {archive['metadata']['name']}", lambda: self._archive(archive), essential=False
            )
        self._notify(run_id)

    def _notify(self, run_id: str) -> None:
        with self._lock:
            listeners = list(self._listeners)
        for listener in listeners:
            try:
                listener(run_id)
            except Exception:
                log.exception("a listener of the kubernetes executor failed")

    def _statuses(self, run: _Run) -> list[PodStatus]:
        """Every pod of a run from the cache: its attempts from pods and the Workflow's nodes, folded."""
        run_id = run.spec.run_id
        by_worker: dict[tuple[str, str], list[Attempt]] = {}
        for obj in self._pods.get(run_id, {}).values():
            labels = obj["metadata"].get("labels") or {}
            by_worker.setdefault((labels.get(TASK_LABEL, ""), labels.get(WORKER_LABEL, "")), []).append(
                attempt_from_pod(obj)
            )
        for name, (worker, attempt) in run.gone.items():
            if name not in self._pods.get(run_id, {}):
                by_worker.setdefault(worker, []).append(attempt)
        workflow = self._workflows.get(run_id) or {}
        wf_status = workflow.get("status") or {}
        from_nodes: dict[tuple[str, str], list[Attempt]] = {}
        exhausted: set[tuple[str, str]] = set()
        for node in (wf_status.get("nodes") or {}).values():
            node_worker = _worker_of_node(node)
            if node_worker is None:
                continue
            if node.get("type") == "Retry" and node.get("phase") in ("Failed", "Error"):
                exhausted.add(node_worker)
            remembered = attempt_from_node(node)
            if remembered is not None:
                from_nodes.setdefault(node_worker, []).append(remembered)
        message = run.refused
        if not message and wf_status.get("phase") in ("Failed", "Error") and not run.stopped:
            message = f"the workflow {wf_status.get('phase', '').lower()}: {wf_status.get('message') or 'no message'}"
        statuses = []
        for prefix, task in run.tasks.items():
            specs = [*task.pods, *([task.merge_pod] if task.merge_pod is not None else [])]
            for spec in specs:
                key = (prefix, spec.worker)
                attempts = merge_attempts(by_worker.get(key, []), from_nodes.get(key, []))
                attempts = self._with_cgroup_kills(spec, attempts)
                context = WorkerContext(
                    stopped=run.stopped or task.task_id in run.stopped_tasks,
                    workflow_message=message,
                    retries_exhausted=key in exhausted,
                    history=run.history.get((task.task_id, spec.worker)),
                )
                statuses.append(worker_status(spec, attempts, context))
        return statuses

    def _with_cgroup_kills(self, spec: PodSpec, attempts: list[Attempt]) -> list[Attempt]:
        """Adds the kills of a worker report's cgroup to attempts that exited 137 without the reason OOMKilled."""
        suspects = [
            i
            for i, a in enumerate(attempts)
            if a.phase is AttemptPhase.ENDED and a.exit_code == SIGKILL_EXIT and not a.oom_killed
        ]
        if not suspects:
            return attempts
        try:
            reports = [
                r
                for r in load_reports(self.store.run(spec.run_id).task(spec.task_id))
                if r.worker == spec.worker and r.oom_kills
            ]
        except (OSError, ValueError):
            log.warning("reading the worker reports of %s failed", spec.pod_id, exc_info=True)
            return attempts
        if not reports:
            return attempts
        starts = [_epoch_ms(a.order) for a in attempts]
        result = list(attempts)
        for i in suspects:
            begin = starts[i]
            end = starts[i + 1] if i + 1 < len(starts) else None
            kills = sum(
                r.oom_kills or 0
                for r in reports
                if begin is None or (r.started_ms >= begin - 1000 and (end is None or r.started_ms < end))
            )
            if kills:
                result[i] = dataclasses.replace(attempts[i], cgroup_kills=kills)
        return result

    def _task_pods(self, run_id: str, task_id: str, worker: str) -> list[tuple[int, Obj, str]]:
        """(attempt number from 1, pod, pod name) of a task's live pods, per worker in the order they were made."""
        with self._lock:
            objs = [
                o
                for o in self._pods.get(run_id, {}).values()
                if (o["metadata"].get("annotations") or {}).get(TASK_ANNOTATION) == task_id
                and (not worker or (o["metadata"].get("labels") or {}).get(WORKER_LABEL) == worker)
            ]
        objs.sort(key=lambda o: (o["metadata"].get("creationTimestamp") or "", o["metadata"]["name"]))
        numbers: dict[str, int] = {}
        result = []
        for obj in objs:
            w = obj["metadata"]["labels"].get(WORKER_LABEL, "")
            numbers[w] = numbers.get(w, 0) + 1
            result.append((numbers[w], obj, obj["metadata"]["name"]))
        return result

    def _live_log(self, obj: Obj, log_name: str, follow: bool, alive: Callable[[], bool]) -> Iterator[tuple[str, str]]:
        name = obj["metadata"]["name"]
        try:
            response: Any = self._core.read_namespaced_pod_log(
                name,
                self.settings.namespace,
                container="main",
                follow=follow,
                _preload_content=False,
                _request_timeout=None if follow else self.settings.request_timeout_s,
            )
        except Exception as exc:
            if status_of(exc) in (400, 404):
                return  # gone, or not started: its archive (or the runtime's own log file) has its lines
            raise classify(exc, f"the log of pod {name}") from exc
        try:
            buffer = b""
            for chunk in response.stream(4096):
                buffer += chunk
                cut = buffer.rfind(b"\n") + 1
                if cut:
                    yield log_name, buffer[:cut].decode(errors="replace")
                    buffer = buffer[cut:]
                if self._closed.is_set() or not alive():
                    return
            if buffer:
                yield log_name, buffer.decode(errors="replace") + "\n"
        finally:
            response.release_conn()

    # Actions (the one thread that changes the cluster).

    def _queue(self, what: str, action: Callable[[], None], *, essential: bool = True) -> None:
        """Queues a change of the cluster; one that is not essential (archiving a log) is dropped once closing,
        since a restarted tracker lists the ended pods again and archives what is missing (`_archived`)."""
        (self._ops if essential else self._archives).put((what, action, essential))

    def _carry_out(self, ops: queue.Queue[tuple[str, Callable[[], None], bool] | None]) -> None:
        while True:
            item = ops.get()
            if item is None:
                return
            what, action, essential = item
            if self._closed.is_set() and not essential:
                continue
            failures = 0
            while True:
                try:
                    action()
                    break
                except SimrunError as exc:
                    log.error("%s failed: %s", what, exc)
                    break
                except Exception as exc:
                    error = classify(exc, what)
                    if not isinstance(error, Unavailable) or self._closed.is_set():
                        # Only the API's own transient answers are tried again: anything else (a refusal, a bug,
                        # a store that refused a log) would fail the same way and hold up every later change.
                        log.error("%s failed: %s", what, error, exc_info=not (is_api_error(exc) or is_transient(exc)))
                        break
                    failures += 1
                    pause = min(self.settings.backoff_max_s, 0.1 * 2 ** min(failures, 8))
                    log.warning("%s failed (%s); again in %.1f s", what, error, pause)
                    time.sleep(pause)

    def _create(self, run_id: str) -> None:
        with self._lock:
            run = self._runs.get(run_id)
            if run is None or run.submitted or run.stopped:
                return
            body = run.workflow
        ns = self.settings.namespace
        try:
            self._custom.create_namespaced_custom_object(*ARGO[:2], ns, ARGO[2], body)
        except Exception as exc:
            if status_of(exc) == CONFLICT:
                self._adopt(run_id)
                return
            error = classify(exc, f"submitting the workflow of run {run_id}")
            if isinstance(error, Unavailable):
                raise
            self._refuse(run_id, str(error))
            return
        with self._lock:
            run.submitted = True

    def _adopt(self, run_id: str) -> None:
        """A Workflow of that name exists: a restarted tracker's run (adopted) or another's (refused)."""
        name = workflow_name(run_id)
        existing: Any = self._custom.get_namespaced_custom_object(*ARGO[:2], self.settings.namespace, ARGO[2], name)
        labels = (existing.get("metadata") or {}).get("labels") or {}
        if labels.get(RUN_LABEL) != run_id:
            self._refuse(run_id, f"a workflow {name} that is not run {run_id}'s exists in the cluster")
            return
        with self._lock:
            run = self._runs.get(run_id)
            if run is None:
                return
            run.submitted = True
            self._workflows.setdefault(run_id, existing)
            run.dirty = True
        self._notify(run_id)

    def _refuse(self, run_id: str, message: str) -> None:
        with self._lock:
            run = self._runs.get(run_id)
            if run is None:
                return
            run.refused = message
            run.dirty = True
        log.error("run %s: %s", run_id, message)
        self._notify(run_id)

    def _shutdown(self, run_id: str) -> None:
        name = workflow_name(run_id)
        try:
            self._custom.patch_namespaced_custom_object(
                *ARGO[:2],
                self.settings.namespace,
                ARGO[2],
                name,
                {"spec": {"shutdown": "Terminate"}},
                _content_type=MERGE_PATCH,
            )
        except Exception as exc:
            if status_of(exc) == 404:
                return  # never created (refused, or stopped before submission) or collected already
            raise

    def _label_node(self, node: str, run_id: str | None) -> None:
        """Reserves (`run_id`) or releases (None) a node: its taint and label, read-modify-write by resourceVersion."""
        for _ in range(10):
            answer: Any = self._core.read_node(node, _preload_content=False)
            obj = json.loads(answer.data)
            meta = obj["metadata"]
            taints = [t for t in (obj.get("spec") or {}).get("taints") or [] if t.get("key") != RESERVED]
            if run_id is not None:
                taints.append({"key": RESERVED, "value": run_id, "effect": "NoExecute"})
            patch = {
                "metadata": {"resourceVersion": meta["resourceVersion"], "labels": {RESERVED: run_id}},
                "spec": {"taints": taints},
            }
            try:
                self._core.patch_node(node, patch, _content_type=STRATEGIC_PATCH)
                return
            except Exception as exc:
                if status_of(exc) != CONFLICT:
                    raise
        raise Unavailable(f"node {node} kept changing while it was being {'reserved' if run_id else 'released'}")

    def _archive(self, obj: Obj) -> None:
        """Writes an ended pod's log to `tasks/<task>/logs/<worker>.<attempt>.log`, unless one is there already."""
        meta = obj["metadata"]
        run_id = meta["labels"][RUN_LABEL]
        task_id = (meta.get("annotations") or {}).get(TASK_ANNOTATION)
        if not task_id:
            return
        worker = meta["labels"].get(WORKER_LABEL, "")
        number = next((n for n, _, name in self._task_pods(run_id, task_id, worker) if name == meta["name"]), 1)
        path = self.store.run(run_id).task(task_id).logs / self._log_name(obj, number)
        if path.exists():
            return
        try:
            response: Any = self._core.read_namespaced_pod_log(
                meta["name"], self.settings.namespace, container="main", _preload_content=False
            )
        except Exception as exc:
            if status_of(exc) in (400, 404):
                return
            raise
        _write_new(path, response.data)


def _write_new(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        write_bytes_atomic(path, data)


def _worker_of_node(node: Obj) -> tuple[str, str] | None:
    """(task node prefix, worker) of a Workflow status node of one of simrun's templates."""
    template = node.get("templateName") or ""
    for suffix in ("-w0", "-merge", "-extra"):
        if template.endswith(suffix):
            prefix = template[: -len(suffix)]
            if suffix == "-extra":
                parameters = (node.get("inputs") or {}).get("parameters") or []
                worker = next((p.get("value") for p in parameters if p.get("name") == WORKER_PARAMETER), None)
                return (prefix, worker) if worker else None
            return prefix, suffix[1:]
    return None


def _epoch_ms(stamp: str) -> int | None:
    try:
        return int(datetime.fromisoformat(stamp).timestamp() * 1000)
    except ValueError:
        return None


def _copy(status: PodStatus) -> PodStatus:
    return dataclasses.replace(status, memory_kills=[dataclasses.replace(k) for k in status.memory_kills])
