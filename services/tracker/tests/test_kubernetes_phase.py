"""The phase mapping as tables: pods and Workflow nodes to attempts, a worker's attempts to the port's pod status."""
# ruff: noqa: E501  (tables read best one case a line)

from __future__ import annotations

import pytest
from kubernetes_runs import pod
from simrun_tracker.executor import MemoryKill, PodHistory, PodPhase
from simrun_tracker.kubernetes.phase import (
    Attempt,
    AttemptPhase,
    WorkerContext,
    attempt_from_node,
    attempt_from_pod,
    merge_attempts,
    worker_status,
)

RUN = "20261201-080000-aaaaaa"
SPEC = pod(RUN, "scan", "w0", memory_gb=4.0, retry_memory_gb=6.0, processes=3)


def k8s_pod(phase: str, *, gate: bool = False, terminated: dict | None = None, conditions: list | None = None) -> dict:
    status: dict = {"phase": phase, "conditions": conditions or []}
    if terminated is not None:
        status["containerStatuses"] = [{"name": "main", "state": {"terminated": terminated}}]
    elif phase == "Running":
        status["containerStatuses"] = [{"name": "main", "state": {"running": {}}}]
    return {
        "metadata": {"name": "p", "annotations": {"workflows.argoproj.io/node-name": "wf.scan-w0(0)"}},
        "spec": {
            "nodeName": None if gate else "node-a",
            "schedulingGates": [{"name": "kueue.x-k8s.io/admission"}] if gate else [],
            "containers": [{"name": "main", "resources": {"limits": {"memory": "6Gi"}}}],
        },
        "status": status,
    }


def waiting_pod(container: str, reason: str, message: str) -> dict:
    """A pod bound to a node whose container waits (`init` is Argo's init container)."""
    obj = k8s_pod("Pending")
    waiting = {"reason": reason, **({"message": message} if message else {})}
    key = "initContainerStatuses" if container == "init" else "containerStatuses"
    obj["status"][key] = [{"name": container, "state": {"waiting": waiting}}]
    return obj


UNSCHEDULED = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/3 nodes"}]
PREEMPTED = [{"type": "TerminationTarget", "status": "True"}]


@pytest.mark.parametrize(
    ("obj", "deleted", "phase", "fields"),
    [
        (k8s_pod("Pending", gate=True), False, AttemptPhase.WAITING, {"message": "waiting for admission by Kueue"}),
        (
            k8s_pod("Pending", conditions=UNSCHEDULED),
            False,
            AttemptPhase.WAITING,
            {"message": "admitted, not scheduled: 0/3 nodes"},
        ),
        (k8s_pod("Pending"), False, AttemptPhase.WAITING, {"message": "starting"}),
        (
            waiting_pod("main", "ContainerCreating", ""),
            False,
            AttemptPhase.WAITING,
            {"message": "starting", "started": False},
        ),
        (
            waiting_pod("main", "ImagePullBackOff", 'Back-off pulling image "reg/x@sha256:00"'),
            False,
            AttemptPhase.WAITING,
            {"message": 'not starting: container main ImagePullBackOff: Back-off pulling image "reg/x@sha256:00"'},
        ),
        (
            waiting_pod(
                "init", "CreateContainerConfigError", 'secret "simrun-executor.service-account-token" not found'
            ),
            False,
            AttemptPhase.WAITING,
            {
                "message": 'not starting: container init CreateContainerConfigError: secret "simrun-executor.service-account-token" not found'
            },
        ),
        (k8s_pod("Running"), False, AttemptPhase.RUNNING, {"started": True, "node": "node-a", "memory_gb": 6.0}),
        (k8s_pod("Running", conditions=PREEMPTED), False, AttemptPhase.RUNNING, {"preempted": True}),
        (k8s_pod("Succeeded", terminated={"exitCode": 0}), False, AttemptPhase.SUCCEEDED, {"exit_code": 0}),
        (k8s_pod("Succeeded", terminated={"exitCode": 0}), True, AttemptPhase.SUCCEEDED, {"exit_code": 0}),
        (
            k8s_pod("Failed", terminated={"exitCode": 137, "reason": "OOMKilled"}),
            False,
            AttemptPhase.ENDED,
            {"oom_killed": True, "exit_code": 137},
        ),
        (k8s_pod("Failed", terminated={"exitCode": 137}), False, AttemptPhase.ENDED, {"oom_killed": False}),
        (
            k8s_pod("Failed", terminated={"exitCode": 143}, conditions=PREEMPTED),
            True,
            AttemptPhase.ENDED,
            {"preempted": True},
        ),
        (k8s_pod("Running"), True, AttemptPhase.ENDED, {"exit_code": None, "message": "deleted"}),
        (k8s_pod("Pending", gate=True), True, AttemptPhase.ENDED, {"started": False}),
    ],
)
def test_attempt_from_pod(obj: dict, deleted: bool, phase: AttemptPhase, fields: dict) -> None:
    attempt = attempt_from_pod(obj, deleted)
    assert attempt.phase is phase and attempt.key == "wf.scan-w0(0)"
    assert {k: getattr(attempt, k) for k in fields} == fields


@pytest.mark.parametrize(
    ("node", "expected"),
    [
        ({"type": "Retry", "phase": "Failed"}, None),
        ({"type": "Pod", "name": "n", "phase": "Succeeded"}, (AttemptPhase.SUCCEEDED, 0, False, False)),
        (
            {
                "type": "Pod",
                "name": "n",
                "phase": "Failed",
                "message": "OOMKilled (exit code 137)",
                "outputs": {"exitCode": "137"},
            },
            (AttemptPhase.ENDED, 137, True, False),
        ),
        (
            {"type": "Pod", "name": "n", "phase": "Error", "message": "pod deleted"},
            (AttemptPhase.ENDED, None, False, True),
        ),
        (
            {"type": "Pod", "name": "n", "phase": "Failed", "outputs": {"exitCode": "143"}},
            (AttemptPhase.ENDED, 143, False, True),
        ),
        ({"type": "Pod", "name": "n", "phase": "Running"}, (AttemptPhase.RUNNING, None, False, False)),
    ],
)
def test_attempt_from_node(node: dict, expected: tuple | None) -> None:
    attempt = attempt_from_node(node)
    if expected is None:
        assert attempt is None
    else:
        assert attempt is not None
        assert (attempt.phase, attempt.exit_code, attempt.oom_killed, attempt.preempted) == expected


def ended(
    key: str,
    code: int | None,
    *,
    oom: bool = False,
    cgroup: int = 0,
    preempted: bool = False,
    memory: float | None = None,
) -> Attempt:
    return Attempt(key, AttemptPhase.ENDED, key, "node-a", code, oom, cgroup, preempted, memory, "", True)


RUNNING = Attempt("z", AttemptPhase.RUNNING, "z", "node-b", started=True)
WAITING = Attempt("z", AttemptPhase.WAITING, "z", message="waiting for admission by Kueue")
DONE = Attempt("z", AttemptPhase.SUCCEEDED, "z", "node-b", 0, started=True)


@pytest.mark.parametrize(
    ("attempts", "context", "phase", "kills", "sigkills", "preemptions", "memory", "message"),
    [
        ([], WorkerContext(), PodPhase.PENDING, 0, 0, 0, 4.0, "waiting for Argo to create its pod"),
        ([WAITING], WorkerContext(), PodPhase.PENDING, 0, 0, 0, 4.0, "waiting for admission by Kueue"),
        ([RUNNING], WorkerContext(), PodPhase.RUNNING, 0, 0, 0, 4.0, ""),
        ([DONE], WorkerContext(), PodPhase.SUCCEEDED, 0, 0, 0, 4.0, ""),
        ([ended("a", 137, oom=True)], WorkerContext(), PodPhase.PENDING, 1, 0, 0, 6.0, "killed for memory (oomkilled) with 4 GiB; retried with 6 GiB"),
        ([ended("a", 137, cgroup=1), RUNNING], WorkerContext(), PodPhase.RUNNING, 1, 0, 0, 6.0, ""),
        (
            [ended("a", 137, oom=True), ended("b", 137, oom=True, memory=6.0)],
            WorkerContext(),
            PodPhase.FAILED, 2, 0, 0, 6.0, "killed for memory twice; the retry had 6 GiB (3 GiB per process)",
        ),
        ([ended("a", 137)], WorkerContext(), PodPhase.PENDING, 0, 1, 0, 6.0, "killed by SIGKILL; retried with 6 GiB"),
        ([ended("a", 137), ended("b", 137)], WorkerContext(), PodPhase.FAILED, 0, 2, 0, 6.0, "killed by SIGKILL twice without evidence of the OOM killer"),
        ([ended("a", 143, preempted=True)], WorkerContext(), PodPhase.PENDING, 0, 0, 1, 4.0, "preempted by a higher priority; queued again"),
        ([ended("a", 137, preempted=True)], WorkerContext(), PodPhase.PENDING, 0, 0, 1, 4.0, "preempted by a higher priority; queued again"),
        ([ended("a", 137, oom=True), ended("b", 143, preempted=True)], WorkerContext(), PodPhase.PENDING, 1, 0, 1, 4.0, "preempted by a higher priority; queued again"),
        ([ended("a", 1)], WorkerContext(), PodPhase.FAILED, 0, 0, 0, 4.0, "failed with exit code 1"),
        ([ended("a", 2), DONE], WorkerContext(), PodPhase.FAILED, 0, 0, 0, 4.0, "failed with exit code 2"),
        ([WAITING], WorkerContext(stopped=True), PodPhase.FAILED, 0, 0, 0, 4.0, "stopped"),
        ([RUNNING], WorkerContext(stopped=True), PodPhase.RUNNING, 0, 0, 0, 4.0, ""),
        ([ended("a", 143)], WorkerContext(stopped=True), PodPhase.FAILED, 0, 0, 1, 4.0, "stopped"),
        ([], WorkerContext(workflow_message="refused: quota"), PodPhase.FAILED, 0, 0, 0, 4.0, "refused: quota"),
        (
            [ended("a", 143, preempted=True)],
            WorkerContext(retries_exhausted=True),
            PodPhase.FAILED, 0, 0, 1, 4.0,
            "preempted by a higher priority; queued again; Argo's retry limit (the preemption budget) is reached",
        ),
        (
            [ended("b", 137, oom=True, memory=6.0)],
            WorkerContext(history=PodHistory("scan", "w0", [MemoryKill(4.0, 4 / 3, "oomkilled")], attempts=3)),
            PodPhase.FAILED, 2, 0, 0, 6.0, "killed for memory twice; the retry had 6 GiB (3 GiB per process)",
        ),
        (
            [RUNNING],
            WorkerContext(history=PodHistory("scan", "w0", [MemoryKill(4.0, 4 / 3, "oomkilled")], attempts=3)),
            PodPhase.RUNNING, 1, 0, 0, 6.0, "",
        ),
    ],
)  # fmt: skip
def test_worker_status(attempts, context, phase, kills, sigkills, preemptions, memory, message) -> None:
    status = worker_status(SPEC, attempts, context)
    assert (status.phase, len(status.memory_kills), status.sigkills, status.preemptions) == (
        phase,
        kills,
        sigkills,
        preemptions,
    )
    assert status.memory_gb == memory
    assert status.message == message


def test_restored_attempts_are_a_floor_and_live_pods_win_over_workflow_nodes() -> None:
    history = PodHistory("scan", "w0", [], attempts=5)
    assert worker_status(SPEC, [RUNNING], WorkerContext(history=history)).attempts == 5
    node_view = ended("k", 143, preempted=True)
    pod_view = Attempt("k", AttemptPhase.RUNNING, "k", started=True)
    assert merge_attempts([pod_view], [node_view, ended("j", 143)]) == [ended("j", 143), pod_view]


@pytest.mark.parametrize(
    ("attempts", "context", "node"),
    [
        ([WAITING], WorkerContext(), None),  # not placed yet
        ([RUNNING], WorkerContext(), "node-b"),
        ([ended("a", 137), RUNNING], WorkerContext(), "node-b"),  # the retry's node, not the first attempt's
        ([ended("a", 137), DONE], WorkerContext(), "node-b"),
        ([ended("a", 1)], WorkerContext(), "node-a"),  # a failed pod still names where it ran
        ([ended("a", 137), ended("b", 137)], WorkerContext(), "node-a"),
        ([RUNNING, WAITING], WorkerContext(stopped=True), "node-b"),
    ],
)
def test_a_worker_names_the_node_of_its_latest_placed_attempt(attempts, context, node) -> None:
    assert worker_status(SPEC, attempts, context).node == node
