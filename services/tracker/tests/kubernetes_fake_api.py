"""A fake Kubernetes API server for tests: threaded HTTP on 127.0.0.1 speaking the real REST paths.

It keeps pods, nodes and Argo Workflows in memory with resource versions, answers list (with label selectors),
chunked watches (with bookmarks, and a 410 for a version older than the last compaction), create (201, 409),
merge and strategic-merge patches (with a resourceVersion precondition: 409), and pod logs (with `follow`).
Tests drive it as Argo and Kueue would: `ArgoScript` makes the pods of a submitted Workflow from its templates
(labels, the retry patch's memory) and moves them through admission, running, exit, preemption and deletion.
Faults are injected with `fail_next`. Nothing here knows the adapter.
"""

from __future__ import annotations

import copy
import json
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

Obj = dict[str, Any]

_ROUTES = [
    (re.compile(r"^/api/v1/namespaces/(?P<ns>[^/]+)/pods/(?P<name>[^/]+)/log$"), "log"),
    (re.compile(r"^/api/v1/namespaces/(?P<ns>[^/]+)/pods(?:/(?P<name>[^/]+))?$"), "pods"),
    (re.compile(r"^/api/v1/nodes(?:/(?P<name>[^/]+))?$"), "nodes"),
    (
        re.compile(r"^/apis/argoproj\.io/v1alpha1/namespaces/(?P<ns>[^/]+)/workflows(?:/(?P<name>[^/]+))?$"),
        "workflows",
    ),
]
_LIST_KIND = {
    "pods": ("v1", "PodList"),
    "nodes": ("v1", "NodeList"),
    "workflows": ("argoproj.io/v1alpha1", "WorkflowList"),
}


@dataclass
class Fault:
    method: str
    path: str
    status: int
    message: str
    times: int


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, str]
    body: Any = None


@dataclass
class FakeCluster:
    """The state of the fake API: objects by (kind, namespace, name), an event log per kind, logs per pod."""

    rv: int = 0
    objects: dict[tuple[str, str, str], Obj] = field(default_factory=dict)
    events: dict[str, list[tuple[int, str, Obj]]] = field(default_factory=dict)
    compacted: dict[str, int] = field(default_factory=dict)
    logs: dict[tuple[str, str], bytes] = field(default_factory=dict)
    faults: list[Fault] = field(default_factory=list)
    requests: list[Request] = field(default_factory=list)
    bookmark_s: float = 0.5
    clock: datetime = field(default_factory=lambda: datetime(2026, 12, 1, 8, 0, 0, tzinfo=UTC))
    cond: threading.Condition = field(default_factory=threading.Condition)

    # Scripting (what Argo, Kueue and the kubelet would do).

    def put(self, kind: str, obj: Obj) -> Obj:
        """Creates or replaces an object, as its controller would; returns the stored copy."""
        with self.cond:
            meta = obj.setdefault("metadata", {})
            key = (kind, meta.get("namespace", ""), meta["name"])
            event = "MODIFIED" if key in self.objects else "ADDED"
            if event == "ADDED":
                self.clock += timedelta(seconds=1)
                meta.setdefault("creationTimestamp", self.clock.strftime("%Y-%m-%dT%H:%M:%SZ"))
                meta.setdefault("uid", f"uid-{self.rv + 1}")
            return self._store(kind, key, obj, event)

    def modify(self, kind: str, namespace: str, name: str, change: Callable[[Obj], None]) -> Obj:
        with self.cond:
            obj = copy.deepcopy(self.objects[(kind, namespace, name)])
            change(obj)
            return self._store(kind, (kind, namespace, name), obj, "MODIFIED")

    def delete(self, kind: str, namespace: str, name: str) -> None:
        with self.cond:
            obj = self.objects.pop((kind, namespace, name))
            self.rv += 1
            obj = copy.deepcopy(obj)
            obj["metadata"]["resourceVersion"] = str(self.rv)
            self.events.setdefault(kind, []).append((self.rv, "DELETED", obj))
            self.cond.notify_all()

    def get(self, kind: str, namespace: str, name: str) -> Obj:
        with self.cond:
            return copy.deepcopy(self.objects[(kind, namespace, name)])

    def items(self, kind: str) -> list[Obj]:
        with self.cond:
            return [copy.deepcopy(o) for (k, _, _), o in self.objects.items() if k == kind]

    def compact(self) -> None:
        """Forgets the event log, so a watch from an older version gets 410 Gone and must list again."""
        with self.cond:
            self.rv += 1  # every version seen so far is now too old to watch from
            for kind in _LIST_KIND:
                self.compacted[kind] = self.rv
                self.events[kind] = []
            self.cond.notify_all()

    def fail_next(self, method: str, path: str, status: int, message: str = "injected", times: int = 1) -> None:
        """The next `times` requests of `method` to a path starting with `path` are answered with `status`."""
        with self.cond:
            self.faults.append(Fault(method, path, status, message, times))

    def _store(self, kind: str, key: tuple[str, str, str], obj: Obj, event: str) -> Obj:
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        self.objects[key] = obj
        self.events.setdefault(kind, []).append((self.rv, event, copy.deepcopy(obj)))
        self.cond.notify_all()
        return copy.deepcopy(obj)


def matches(obj: Obj, selector: str) -> bool:
    labels = obj.get("metadata", {}).get("labels") or {}
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if "=" in term:
            key, value = term.split("=", 1)
            if labels.get(key) != value:
                return False
        elif term not in labels:
            return False
    return True


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386; for the objects the adapter patches, a strategic merge patch means the same."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _status(code: int, reason: str, message: str) -> Obj:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "code": code,
        "reason": reason,
        "message": message,
    }


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    cluster: FakeCluster

    def log_message(self, format: str, *args: Any) -> None:
        return

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_PATCH(self) -> None:
        self._handle("PATCH")

    def do_DELETE(self) -> None:
        self._handle("DELETE")

    def _handle(self, method: str) -> None:
        url = urlparse(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length)) if length else None
        cluster = self.cluster
        with cluster.cond:
            cluster.requests.append(Request(method, url.path, query, body))
            for fault in cluster.faults:
                if fault.method == method and url.path.startswith(fault.path) and fault.times > 0:
                    fault.times -= 1
                    self._json(fault.status, _status(fault.status, "Injected", fault.message))
                    return
        routed = next(((m, k) for p, k in _ROUTES if (m := p.match(url.path))), None)
        if routed is None:
            self._json(404, _status(404, "NotFound", f"no route {url.path}"))
            return
        match, kind = routed
        ns = match.groupdict().get("ns") or ""
        name = match.groupdict().get("name")
        if kind == "log":
            self._log(ns, name or "", query.get("follow") == "true")
        elif method == "GET" and name is None and query.get("watch") == "true":
            self._watch(kind, query)
        elif method == "GET" and name is None:
            self._list(kind, query)
        elif method == "GET":
            self._get(kind, ns, name or "")
        elif method == "POST":
            self._create(kind, ns, body)
        elif method == "PATCH":
            self._patch(kind, ns, name or "", body)
        elif method == "DELETE":
            try:
                self.cluster.delete(kind, ns, name or "")
                self._json(200, _status(200, "Deleted", "deleted"))
            except KeyError:
                self._json(404, _status(404, "NotFound", f"{kind} {name} not found"))

    def _json(self, code: int, obj: Obj) -> None:
        data = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _list(self, kind: str, query: dict[str, str]) -> None:
        selector = query.get("labelSelector", "")
        with self.cluster.cond:
            items = [
                copy.deepcopy(o) for (k, _, _), o in self.cluster.objects.items() if k == kind and matches(o, selector)
            ]
            rv = self.cluster.rv
        api, list_kind = _LIST_KIND[kind]
        self._json(
            200, {"apiVersion": api, "kind": list_kind, "metadata": {"resourceVersion": str(rv)}, "items": items}
        )

    def _get(self, kind: str, ns: str, name: str) -> None:
        try:
            self._json(200, self.cluster.get(kind, ns, name))
        except KeyError:
            self._json(404, _status(404, "NotFound", f'{kind} "{name}" not found'))

    def _create(self, kind: str, ns: str, body: Obj) -> None:
        name = body["metadata"]["name"]
        with self.cluster.cond:
            if (kind, ns, name) in self.cluster.objects:
                self._json(409, _status(409, "AlreadyExists", f'{kind} "{name}" already exists'))
                return
            body["metadata"]["namespace"] = ns
            stored = self.cluster.put(kind, body)
        self._json(201, stored)

    def _patch(self, kind: str, ns: str, name: str, body: Obj) -> None:
        with self.cluster.cond:
            current = self.cluster.objects.get((kind, ns, name))
            if current is None:
                self._json(404, _status(404, "NotFound", f'{kind} "{name}" not found'))
                return
            wanted = (body.get("metadata") or {}).get("resourceVersion")
            if wanted is not None and wanted != current["metadata"]["resourceVersion"]:
                self._json(409, _status(409, "Conflict", "the object has been modified; please apply your changes"))
                return
            patched = merge_patch(current, body)
            stored = self.cluster._store(kind, (kind, ns, name), patched, "MODIFIED")
        self._json(200, stored)

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _watch(self, kind: str, query: dict[str, str]) -> None:
        selector = query.get("labelSelector", "")
        since = int(query.get("resourceVersion") or 0)
        deadline = time.monotonic() + float(query.get("timeoutSeconds") or 30)
        bookmarks = query.get("allowWatchBookmarks") == "true"
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        cluster = self.cluster
        try:
            with cluster.cond:
                if since < cluster.compacted.get(kind, 0):
                    gone = _status(410, "Expired", f"too old resource version: {since} ({cluster.compacted[kind]})")
                    self._chunk(json.dumps({"type": "ERROR", "object": gone}).encode() + b"\n")
                    self._chunk(b"")
                    return
            next_bookmark = time.monotonic() + cluster.bookmark_s
            while time.monotonic() < deadline:
                with cluster.cond:
                    if since < cluster.compacted.get(kind, 0):
                        return self._chunk(b"")  # compacted under a running watch: the server ends it
                    fresh = [(rv, t, o) for rv, t, o in cluster.events.get(kind, []) if rv > since]
                    if not fresh:
                        cluster.cond.wait(timeout=min(0.2, max(0.0, deadline - time.monotonic())))
                        if since < cluster.compacted.get(kind, 0):
                            return self._chunk(b"")
                        fresh = [(rv, t, o) for rv, t, o in cluster.events.get(kind, []) if rv > since]
                    current = cluster.rv
                lines = []
                for rv, event, obj in fresh:
                    since = rv
                    if matches(obj, selector):
                        lines.append(json.dumps({"type": event, "object": obj}).encode() + b"\n")
                if lines:
                    self._chunk(b"".join(lines))
                if bookmarks and time.monotonic() >= next_bookmark:
                    next_bookmark = time.monotonic() + cluster.bookmark_s
                    mark = {"metadata": {"resourceVersion": str(max(since, current))}}
                    since = max(since, current)
                    self._chunk(json.dumps({"type": "BOOKMARK", "object": mark}).encode() + b"\n")
            self._chunk(b"")
        except (BrokenPipeError, ConnectionResetError):
            return

    def _log(self, ns: str, name: str, follow: bool) -> None:
        cluster = self.cluster
        if ("pods", ns, name) not in cluster.objects and (ns, name) not in cluster.logs:
            self._json(404, _status(404, "NotFound", f'pods "{name}" not found'))
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        sent = 0
        try:
            while True:
                with cluster.cond:
                    data = cluster.logs.get((ns, name), b"")
                    pod = cluster.objects.get(("pods", ns, name))
                    final = pod is None or pod.get("status", {}).get("phase") in ("Succeeded", "Failed")
                    if len(data) == sent and follow and not final:
                        cluster.cond.wait(timeout=0.2)
                        continue
                if len(data) > sent:
                    self._chunk(data[sent:])
                    sent = len(data)
                if not follow or final:
                    break
            self._chunk(b"")
        except (BrokenPipeError, ConnectionResetError):
            return


class FakeApiServer:
    """The fake API on 127.0.0.1 and a port of its own; `client()` is a real `kubernetes.client.ApiClient` for it."""

    def __init__(self) -> None:
        self.cluster = FakeCluster()
        handler = type("Handler", (_Handler,), {"cluster": self.cluster})
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="fake-k8s-api", daemon=True)
        self._thread.start()

    def client(self) -> Any:
        from kubernetes import client

        configuration = client.Configuration()
        configuration.host = self.url
        return client.ApiClient(configuration)

    def kubeconfig(self, path: Path) -> Path:
        """Writes a kubeconfig whose one context is this API with a bearer token, as a service account has."""
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "k3s", "cluster": {"server": self.url}}],
            "users": [{"name": "tracker", "user": {"token": "service-account-token"}}],
            "contexts": [{"name": "k3s", "context": {"cluster": "k3s", "user": "tracker"}}],
            "current-context": "k3s",
        }
        path.write_text(json.dumps(config))  # JSON is YAML
        return path

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> FakeApiServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def node(name: str, cores: int, memory_gi: int, labels: dict[str, str] | None = None) -> Obj:
    """A Ready node with allocatable cores and memory, labelled as simrun's worker nodes are."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"simrun.io/worker": "true", **(labels or {})}},
        "spec": {},
        "status": {"allocatable": {"cpu": str(cores), "memory": f"{memory_gi}Gi", "pods": "110"}},
    }


class ArgoScript:
    """Plays Argo and Kueue against the fake: pods of a submitted Workflow's templates, moved through their states."""

    def __init__(self, cluster: FakeCluster, namespace: str = "simrun") -> None:
        self.cluster = cluster
        self.namespace = namespace
        self._count = 0

    def workflow(self, run_id: str) -> Obj:
        return self.cluster.get("workflows", self.namespace, f"simrun-{run_id}")

    def create_pod(
        self, run_id: str, template: str, worker: str, attempt: int = 0, *, retried_for_memory: bool = False
    ) -> str:
        """The pod Argo makes for an attempt of a template, gated by Kueue; with the retry patch's memory if asked."""
        from simrun_tracker.kubernetes.render import patch_branches

        wf = self.workflow(run_id)
        spec = next(t for t in wf["spec"]["templates"] if t["name"] == template)
        labels = {k: v.replace("{{inputs.parameters.worker}}", worker) for k, v in spec["metadata"]["labels"].items()}
        labels["workflows.argoproj.io/workflow"] = wf["metadata"]["name"]
        main = copy.deepcopy(spec["container"])
        patch = patch_branches(spec["podSpecPatch"])["retry" if retried_for_memory else "base"]
        main["resources"] = merge_patch(main["resources"], patch["containers"][0]["resources"])
        env = {e["name"]: e["value"] for e in main["env"]}
        env.update({e["name"]: e["value"] for e in patch["containers"][0]["env"]})
        env["SIMRUN_WORKER"] = worker
        main["env"] = [{"name": k, "value": v} for k, v in env.items()]
        self._count += 1
        dag_node = template if not template.endswith("-extra") else f"{template}(0:{worker[1:]})"
        name = f"{wf['metadata']['name']}-{template}-{self._count}"
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": self.namespace,
                "labels": labels,
                "annotations": {
                    **spec["metadata"]["annotations"],
                    "workflows.argoproj.io/node-name": f"{wf['metadata']['name']}.{dag_node}({attempt})",
                },
            },
            "spec": {
                "containers": [main, {"name": "wait", "image": "argoexec"}],
                "priorityClassName": spec["priorityClassName"],
                "schedulingGates": [{"name": "kueue.x-k8s.io/admission"}],
                "terminationGracePeriodSeconds": patch["terminationGracePeriodSeconds"],
            },
            "status": {"phase": "Pending"},
        }
        self.cluster.put("pods", pod)
        return name

    def admit(self, name: str, node_name: str) -> None:
        """Kueue admits (removes the gate), the scheduler binds, the container runs."""

        def change(pod: Obj) -> None:
            pod["spec"].pop("schedulingGates", None)
            pod["spec"]["nodeName"] = node_name
            pod["status"] = {
                "phase": "Running",
                "conditions": [{"type": "PodScheduled", "status": "True"}],
                "containerStatuses": [{"name": "main", "started": True, "state": {"running": {"startedAt": "x"}}}],
            }

        self.cluster.modify("pods", self.namespace, name, change)

    def unschedulable(self, name: str, message: str) -> None:
        def change(pod: Obj) -> None:
            pod["spec"].pop("schedulingGates", None)
            pod["status"] = {
                "phase": "Pending",
                "conditions": [
                    {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}
                ],
            }

        self.cluster.modify("pods", self.namespace, name, change)

    def exit(self, name: str, code: int, reason: str | None = None, log: bytes = b"") -> None:
        """The container ends with `code` (and `reason`, e.g. OOMKilled); the pod is Succeeded or Failed."""
        if log:
            with self.cluster.cond:
                self.cluster.logs[(self.namespace, name)] = self.cluster.logs.get((self.namespace, name), b"") + log

        def change(pod: Obj) -> None:
            terminated: Obj = {"exitCode": code}
            if reason:
                terminated["reason"] = reason
            pod["status"]["phase"] = "Succeeded" if code == 0 else "Failed"
            pod["status"]["containerStatuses"] = [{"name": "main", "state": {"terminated": terminated}}]

        self.cluster.modify("pods", self.namespace, name, change)

    def preempt(self, name: str, condition: str = "TerminationTarget") -> None:
        """Kueue preempts: the pod is marked, stops on SIGTERM (143) and is deleted, as Kueue deletes its victims."""

        def mark(pod: Obj) -> None:
            pod["status"].setdefault("conditions", []).append(
                {"type": condition, "status": "True", "reason": "Preempted"}
            )

        self.cluster.modify("pods", self.namespace, name, mark)
        self.exit(name, 143)
        self.cluster.delete("pods", self.namespace, name)

    def write_log(self, name: str, data: bytes) -> None:
        with self.cluster.cond:
            self.cluster.logs[(self.namespace, name)] = self.cluster.logs.get((self.namespace, name), b"") + data
            self.cluster.cond.notify_all()
