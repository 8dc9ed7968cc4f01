"""The kubernetes executor through the real `kubernetes` client against a fake API server on the real REST paths.

The tests play Argo and Kueue (`ArgoScript`): they make the pods of the submitted Workflow from its own templates
and move them through admission, preemption, kills for memory and exits, and check what the port reports.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kubernetes_fake_api import ArgoScript, FakeApiServer, node
from kubernetes_runs import IMAGE, planned_record, scan_run
from simrun_core.errors import FailedPrecondition, InvalidArgument, NotFound, Unavailable
from simrun_runtime.layout import StoreLayout
from simrun_runtime.record import SnapshotRef
from simrun_runtime.reports import WorkerReport, utcnow
from simrun_tracker.executor import MemoryKill, PodHistory, PodPhase, PodStatus, RunRecovery, TaskOrdering
from simrun_tracker.kubernetes.adapter import KubernetesExecutor
from simrun_tracker.kubernetes.config import KubernetesSettings
from simrun_tracker.pods import run_spec

RUN = "20261201-080000-aaaaaa"
NS = "simrun"


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        server.cluster.bookmark_s = 0.2
        server.cluster.put("nodes", node("node-a", 8, 32))
        server.cluster.put("nodes", node("node-b", 8, 32))
        server.cluster.put("nodes", node("control", 4, 8, labels={"simrun.io/worker": "false"}))
        yield server


@pytest.fixture
def store(tmp_path: Path) -> StoreLayout:
    layout = StoreLayout(tmp_path / "store")
    layout.runs.mkdir(parents=True)
    return layout


class Woken:
    """Collects the run ids the executor wakes its listener with, and waits for a condition on the port."""

    def __init__(self) -> None:
        self.runs: list[str] = []
        self.event = threading.Event()

    def __call__(self, run_id: str) -> None:
        self.runs.append(run_id)
        self.event.set()


@pytest.fixture
def make(api: FakeApiServer, store: StoreLayout) -> Iterator[Callable[[], KubernetesExecutor]]:
    made: list[KubernetesExecutor] = []

    def factory() -> KubernetesExecutor:
        settings = KubernetesSettings(watch_timeout_s=2, backoff_max_s=0.5, request_timeout_s=5)
        executor = KubernetesExecutor(settings, store, client=api.client())
        made.append(executor)
        return executor

    yield factory
    for executor in made:
        executor.close()


def wait_for(executor: KubernetesExecutor, check: Callable[[dict[str, PodStatus]], bool], timeout: float = 10) -> dict:
    """Waits until `check` holds for the run's pods by worker name (`scan/w0`), and returns them."""
    deadline = time.monotonic() + timeout
    while True:
        pods = {f"{p.spec.task_id}/{p.spec.worker}": p for p in executor.pods(RUN)}
        if pods and check(pods):
            return pods
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out; pods now: { {k: (v.phase, v.message) for k, v in pods.items()} }")
        time.sleep(0.02)


def until(check: Callable[[], object], message: str = "timed out", timeout: float = 5) -> None:
    """Waits until `check()` holds; fails with `message` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, message
        time.sleep(0.02)


def submitted(api: FakeApiServer, run_id: str = RUN, timeout: float = 10) -> None:
    until(
        lambda: ("workflows", NS, f"simrun-{run_id}") in api.cluster.objects, "the workflow was never created", timeout
    )


def test_submits_one_workflow_and_follows_a_pod_through_admission(make, api: FakeApiServer, store) -> None:
    executor = make()
    woken = Woken()
    executor.subscribe(woken)
    assert executor.ordering is TaskOrdering.ADAPTER
    executor.start_run(scan_run(RUN))
    # The folder each pod mounts read-write is there before the Workflow is (the pods lay out its files).
    assert store.run(RUN).task("scan").root.is_dir()
    submitted(api)
    pods = wait_for(executor, lambda p: len(p) == 4)
    assert all(p.phase is PodPhase.PENDING for p in pods.values())
    argo = ArgoScript(api.cluster)
    name = argo.create_pod(RUN, "scan-w0", "w0")
    pods = wait_for(executor, lambda p: p["scan/w0"].message == "waiting for admission by Kueue")
    argo.admit(name, "node-a")
    pods = wait_for(executor, lambda p: p["scan/w0"].phase is PodPhase.RUNNING)
    assert pods["scan/w0"].node == "node-a" and pods["scan/w0"].attempts == 1
    argo.exit(name, 0)
    wait_for(executor, lambda p: p["scan/w0"].phase is PodPhase.SUCCEEDED)
    assert RUN in woken.runs
    creates = [r for r in api.cluster.requests if r.method == "POST"]
    assert len(creates) == 1 and creates[0].path.endswith("/namespaces/simrun/workflows")
    watches = [r for r in api.cluster.requests if r.query.get("watch") == "true" and r.path.endswith("/pods")]
    assert watches and all(w.query.get("labelSelector") == "simrun.io/run" for w in watches)
    executor.start_run(scan_run(RUN))  # a run known already is left as it is
    time.sleep(0.2)
    assert len([r for r in api.cluster.requests if r.method == "POST"]) == 1


def test_preempting_extra_workers_keeps_the_coordinator(make, api: FakeApiServer) -> None:
    executor = make()
    executor.start_run(scan_run(RUN))
    submitted(api)
    argo = ArgoScript(api.cluster)
    names = {w: argo.create_pod(RUN, "scan-w0" if w == "w0" else "scan-extra", w) for w in ("w0", "w1", "w2")}
    for w, name in names.items():
        argo.admit(name, "node-a" if w != "w2" else "node-b")
    wait_for(executor, lambda p: all(p[f"scan/{w}"].phase is PodPhase.RUNNING for w in names))
    # A higher priority's run takes back the extra workers: Kueue marks, stops and deletes them.
    argo.preempt(names["w1"])
    argo.preempt(names["w2"], condition="DisruptionTarget")
    pods = wait_for(executor, lambda p: p["scan/w1"].preemptions == 1 and p["scan/w2"].preemptions == 1)
    assert pods["scan/w1"].phase is PodPhase.PENDING and pods["scan/w2"].phase is PodPhase.PENDING
    assert "preempted" in pods["scan/w1"].message
    assert pods["scan/w0"].phase is PodPhase.RUNNING and pods["scan/w0"].preemptions == 0
    assert pods["scan/w1"].memory_gb == 4.0  # a preemption is retried with the same memory
    again = argo.create_pod(RUN, "scan-extra", "w1", attempt=1)
    argo.admit(again, "node-b")
    pods = wait_for(executor, lambda p: p["scan/w1"].phase is PodPhase.RUNNING)
    assert pods["scan/w1"].attempts == 2 and pods["scan/w1"].preemptions == 1


def test_a_kill_for_memory_is_retried_at_the_retry_memory_and_a_second_fails_the_task(make, api) -> None:
    executor = make()
    executor.start_run(scan_run(RUN))
    submitted(api)
    argo = ArgoScript(api.cluster)
    first = argo.create_pod(RUN, "scan-w0", "w0")
    argo.admit(first, "node-a")
    argo.exit(first, 137, "OOMKilled")
    pods = wait_for(executor, lambda p: len(p["scan/w0"].memory_kills) == 1)
    w0 = pods["scan/w0"]
    assert w0.phase is PodPhase.PENDING and w0.memory_gb == 6.0
    assert w0.memory_kills[0].memory_gb == 4.0 and w0.memory_kills[0].evidence == "oomkilled"
    assert "retried with 6 GiB" in w0.message
    # Argo's retry takes the pod spec patch's retry branch after exit 137: 1.5 times the memory, request = limit.
    retry = argo.create_pod(RUN, "scan-w0", "w0", attempt=1, retried_for_memory=True)
    resources = api.cluster.get("pods", NS, retry)["spec"]["containers"][0]["resources"]
    assert resources["limits"]["memory"] == resources["requests"]["memory"] == "6Gi"
    argo.admit(retry, "node-a")
    argo.exit(retry, 137, "OOMKilled")
    pods = wait_for(executor, lambda p: p["scan/w0"].phase is PodPhase.FAILED)
    assert len(pods["scan/w0"].memory_kills) == 2
    assert pods["scan/w0"].message == "killed for memory twice; the retry had 6 GiB (6 GiB per process)"


def test_exit_137_counts_as_a_kill_for_memory_only_with_the_reports_evidence(make, api, store) -> None:
    executor = make()
    executor.start_run(scan_run(RUN))
    submitted(api)
    argo = ArgoScript(api.cluster)
    w0 = argo.create_pod(RUN, "scan-w0", "w0")
    w1 = argo.create_pod(RUN, "scan-extra", "w1")
    created = api.cluster.get("pods", NS, w1)["metadata"]["creationTimestamp"]
    from datetime import datetime

    started_ms = int(datetime.fromisoformat(created).timestamp() * 1000) + 500
    WorkerReport(
        run_id=RUN,
        task_id="scan",
        worker="w1",
        role="extra",
        started_ms=started_ms,
        task_type="m:Scan",
        processes=2,
        memory_source="cgroup_v2",
        peak_memory_gb=3.9,
        per_process_gb=1.95,
        oom_kills=1,
        started_at=utcnow(),
    ).write(store.run(RUN).task("scan"))
    for name in (w0, w1):
        argo.admit(name, "node-a")
        argo.exit(name, 137)
    pods = wait_for(executor, lambda p: p["scan/w0"].sigkills == 1 and len(p["scan/w1"].memory_kills) == 1)
    assert pods["scan/w0"].memory_kills == [] and pods["scan/w0"].phase is PodPhase.PENDING
    assert pods["scan/w1"].memory_kills[0].evidence == "cgroup"


def test_cancel_stops_the_workflow_and_a_refused_workflow_fails_the_run(make, api) -> None:
    executor = make()
    api.cluster.fail_next("POST", "/apis/argoproj.io", 503, "etcd is slow")
    executor.start_run(scan_run(RUN))
    submitted(api)  # a transient error is retried
    executor.stop_pods(RUN)
    until(
        lambda: api.cluster.get("workflows", NS, f"simrun-{RUN}")["spec"].get("shutdown"),
        "the workflow was not stopped",
    )
    assert api.cluster.get("workflows", NS, f"simrun-{RUN}")["spec"]["shutdown"] == "Terminate"
    pods = wait_for(executor, lambda p: all(s.phase is PodPhase.FAILED for s in p.values()))
    assert {s.message for s in pods.values()} == {"stopped"}

    other = "20261201-080000-bbbbbb"
    api.cluster.fail_next("POST", "/apis/argoproj.io", 422, 'Workflow.argoproj.io "x" is invalid: spec.templates')
    executor.start_run(scan_run(other))
    until(
        lambda: all(p.phase is PodPhase.FAILED for p in executor.pods(other)), "a refused workflow left its run waiting"
    )
    message = executor.pods(other)[0].message
    assert "is invalid: spec.templates" in message and "422" in message


def test_a_bad_run_is_refused_before_anything_is_submitted(make, api) -> None:
    executor = make()
    with pytest.raises(FailedPrecondition, match="not named by digest"):
        executor.start_run(scan_run(RUN, image="registry/simrun:latest"))
    with pytest.raises(InvalidArgument, match="run id"):
        executor.start_run(scan_run("Not_A_Label!"))
    assert not [r for r in api.cluster.requests if r.method == "POST"]


def test_nodes_come_from_the_api_and_a_reservation_taints_and_labels_its_node(make, api) -> None:
    executor = make()
    nodes = {n.name: n for n in executor.nodes()}
    assert set(nodes) == {"node-a", "node-b"}  # only simrun's worker nodes
    assert nodes["node-a"].cores == 7 and nodes["node-a"].allocatable_cores == 8.0  # minus the wait sidecar
    assert nodes["node-a"].memory_gb == pytest.approx(32 - 0.125)
    api.cluster.fail_next("PATCH", "/api/v1/nodes/node-a", 409, "the object has been modified")
    executor.reserve("node-a", RUN)
    assert {n.name: n.reserved_by for n in executor.nodes()}["node-a"] == RUN  # at once, from its own state
    with pytest.raises(FailedPrecondition, match="reserved by run"):
        executor.reserve("node-a", "20261201-080000-bbbbbb")
    with pytest.raises(NotFound):
        executor.reserve("node-z", RUN)
    until(lambda: "simrun/reserved" in (api.cluster.get("nodes", "", "node-a")["metadata"].get("labels") or {}))
    obj = api.cluster.get("nodes", "", "node-a")
    assert obj["metadata"]["labels"]["simrun/reserved"] == RUN
    assert obj["spec"]["taints"] == [{"key": "simrun/reserved", "value": RUN, "effect": "NoExecute"}]
    executor.release(RUN)
    until(lambda: "simrun/reserved" not in (api.cluster.get("nodes", "", "node-a")["metadata"].get("labels") or {}))
    assert api.cluster.get("nodes", "", "node-a")["spec"]["taints"] == []
    until(lambda: {n.name: n.reserved_by for n in executor.nodes()}["node-a"] is None)


def test_nodes_are_unavailable_until_the_api_answers_then_listed(api, store) -> None:
    api.cluster.fail_next("GET", "/api/v1/nodes", 503, "starting", times=1000)
    settings = KubernetesSettings(backoff_max_s=0.2)
    executor = KubernetesExecutor(settings, store, client=api.client(), sync_timeout_s=0.5)
    try:
        with pytest.raises(Unavailable, match="not listed yet"):
            executor.nodes()
        with api.cluster.cond:
            api.cluster.faults.clear()  # the API server is up: the informer, backing off, lists at its next try
        deadline = time.monotonic() + 10
        while True:
            try:
                assert {n.name for n in executor.nodes()} == {"node-a", "node-b"}
                break
            except Unavailable:
                assert time.monotonic() < deadline, "the informer never listed the nodes"
                time.sleep(0.05)
    finally:
        executor.close()


def test_a_restarted_tracker_rebuilds_its_view_from_the_api_and_stops_nothing(make, api) -> None:
    first = make()
    run = scan_run(RUN, reservation="node-b")
    first.reserve("node-b", RUN)
    first.start_run(run)
    submitted(api)
    argo = ArgoScript(api.cluster)
    w0 = argo.create_pod(RUN, "scan-w0", "w0")
    argo.admit(w0, "node-b")
    argo.exit(w0, 137, "OOMKilled")
    w0_retry = argo.create_pod(RUN, "scan-w0", "w0", attempt=1, retried_for_memory=True)
    argo.admit(w0_retry, "node-b")
    w1 = argo.create_pod(RUN, "scan-extra", "w1")
    argo.admit(w1, "node-b")
    before = wait_for(first, lambda p: p["scan/w0"].phase is PodPhase.RUNNING and p["scan/w1"].attempts == 1)
    first.close()
    requests = len(api.cluster.requests)

    second = make()
    kills = before["scan/w0"].memory_kills
    second.restore(RunRecovery(RUN, "node-b", [PodHistory("scan", "w0", kills, attempts=2)]))
    second.start_run(run)
    after = wait_for(
        second, lambda p: p["scan/w0"].phase is PodPhase.RUNNING and p["scan/w1"].phase is PodPhase.RUNNING
    )
    assert len(after["scan/w0"].memory_kills) == 1 and after["scan/w0"].memory_gb == 6.0
    assert after["scan/w0"].attempts == 2 and after["scan/w0"].node == "node-b"
    time.sleep(0.3)
    changes = [r for r in api.cluster.requests[requests:] if r.method in ("PATCH", "DELETE")]
    assert changes == []  # nothing stopped, and the reservation is already on the node
    assert {n.name: n.reserved_by for n in second.nodes()}["node-b"] == RUN
    # The second kill after the restart still fails the task: the kill before it is remembered.
    argo.exit(w0_retry, 137, "OOMKilled")
    failed = wait_for(second, lambda p: p["scan/w0"].phase is PodPhase.FAILED)
    assert "killed for memory twice" in failed["scan/w0"].message


def test_a_restart_sees_attempts_of_deleted_pods_in_the_workflow_status(make, api) -> None:
    executor = make()
    executor.start_run(scan_run(RUN))
    submitted(api)
    nodes = {
        "n1": {
            "id": "n1",
            "name": f"simrun-{RUN}.scan-w0(0)",
            "type": "Pod",
            "templateName": "scan-w0",
            "phase": "Failed",
            "message": "OOMKilled (exit code 137)",
            "outputs": {"exitCode": "137"},
            "startedAt": "2026-12-01T08:00:01Z",
        },
        "n2": {
            "id": "n2",
            "name": f"simrun-{RUN}.scan-extra(0:1)(0)",
            "type": "Pod",
            "templateName": "scan-extra",
            "inputs": {"parameters": [{"name": "worker", "value": "w1"}]},
            "phase": "Failed",
            "message": "pod deleted",
            "outputs": {"exitCode": "143"},
            "startedAt": "2026-12-01T08:00:02Z",
        },
    }
    api.cluster.modify(
        "workflows", NS, f"simrun-{RUN}", lambda wf: wf.update(status={"phase": "Running", "nodes": nodes})
    )
    pods = wait_for(executor, lambda p: len(p["scan/w0"].memory_kills) == 1)
    assert pods["scan/w0"].phase is PodPhase.PENDING and pods["scan/w0"].memory_gb == 6.0
    assert pods["scan/w1"].preemptions == 1 and pods["scan/w1"].phase is PodPhase.PENDING


def test_a_failed_workflow_fails_the_pods_that_never_ran(make, api) -> None:
    executor = make()
    executor.start_run(scan_run(RUN))
    submitted(api)
    api.cluster.modify(
        "workflows",
        NS,
        f"simrun-{RUN}",
        lambda wf: wf.update(status={"phase": "Error", "message": 'pods "x" is forbidden: exceeded quota'}),
    )
    pods = wait_for(executor, lambda p: p["plot/w0"].phase is PodPhase.FAILED)
    assert "exceeded quota" in pods["plot/w0"].message


def test_the_informers_list_again_after_a_410(make, api) -> None:
    executor = make()
    executor.start_run(scan_run(RUN))
    submitted(api)
    pods_informer = next(i for i in executor._informers if i.kind == "pods")
    lists = pods_informer.relists
    api.cluster.compact()
    argo = ArgoScript(api.cluster)
    name = argo.create_pod(RUN, "scan-w0", "w0")
    argo.admit(name, "node-a")
    wait_for(executor, lambda p: p["scan/w0"].phase is PodPhase.RUNNING)
    until(lambda: pods_informer.relists != lists, "no re-list after 410")


def test_logs_stream_live_and_are_archived_in_the_store_once_the_pod_ended(make, api, store) -> None:
    executor = make()
    executor.start_run(scan_run(RUN))
    submitted(api)
    argo = ArgoScript(api.cluster)
    name = argo.create_pod(RUN, "plot-w0", "w0")
    argo.admit(name, "node-a")
    argo.write_log(name, b"starting\n")
    wait_for(executor, lambda p: p["plot/w0"].phase is PodPhase.RUNNING)
    lines: list[tuple[str, str]] = []
    follower = threading.Thread(target=lambda: lines.extend(executor.logs(RUN, "plot", "w0", follow=True)))
    follower.start()
    time.sleep(0.3)
    argo.write_log(name, b"half\n")
    time.sleep(0.3)
    argo.exit(name, 0, log=b"done\n")
    follower.join(timeout=10)
    assert not follower.is_alive()
    assert "".join(text for _, text in lines) == "starting\nhalf\ndone\n"
    assert {n for n, _ in lines} == {"w0.1.log"}
    archive = store.run(RUN).task("plot").logs / "w0.1.log"
    until(lambda: archive.exists(), "the log was not archived")
    assert archive.read_text() == "starting\nhalf\ndone\n"
    assert list(executor.logs(RUN, "plot", "", follow=False)) == [("w0.1.log", "starting\nhalf\ndone\n")]
    # Argo collects the pods once the Workflow succeeds: the archive still answers; a retry is the next attempt.
    api.cluster.delete("pods", NS, name)
    again = argo.create_pod(RUN, "plot-w0", "w0", attempt=1)
    argo.admit(again, "node-b")
    argo.exit(again, 0, log=b"second\n")
    second = store.run(RUN).task("plot").logs / "w0.2.log"
    until(lambda: second.exists(), "the retry's log was not archived")
    api.cluster.delete("pods", NS, again)
    until(lambda: not executor._task_pods(RUN, "plot", "w0"))
    assert list(executor.logs(RUN, "plot", "w0", follow=False)) == [
        ("w0.1.log", "starting\nhalf\ndone\n"),
        ("w0.2.log", "second\n"),
    ]
    with pytest.raises(InvalidArgument, match="no worker"):
        list(executor.logs(RUN, "plot", "../x", follow=False))


def test_after_a_restart_the_record_and_the_workflow_suffice_to_follow_a_run(make, api, store) -> None:
    record = planned_record(RUN)
    record.save(store.run(RUN))
    first = make()
    first.start_run(run_spec(record, "env-1", 30.0, IMAGE))
    submitted(api)
    argo = ArgoScript(api.cluster)
    w0 = argo.create_pod(RUN, "scan-w0", "w0")
    argo.admit(w0, "node-a")
    wait_for(first, lambda p: p["scan/w0"].phase is PodPhase.RUNNING)
    first.close()

    second = make()
    second.restore(RunRecovery(RUN, None, [PodHistory("scan", "w0", [], attempts=1)]))
    pods = wait_for(second, lambda p: p["scan/w0"].phase is PodPhase.RUNNING)  # no start_run: adopted
    assert set(pods) == {"scan/w0", "scan/w1", "scan/w2", "plot/w0"}
    assert pods["scan/w0"].spec.image == IMAGE and pods["scan/w0"].spec.grace_s == 30.0
    assert len([r for r in api.cluster.requests if r.method == "POST"]) == 1


def test_the_server_config_chooses_the_kubernetes_executor(api, store, tmp_path) -> None:
    from simrun_core.config import ServerConfig
    from simrun_tracker.kubernetes import kubernetes_executor
    from simrun_tracker.ports import ServerEnvironments
    from simrun_tracker.server import build_executor

    kubeconfig = api.kubeconfig(tmp_path / "kubeconfig")
    config = ServerConfig.model_validate(
        {"executor": {"kind": "kubernetes", "kubernetes": {"kubeconfig": str(kubeconfig), "namespace": "simrun"}}}
    )
    executor = build_executor(config, store, ServerEnvironments(), ServerEnvironments())
    try:
        assert isinstance(executor, KubernetesExecutor)
        assert {n.name for n in executor.nodes()} == {"node-a", "node-b"}
    finally:
        executor.close()
    with pytest.raises(InvalidArgument, match="namespce"):
        kubernetes_executor({"namespce": "x"}, store, 30.0)


def test_a_run_recorded_queued_whose_workflow_was_never_created_is_handed_over_again_after_a_restart(
    make, api, store
) -> None:
    record = planned_record(RUN)
    record.snapshots = [SnapshotRef(name="model", snapshot_id="ab" * 32, path="/elsewhere/than/the/store")]
    record.save(store.run(RUN))
    settings = KubernetesSettings(default_image=IMAGE.replace("ab", "00"), watch_timeout_s=2, backoff_max_s=0.5)
    executor = KubernetesExecutor(settings, store, client=api.client())
    try:
        kills = [MemoryKill(4.0, 2.0, "recorded")]
        executor.restore(RunRecovery(RUN, None, [PodHistory("scan", "w0", kills, attempts=1)]))
        # The tracker stopped between recording the run and creating its Workflow: the adapter cannot know the
        # run's image (its environment's), so it reports no pods and the driver hands the run over again.
        assert executor.pods(RUN) == []
        time.sleep(0.3)
        assert not [r for r in api.cluster.requests if r.method == "POST"]
        executor.start_run(run_spec(record, "env-1", 30.0, IMAGE))
        submitted(api)
        pods = wait_for(executor, lambda p: len(p) == 4)
        assert all(p.phase is PodPhase.PENDING for p in pods.values())
        assert pods["scan/w0"].memory_gb == 6.0 and len(pods["scan/w0"].memory_kills) == 1  # the record's kill
        workflow = api.cluster.get("workflows", NS, f"simrun-{RUN}")
        assert {t["container"]["image"] for t in workflow["spec"]["templates"] if "container" in t} == {IMAGE}
        # The pods read the run's snapshot, found by its name and id (never the path a record holds), read-only.
        mounts = next(t for t in workflow["spec"]["templates"] if "container" in t)["container"]["volumeMounts"]
        assert {"name": "store", "mountPath": f"/store/snapshots/model/{'ab' * 32}", "readOnly": True,
                "subPath": f"snapshots/model/{'ab' * 32}"} in mounts  # fmt: skip
    finally:
        executor.close()


def workflow_patches(api: FakeApiServer) -> list:
    return [r for r in api.cluster.requests if r.method == "PATCH" and "/workflows/" in r.path]


def test_a_run_whose_pods_all_succeeded_is_left_for_argo_to_end(make, api) -> None:
    executor = make()
    executor.start_run(scan_run(RUN, pods=1))
    submitted(api)
    argo = ArgoScript(api.cluster)
    for template in ("scan-w0", "plot-w0"):
        name = argo.create_pod(RUN, template, "w0")
        argo.admit(name, "node-a")
        argo.exit(name, 0)
    wait_for(executor, lambda p: all(s.phase is PodPhase.SUCCEEDED for s in p.values()))
    time.sleep(0.5)
    executor.pods(RUN)
    # Argo ends the Workflow itself (Succeeded, pods collected): a shutdown now would race it and mark it failed.
    assert workflow_patches(api) == []
    assert "shutdown" not in api.cluster.get("workflows", NS, f"simrun-{RUN}")["spec"]


def test_a_done_run_with_extra_workers_still_queued_is_stopped(make, api) -> None:
    executor = make()
    executor.start_run(scan_run(RUN, pods=2))
    submitted(api)
    argo = ArgoScript(api.cluster)
    argo.create_pod(RUN, "scan-extra", "w1")  # waits for admission, and would hold the Workflow open
    for template in ("scan-w0", "plot-w0"):
        name = argo.create_pod(RUN, template, "w0")
        argo.admit(name, "node-a")
        argo.exit(name, 0)
        if template == "scan-w0":
            wait_for(executor, lambda p: p["scan/w0"].phase is PodPhase.SUCCEEDED)
            executor.stop_pods(RUN, "scan")  # the driver, once the merge marker is there
    wait_for(executor, lambda p: p["plot/w0"].phase is PodPhase.SUCCEEDED)
    deadline = time.monotonic() + 5
    while api.cluster.get("workflows", NS, f"simrun-{RUN}")["spec"].get("shutdown") != "Terminate":
        assert time.monotonic() < deadline, "the Workflow held open by a queued extra worker was not stopped"
        executor.pods(RUN)
        time.sleep(0.05)
    assert len(workflow_patches(api)) == 1


def test_an_archive_the_store_refuses_holds_up_no_other(make, api, store) -> None:
    executor = make()
    executor.start_run(scan_run(RUN, pods=1))
    submitted(api)
    blocked = store.run(RUN).task("plot").logs
    blocked.parent.mkdir(parents=True, exist_ok=True)  # made by `start_run`
    blocked.write_text("not a folder")  # the store refuses the plot pod's archive (as a full disk would)
    argo = ArgoScript(api.cluster)
    plot = argo.create_pod(RUN, "plot-w0", "w0")
    argo.admit(plot, "node-a")
    argo.exit(plot, 0, log=b"plot\n")
    wait_for(executor, lambda p: p["plot/w0"].phase is PodPhase.SUCCEEDED)
    scan = argo.create_pod(RUN, "scan-w0", "w0")
    argo.admit(scan, "node-a")
    argo.exit(scan, 0, log=b"scan\n")
    archive = store.run(RUN).task("scan").logs / "w0.1.log"
    until(lambda: archive.exists(), "a refused archive was tried again forever and held up the next")
    assert archive.read_text() == "scan\n"


def test_only_the_api_s_transient_answers_are_tried_again() -> None:
    import urllib3
    from kubernetes.client.exceptions import ApiException
    from simrun_tracker.kubernetes.api import classify

    assert isinstance(classify(ApiException(status=503), "x"), Unavailable)
    assert isinstance(classify(urllib3.exceptions.MaxRetryError(None, "/", "refused"), "x"), Unavailable)
    assert isinstance(classify(ConnectionResetError(), "x"), Unavailable)
    forbidden = classify(ApiException(status=403, reason="Forbidden"), "submitting")
    assert isinstance(forbidden, FailedPrecondition) and "403" in str(forbidden)
    assert isinstance(classify(ApiException(status=422), "x"), InvalidArgument)
    for own in (KeyError("run"), OSError(28, "No space left on device"), ValueError("bad json")):
        error = classify(own, "archiving")
        assert not isinstance(error, Unavailable) and type(own).__name__ in str(error)


def test_following_the_logs_of_a_run_the_adapter_does_not_follow_ends_with_its_archives(make, store) -> None:
    executor = make()
    logs = store.run(RUN).task("plot").logs
    logs.mkdir(parents=True)
    (logs / "w0.1.log").write_text("archived\n")
    lines: list[tuple[str, str]] = []
    follower = threading.Thread(target=lambda: lines.extend(executor.logs(RUN, "plot", "w0", follow=True)))
    follower.start()
    follower.join(timeout=5)
    assert not follower.is_alive(), "following the logs of an unknown run never ended"
    assert lines == [("w0.1.log", "archived\n")]


def test_a_forgotten_run_is_kept_until_its_workflow_ended_and_its_pods_logs_are_archived(make, api, store) -> None:
    executor = make()
    executor.start_run(scan_run(RUN))
    submitted(api)
    argo = ArgoScript(api.cluster)
    name = argo.create_pod(RUN, "plot-w0", "w0")
    argo.admit(name, "node-a")
    wait_for(executor, lambda p: p["plot/w0"].phase is PodPhase.RUNNING)
    executor.stop_pods(RUN)
    executor.forget(RUN)  # the tracker has ended the run; its pod is still stopping
    time.sleep(0.3)
    assert executor.pods(RUN), "a run whose pod still runs is forgotten only once it has stopped"
    argo.exit(name, 143, log=b"stopping\n")
    archive = store.run(RUN).task("plot").logs / "w0.1.log"
    until(lambda: archive.exists(), "the log of a forgotten run's last pod was not archived")
    assert archive.read_text() == "stopping\n"
    time.sleep(0.3)
    assert executor.pods(RUN), "kept while its Workflow has not ended"

    def end(obj: dict) -> None:
        obj.setdefault("status", {})["phase"] = "Failed"

    api.cluster.modify("workflows", NS, f"simrun-{RUN}", end)
    until(lambda: not executor.pods(RUN), "the forgotten run was never dropped")
    assert list(executor.logs(RUN, "plot", "w0", follow=False)) == [("w0.1.log", "stopping\n")]
    api.cluster.delete("pods", NS, name)
    api.cluster.delete("workflows", NS, f"simrun-{RUN}")
    until(
        lambda: RUN not in executor._pods and RUN not in executor._workflows,
        "the informers' caches kept a collected run",
    )


def test_a_restarted_tracker_archives_the_logs_of_pods_that_ended_while_it_was_down(make, api, store) -> None:
    first = make()
    first.start_run(scan_run(RUN))
    submitted(api)
    argo = ArgoScript(api.cluster)
    name = argo.create_pod(RUN, "plot-w0", "w0")
    argo.admit(name, "node-a")
    wait_for(first, lambda p: p["plot/w0"].phase is PodPhase.RUNNING)
    first.close()
    argo.exit(name, 0, log=b"ended while the tracker was down\n")
    make()  # the run is not even handed over again (it ended, or its record is final): its pods' logs still matter
    archive = store.run(RUN).task("plot").logs / "w0.1.log"
    until(lambda: archive.exists(), "the log of a pod that ended while the tracker was down was never archived")
    assert archive.read_text() == "ended while the tracker was down\n"


def test_a_run_adopted_after_its_workflow_ended_is_dropped_when_forgotten(make, api, store) -> None:
    record = planned_record(RUN)
    record.save(store.run(RUN))
    first = make()
    first.start_run(run_spec(record, "env-1", 30.0, IMAGE))
    submitted(api)
    first.close()
    api.cluster.modify(
        "workflows", NS, f"simrun-{RUN}", lambda wf: wf.update(status={"phase": "Failed", "message": "stopped"})
    )
    second = make()  # the Workflow ended while the tracker was down: no event of its end will come
    second.restore(RunRecovery(RUN, None, []))
    assert second.pods(RUN)
    second.forget(RUN)
    assert second.pods(RUN) == []


def test_releasing_a_run_frees_its_node_even_once_cordoned(make, api) -> None:
    executor = make()
    executor.reserve("node-a", RUN)
    until(
        lambda: (api.cluster.get("nodes", "", "node-a")["metadata"].get("labels") or {}).get("simrun/reserved") == RUN
    )
    api.cluster.modify("nodes", "", "node-a", lambda n: n["spec"].update(unschedulable=True))  # kubectl cordon
    until(lambda: "node-a" not in {n.name for n in executor.nodes()})
    executor.release(RUN)
    until(
        lambda: not api.cluster.get("nodes", "", "node-a")["spec"].get("taints"),
        "a cordoned node kept the released run's taint",
    )
    assert "simrun/reserved" not in (api.cluster.get("nodes", "", "node-a")["metadata"].get("labels") or {})
