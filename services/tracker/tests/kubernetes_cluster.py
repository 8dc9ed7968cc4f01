"""Argo and Kueue played against the fake API server, so the executor contract suite can run the kubernetes adapter.

A controller thread does, every few milliseconds, what the two controllers would: for each Workflow, Argo makes a
pod per DAG node (`-w0`, each `-extra` item, `-merge`) once the nodes it depends on succeeded, and a new attempt
after an exit its retry strategy retries (137 with the retry patch's memory, 143, a deleted pod), ends running pods
with 143 once the Workflow is shut down, and marks the Workflow Succeeded once every node ended; Kueue admits gated
pods by the local adapter's admission function (`simrun_tracker.local.admission.decide`, Kueue's rules as a pure
function), preempts lower priorities (marks, 143, deletes) and, as a NoExecute taint does, evicts other runs' pods
from a reserved node. It plays no scheduler beyond that and knows nothing of the adapter.
"""

from __future__ import annotations

import threading
from typing import Any

from kubernetes_fake_api import ArgoScript, FakeApiServer, node
from simrun_core.identity import priority_value
from simrun_planner import Node
from simrun_tracker.kubernetes.names import RESERVED, parse_quantity_cores, parse_quantity_gib
from simrun_tracker.local.admission import Placed, Slot, Waiting, decide

Obj = dict[str, Any]
RETRIED = (137, 143)


class ScriptedCluster:
    """A fake API server whose nodes are `nodes`, with Argo and Kueue played by a thread."""

    def __init__(self, nodes: list[Node], namespace: str = "simrun", period_s: float = 0.02) -> None:
        self.api = FakeApiServer()
        self.api.cluster.bookmark_s = 0.2
        self.namespace = namespace
        self.argo = ArgoScript(self.api.cluster, namespace)
        self.capacity = {n.name: (float(n.cores), float(n.memory_gb)) for n in nodes}
        for n in nodes:
            # The adapter plans with the allocatable less Argo's wait sidecar (0.1 cores, 128 MiB).
            obj = node(n.name, 0, 0)
            obj["status"]["allocatable"] = {
                "cpu": f"{round(n.cores * 1000) + 100}m",
                "memory": f"{round(n.memory_gb * 1024) + 128}Mi",
            }
            self.api.cluster.put("nodes", obj)
        self._period_s = period_s
        self._stop = threading.Event()
        self._seq = 0
        self._order: dict[str, int] = {}
        self._key: dict[str, tuple[str, str, str]] = {}
        """Pod name -> (run, template, worker): Argo's node of the pod."""
        self._tried: dict[tuple[str, str, str], list[int]] = {}
        """The exit codes of each node's ended attempts, as Argo's node status keeps them."""
        self._ended: set[str] = set()
        self._succeeded: set[tuple[str, str]] = set()
        """(run, DAG node) that succeeded, which the nodes depending on them wait for."""
        self._thread = threading.Thread(target=self._run, name="scripted-argo-kueue", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.api.close()

    # What tests do to a pod (its process exits, or the OOM killer kills it).

    def exit(self, run_id: str, task_id: str, worker: str, code: int, reason: str | None = None) -> None:
        with self.api.cluster.cond:
            name = self._running(run_id, task_id, worker)
            self.argo.exit(name, code, reason)

    def _running(self, run_id: str, task_id: str, worker: str) -> str:
        for pod in self.api.cluster.items("pods"):
            labels = pod["metadata"]["labels"]
            if (
                labels.get("simrun.io/run") == run_id
                and pod["metadata"]["annotations"].get("simrun.io/task-id") == task_id
                and labels.get("simrun.io/worker") == worker
                and pod["status"].get("phase") == "Running"
            ):
                return pod["metadata"]["name"]
        raise AssertionError(f"no running pod of {run_id}.{task_id}.{worker}")

    # The controllers.

    def _run(self) -> None:
        while not self._stop.wait(self._period_s):
            with self.api.cluster.cond:
                self._argo()
                self._kueue()

    def _argo(self) -> None:
        pods = self.api.cluster.items("pods")
        for wf in self.api.cluster.items("workflows"):
            run_id = wf["metadata"]["labels"]["simrun.io/run"]
            mine = [p for p in pods if p["metadata"]["labels"].get("simrun.io/run") == run_id]
            if (wf.get("status") or {}).get("phase") in ("Succeeded", "Failed", "Error"):
                continue
            if wf["spec"].get("shutdown"):
                live = False
                for pod in mine:
                    phase = pod["status"].get("phase")
                    if phase == "Running":
                        self.argo.exit(pod["metadata"]["name"], 143)
                        live = True
                    elif phase == "Pending":
                        self.api.cluster.delete("pods", self.namespace, pod["metadata"]["name"])
                if not live:  # as Argo ends a stopped Workflow once its pods have ended
                    self._end_workflow(wf, "Failed", "Stopped with strategy 'Terminate'")
                continue
            templates = {t["name"]: t for t in wf["spec"]["templates"]}
            finished = True
            for task in templates["run"]["dag"]["tasks"]:
                needs = [w.strip() for w in task.get("depends", "").split("&&") if w.strip()]
                if any((run_id, need) not in self._succeeded for need in needs):
                    finished = False
                    continue  # Argo starts a DAG node once the nodes it depends on succeeded
                workers = ["w0" if task["name"].endswith("-w0") else "merge"]
                if "withSequence" in task:
                    start, end = int(task["withSequence"]["start"]), int(task["withSequence"]["end"])
                    workers = [f"w{i}" for i in range(start, end + 1)]
                for worker in workers:
                    self._attempt(
                        run_id,
                        task["template"],
                        worker,
                        mine,
                        int(templates[task["template"]]["retryStrategy"]["limit"]),
                    )
                    tried = self._tried.get((run_id, task["template"], worker), [])
                    ended = bool(tried) and (tried[-1] == 0 or ("continueOn" in task and tried[-1] not in RETRIED))
                    live = any(
                        self._key.get(p["metadata"]["name"]) == (run_id, task["template"], worker)
                        and p["status"].get("phase") in ("Pending", "Running")
                        for p in self.api.cluster.items("pods")
                    )
                    finished = finished and ended and not live
            if finished:
                # Every node ended (extra workers may fail: continueOn): Argo ends the Workflow itself.
                self._end_workflow(wf, "Succeeded", "")

    def _end_workflow(self, wf: Obj, phase: str, message: str) -> None:
        def end(obj: Obj) -> None:
            obj.setdefault("status", {}).update({"phase": phase, "message": message})

        self.api.cluster.modify("workflows", self.namespace, wf["metadata"]["name"], end)

    def _attempt(self, run_id: str, template: str, worker: str, pods: list[Obj], limit: int) -> None:
        """Argo's node of one worker: a first pod, or the next attempt after an exit its retry strategy retries."""
        key = (run_id, template, worker)
        tried = self._tried.setdefault(key, [])
        attempts = [p for p in pods if self._key.get(p["metadata"]["name"]) == key]
        if any(p["status"].get("phase") in ("Pending", "Running") for p in attempts):
            return
        for pod in attempts:
            name = pod["metadata"]["name"]
            if name not in self._ended:
                self._ended.add(name)
                tried.append(pod["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"])
                if tried[-1] == 0:
                    self._succeeded.add((run_id, template))
        if tried and (tried[-1] not in RETRIED or len(tried) > limit):
            return
        memory = bool(tried) and tried[-1] == 137
        name = self.argo.create_pod(run_id, template, worker, len(tried), retried_for_memory=memory)
        self._seq += 1
        self._order[name] = self._seq
        self._key[name] = key

    def _kueue(self) -> None:
        nodes = {n["metadata"]["name"]: n for n in self.api.cluster.items("nodes")}
        reserved = {name: (n["metadata"].get("labels") or {}).get(RESERVED) for name, n in nodes.items()}
        pods = self.api.cluster.items("pods")
        for pod in pods:  # a NoExecute taint evicts other runs' pods
            holder = reserved.get(pod["spec"].get("nodeName") or "")
            if (
                holder
                and pod["status"].get("phase") == "Running"
                and pod["metadata"]["labels"]["simrun.io/run"] != holder
            ):
                self._evict(pod, "DisruptionTarget")
        pods = self.api.cluster.items("pods")
        running = [
            Placed(
                p["metadata"]["name"],
                p["metadata"]["labels"]["simrun.io/run"],
                p["spec"]["nodeName"],
                *self._size(p),
                priority_value(p["spec"]["priorityClassName"]),
                self._order.get(p["metadata"]["name"], 0),
            )
            for p in pods
            if p["status"].get("phase") == "Running"
        ]
        pending = [
            Waiting(
                p["metadata"]["name"],
                p["metadata"]["labels"]["simrun.io/run"],
                *self._size(p),
                priority_value(p["spec"]["priorityClassName"]),
                self._order.get(p["metadata"]["name"], 0),
            )
            for p in pods
            if p["status"].get("phase") == "Pending" and p["spec"].get("schedulingGates")
        ]
        if not pending:
            return
        slots = [Slot(name, *self.capacity[name], reserved.get(name)) for name in self.capacity]
        decisions = decide(slots, running, pending)
        by_name = {p["metadata"]["name"]: p for p in pods}
        for preemption in decisions.preempt:
            for victim in preemption.victims:
                self._evict(by_name[victim], "TerminationTarget")
        for name, node_name in decisions.admit:
            self.argo.admit(name, node_name)

    def _evict(self, pod: Obj, condition: str) -> None:
        """Stops a pod on SIGTERM (143) and deletes it, as Kueue does with its victims; Argo's node remembers it."""
        name = pod["metadata"]["name"]
        self._ended.add(name)
        self._tried.setdefault(self._key[name], []).append(143)
        self.argo.preempt(name, condition)

    @staticmethod
    def _size(pod: Obj) -> tuple[float, float]:
        limits = pod["spec"]["containers"][0]["resources"]["limits"]
        return parse_quantity_cores(limits["cpu"]), parse_quantity_gib(limits["memory"])
