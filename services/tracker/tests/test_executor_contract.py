"""The executor port's contract: one suite every adapter passes (start, observe, preempt, memory-kill retry, stop,
reserve, restart), run against the local executor with real processes, against the scripted fake, and against the
kubernetes executor talking through the real `kubernetes` client to the fake API server with Argo and Kueue played
(`kubernetes_cluster`).

An adapter joins by giving a harness: how to make a pod it can control, make that pod exit or be killed for
memory, and restart the executor over the same store.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Protocol

import pytest
from fake_executor import FakeExecutor
from images import PODMAN
from kubernetes_cluster import ScriptedCluster
from simrun_core.errors import NotFound
from simrun_planner import Node
from simrun_runtime.layout import StoreLayout
from simrun_tracker.executor import (
    Executor,
    MemoryKill,
    PodHistory,
    PodPhase,
    PodRole,
    PodSpec,
    PodStatus,
    RunRecovery,
    RunSpec,
    TaskSpec,
)
from simrun_tracker.local import LocalExecutor
from simrun_tracker.local.confinement import PodConfinement

NODES = [Node("n1", cores=2, memory_gb=2.0), Node("n2", cores=1, memory_gb=2.0)]

# A local pod that obeys its control file: `say WORD` (a line to its log), `hold MIB` (takes and keeps that much
# memory), `exit N`, `sigkill` (by its own hand: no evidence of the OOM killer), or `oom` (takes memory past any
# test limit).
OBEY = """
import os, pathlib, signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
if len(sys.argv) > 1:
    control = pathlib.Path(sys.argv[1])
else:  # in a container: beside its log, in the task's folder (its only writable mount)
    env = os.environ
    control = pathlib.Path(env["SIMRUN_RUN_DIR"], "tasks", env["SIMRUN_TASK"], env["SIMRUN_WORKER"] + ".ctl")
held = []
while True:
    while not control.exists():
        time.sleep(0.02)
    order = control.read_text().split()
    control.unlink()
    if order[0] == "hold":
        held.append(bytearray(int(order[1]) << 20))
        for i in range(0, len(held[-1]), 4096):
            held[-1][i] = 1
        continue
    if order[0] != "say":
        break
    print(order[1], flush=True)
if order[0] == "exit":
    sys.exit(int(order[1]))
if order[0] == "sigkill":
    os.kill(os.getpid(), signal.SIGKILL)
chunks = []
while True:
    chunk = bytearray(16 * 1024 * 1024)
    for i in range(0, len(chunk), 4096):
        chunk[i] = 1
    chunks.append(chunk)
"""


class Harness(Protocol):
    executor: Executor

    def exit(self, spec: PodSpec, code: int) -> None: ...

    def kill_for_memory(self, spec: PodSpec) -> None: ...

    def say(self, spec: PodSpec, word: str) -> None: ...

    def hold(self, spec: PodSpec, mib: int) -> None:
        """Makes the pod take and keep `mib` MiB more memory, where the adapter runs real processes."""

    def sigkill(self, spec: PodSpec) -> None: ...

    def restart(self) -> Executor: ...


class LocalHarness:
    def __init__(self, box: Path) -> None:
        self.box = box
        self.executor: Executor = self._make()

    def _make(self) -> LocalExecutor:
        # The pods are test scripts reading control files beside the store; confinement has its own tests.
        return LocalExecutor(
            self.box, self._launch, list(NODES), cgroup_root=None, poll_s=0.02, confinement=PodConfinement("off")
        )

    def _launch(self, spec: PodSpec) -> list[str]:
        return [sys.executable, "-c", OBEY, str(self.box / f"{spec.pod_id}.ctl")]

    def _order(self, spec: PodSpec, order: str) -> Path:
        """Gives a pod an order whole: written aside and renamed, since the pod reads its control file as soon as
        it exists (written in place, it could read it empty and die of that)."""
        control = self.box / f"{spec.pod_id}.ctl"
        aside = control.with_suffix(".ctl-new")
        aside.write_text(order)
        aside.rename(control)
        return control

    def exit(self, spec: PodSpec, code: int) -> None:
        self._order(spec, f"exit {code}")

    def kill_for_memory(self, spec: PodSpec) -> None:
        self._order(spec, "oom")

    def sigkill(self, spec: PodSpec) -> None:
        self._order(spec, "sigkill")

    def say(self, spec: PodSpec, word: str) -> None:
        control = self._order(spec, f"say {word}")
        eventually(lambda: not control.exists())  # read: the next order may follow

    def hold(self, spec: PodSpec, mib: int) -> None:
        control = self._order(spec, f"hold {mib}")
        eventually(lambda: not control.exists())

    def restart(self) -> Executor:
        self.executor.close()
        for control in self.box.glob("*.ctl"):
            control.unlink()
        self.executor = self._make()
        return self.executor


class ContainersHarness(LocalHarness):
    """Pods as containers of an image whose runtime entry point is the obeying script (the image tests' base)."""

    def __init__(self, box: Path) -> None:
        from images import ensure_base_image, image_with_files

        self.image = image_with_files(
            ensure_base_image(),
            {
                "/usr/lib/python3/dist-packages/simrun_runtime/__init__.py": "",
                "/usr/lib/python3/dist-packages/simrun_runtime/execute.py": OBEY,
            },
            "simrun-test-obey",
        )
        super().__init__(box)

    def _make(self) -> LocalExecutor:
        from simrun_core.config import ContainersConfig
        from simrun_tracker.containers import ContainerExecutor

        settings = ContainersConfig(python="python3")  # Debian's base has no `python`
        return ContainerExecutor(self.box, lambda spec: self.image, settings, nodes=list(NODES), poll_s=0.02)

    def _order(self, spec: PodSpec, order: str) -> Path:
        control = self.box / "runs" / spec.run_id / "tasks" / spec.task_id / f"{spec.worker}.ctl"
        control.parent.mkdir(parents=True, exist_ok=True)
        aside = control.with_suffix(".ctl-new")
        aside.write_text(order)
        aside.rename(control)
        return control

    def sigkill(self, spec: PodSpec) -> None:
        """A container's first process ignores a SIGKILL of its own (it is its namespace's init): from outside."""
        status = observed(self.executor, spec)
        name = f"simrun-{spec.pod_id.replace('.', '-')}-{status.attempts}"
        # A pod is running from its admission; its container exists a moment later.
        eventually(
            lambda: subprocess.run([*PODMAN, "kill", "--signal", "KILL", name], capture_output=True).returncode == 0
        )

    def restart(self) -> Executor:
        self.executor.close()
        for control in self.box.glob("runs/*/tasks/*/*.ctl"):
            control.unlink()
        self.executor = self._make()
        return self.executor


class FakeHarness:
    def __init__(self) -> None:
        self.executor: Executor = FakeExecutor(list(NODES))

    def exit(self, spec: PodSpec, code: int) -> None:
        assert isinstance(self.executor, FakeExecutor)
        self.executor.exit(spec.run_id, spec.task_id, spec.worker, code)

    def kill_for_memory(self, spec: PodSpec) -> None:
        assert isinstance(self.executor, FakeExecutor)
        self.executor.kill_for_memory(spec.run_id, spec.task_id, spec.worker)

    def sigkill(self, spec: PodSpec) -> None:
        assert isinstance(self.executor, FakeExecutor)
        self.executor.exit(spec.run_id, spec.task_id, spec.worker, 137)

    def say(self, spec: PodSpec, word: str) -> None:
        assert isinstance(self.executor, FakeExecutor)
        self.executor.write_log(spec.run_id, spec.task_id, spec.worker, f"{word}\n")

    def hold(self, spec: PodSpec, mib: int) -> None:
        """The fake's pods are no processes: nothing to take, and nothing measured."""

    def restart(self) -> Executor:
        self.executor = FakeExecutor(list(NODES))
        return self.executor


IMAGE = "registry.simrun:5000/simrun/env@sha256:" + "ef" * 32


class RunsOfPods:
    """The kubernetes executor orders a run's tasks itself: pods handed over together are one run for it."""

    def __init__(self, executor: Executor, cluster: ScriptedCluster) -> None:
        self._executor = executor
        self._cluster = cluster

    def start_pods(self, pods: list[PodSpec]) -> None:
        for run_id in dict.fromkeys(p.run_id for p in pods):
            tasks: dict[str, list[PodSpec]] = {}
            for pod in pods:
                if pod.run_id == run_id:
                    tasks.setdefault(pod.task_id, []).append(pod)
            self._executor.start_run(RunSpec(run_id, [TaskSpec(t, specs) for t, specs in tasks.items()]))

    def close(self) -> None:
        self._executor.close()
        self._cluster.close()

    def __getattr__(self, name: str) -> object:
        return getattr(self._executor, name)


class KubernetesHarness:
    def __init__(self, box: Path) -> None:
        from simrun_tracker.kubernetes.adapter import KubernetesExecutor
        from simrun_tracker.kubernetes.config import KubernetesSettings

        self.cluster = ScriptedCluster(list(NODES))
        settings = KubernetesSettings(default_image=IMAGE, watch_timeout_s=5, backoff_max_s=0.5)
        adapter = KubernetesExecutor(settings, StoreLayout(box), client=self.cluster.api.client())
        self.executor: Executor = RunsOfPods(adapter, self.cluster)  # type: ignore[assignment]

    def exit(self, spec: PodSpec, code: int) -> None:
        self.cluster.exit(spec.run_id, spec.task_id, spec.worker, code)

    def kill_for_memory(self, spec: PodSpec) -> None:
        self.cluster.exit(spec.run_id, spec.task_id, spec.worker, 137, "OOMKilled")

    def sigkill(self, spec: PodSpec) -> None:
        self.cluster.exit(spec.run_id, spec.task_id, spec.worker, 137)

    def say(self, spec: PodSpec, word: str) -> None:
        with self.cluster.api.cluster.cond:
            name = self.cluster._running(spec.run_id, spec.task_id, spec.worker)
        self.cluster.argo.write_log(name, f"{word}\n".encode())

    def hold(self, spec: PodSpec, mib: int) -> None:
        """The scripted cluster's pods are no processes, and the adapter reads no pod's memory from the API."""

    def restart(self) -> Executor:
        pytest.skip(
            "a cluster adapter's close() stops nothing: the pod keeps running on its node with its attempt "
            "(test_kubernetes_adapter covers its restart)"
        )


@pytest.fixture(params=["local", "containers", "fake", "kubernetes"])
def harness(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Harness]:
    made: Harness
    if request.param == "local":
        made = LocalHarness(tmp_path)
    elif request.param == "containers":
        made = ContainersHarness(tmp_path)
    elif request.param == "fake":
        made = FakeHarness()
    else:
        made = KubernetesHarness(tmp_path)
    yield made
    made.executor.close()


def spec(
    run: str,
    task: str,
    worker: str = "w0",
    *,
    priority: str = "simrun-standard-base",
    cores: int = 1,
    memory_gb: float = 0.25,
    retry_memory_gb: float = 0.375,
) -> PodSpec:
    return PodSpec(
        run_id=run,
        task_id=task,
        worker=worker,
        role=PodRole.EXECUTE,
        environment_id="default",
        contract={"SIMRUN_RUN_DIR": f"runs/{run}", "SIMRUN_TASK": task, "SIMRUN_WORKER": worker},
        cores=cores,
        memory_gb=memory_gb,
        processes=1,
        retry_memory_gb=retry_memory_gb,
        priority_class=priority,
        grace_s=2.0,
    )


def observed(executor: Executor, pod: PodSpec) -> PodStatus:
    return next(p for p in executor.pods(pod.run_id) if p.spec.pod_id == pod.pod_id)


def eventually(check: Callable[[], bool], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        time.sleep(0.02)


def phase(executor: Executor, pod: PodSpec, want: PodPhase, attempts: int | None = None) -> Callable[[], bool]:
    def check() -> bool:
        status = observed(executor, pod)
        return status.phase is want and (attempts is None or status.attempts == attempts)

    return check


def test_pods_start_are_observed_in_order_and_succeed_or_fail_by_their_exit(harness: Harness) -> None:
    executor = harness.executor
    woken: list[str] = []
    executor.subscribe(woken.append)
    ok, bad = spec("r1", "ok"), spec("r1", "bad")
    executor.start_pods([ok, bad])
    executor.start_pods([ok])  # a pod known already is left as it is
    eventually(phase(executor, ok, PodPhase.RUNNING))
    eventually(phase(executor, bad, PodPhase.RUNNING))
    assert [p.spec.pod_id for p in executor.pods("r1")] == [ok.pod_id, bad.pod_id]
    harness.exit(ok, 0)
    harness.exit(bad, 3)
    eventually(phase(executor, ok, PodPhase.SUCCEEDED))
    eventually(phase(executor, bad, PodPhase.FAILED))
    assert (observed(executor, ok).exit_code, observed(executor, bad).exit_code) == (0, 3)
    assert observed(executor, ok).attempts == 1
    assert "r1" in woken
    assert executor.pods("unknown") == []


def test_a_higher_priority_takes_back_extra_workers_and_keeps_the_coordinator(harness: Harness) -> None:
    executor = harness.executor
    coordinator = spec("agent-run", "t", "w0", priority="simrun-agent-base")
    extras = [spec("agent-run", "t", f"w{i}", priority="simrun-agent-extra") for i in (1, 2)]
    executor.start_pods([coordinator, *extras])
    for pod in (coordinator, *extras):
        eventually(phase(executor, pod, PodPhase.RUNNING))
    owner = spec("owner-run", "t", "w0", priority="simrun-owner-base")
    executor.start_pods([owner])
    eventually(phase(executor, owner, PodPhase.RUNNING))
    statuses = {p.spec.worker: p for p in executor.pods("agent-run")}
    assert statuses["w0"].phase is PodPhase.RUNNING and statuses["w0"].preemptions == 0
    taken = [w for w in ("w1", "w2") if statuses[w].preemptions == 1]
    assert len(taken) == 1 and statuses[taken[0]].phase is PodPhase.PENDING
    harness.exit(owner, 0)
    eventually(phase(executor, extras[int(taken[0][1]) - 1], PodPhase.RUNNING, attempts=2))


def test_a_kill_for_memory_is_retried_once_with_the_retry_memory_and_a_second_fails(harness: Harness) -> None:
    executor = harness.executor
    pod = spec("r1", "t")
    executor.start_pods([pod])
    eventually(phase(executor, pod, PodPhase.RUNNING))
    harness.kill_for_memory(pod)
    eventually(phase(executor, pod, PodPhase.RUNNING, attempts=2))
    retried = observed(executor, pod)
    assert (retried.memory_gb, len(retried.memory_kills), retried.memory_kills[0].memory_gb) == (0.375, 1, 0.25)
    harness.kill_for_memory(pod)
    eventually(phase(executor, pod, PodPhase.FAILED))
    failed = observed(executor, pod)
    assert [k.memory_gb for k in failed.memory_kills] == [0.25, 0.375]
    assert "killed for memory twice" in failed.message and "0.375 GiB" in failed.message


def test_stopping_a_run_fails_its_pods_and_no_other(harness: Harness) -> None:
    executor = harness.executor
    mine, other = spec("r1", "t"), spec("r2", "t")
    executor.start_pods([mine, other])
    eventually(phase(executor, mine, PodPhase.RUNNING))
    eventually(phase(executor, other, PodPhase.RUNNING))
    executor.stop_pods("r1")
    eventually(phase(executor, mine, PodPhase.FAILED))
    assert observed(executor, mine).message == "stopped"
    assert observed(executor, other).phase is PodPhase.RUNNING
    harness.exit(other, 0)
    eventually(phase(executor, other, PodPhase.SUCCEEDED))


def test_a_forgotten_run_is_dropped_once_its_pods_have_stopped_and_its_logs_stay(harness: Harness) -> None:
    executor = harness.executor
    mine, other = spec("r1", "t"), spec("r2", "t")
    executor.start_pods([mine, other])
    eventually(phase(executor, mine, PodPhase.RUNNING))
    eventually(phase(executor, other, PodPhase.RUNNING))
    executor.stop_pods("r1")
    executor.forget("r1")  # the tracker ends the run at once; its pod may still be stopping
    eventually(lambda: executor.pods("r1") == [])
    assert observed(executor, other).phase is PodPhase.RUNNING
    harness.exit(other, 0)
    eventually(phase(executor, other, PodPhase.SUCCEEDED))
    executor.forget("never-seen")  # a run the adapter does not know is no error
    executor.forget("r2")
    eventually(lambda: executor.pods("r2") == [])


def test_a_reserved_node_takes_only_its_run_s_pods(harness: Harness) -> None:
    executor = harness.executor
    executor.reserve("n2", "r1")
    assert {n.name: n.reserved_by for n in executor.nodes()} == {"n1": None, "n2": "r1"}
    others = [spec("r2", f"t{i}") for i in range(3)]
    executor.start_pods(others)
    eventually(lambda: sum(observed(executor, p).phase is PodPhase.RUNNING for p in others) == 2)
    assert {observed(executor, p).node for p in others if observed(executor, p).node} == {"n1"}
    mine = spec("r1", "t")
    executor.start_pods([mine])
    eventually(phase(executor, mine, PodPhase.RUNNING))
    assert observed(executor, mine).node == "n2"
    executor.release("r1")
    assert all(n.reserved_by is None for n in executor.nodes())


def test_a_restarted_executor_takes_back_a_run_s_reservation_memory_kills_and_attempts(harness: Harness) -> None:
    pod = spec("r1", "t")
    harness.executor.start_pods([pod])
    eventually(phase(harness.executor, pod, PodPhase.RUNNING))
    harness.kill_for_memory(pod)
    eventually(phase(harness.executor, pod, PodPhase.RUNNING, attempts=2))
    kills = observed(harness.executor, pod).memory_kills
    executor = harness.restart()
    executor.restore(
        RunRecovery(
            "r1", "n2", [PodHistory("t", "w0", [MemoryKill(k.memory_gb, k.per_worker_gb, "x") for k in kills], 2)]
        )
    )
    assert {n.name: n.reserved_by for n in executor.nodes()}["n2"] == "r1"
    executor.start_pods([pod])
    eventually(phase(executor, pod, PodPhase.RUNNING, attempts=3))
    again = observed(executor, pod)
    assert (again.memory_gb, again.node) == (0.375, "n2")
    harness.kill_for_memory(pod)
    eventually(phase(executor, pod, PodPhase.FAILED))
    assert "killed for memory twice" in observed(executor, pod).message


def test_a_pod_s_lines_reach_its_logs_and_following_them_ends_with_its_task(harness: Harness) -> None:
    executor = harness.executor
    pod = spec("r1", "t")
    executor.start_pods([pod])
    eventually(phase(executor, pod, PodPhase.RUNNING))
    harness.say(pod, "hello")
    lines: list[tuple[str, str]] = []
    follower = threading.Thread(target=lambda: lines.extend(executor.logs("r1", "t", "w0", follow=True)))
    follower.start()
    eventually(lambda: "hello\n" in "".join(text for _, text in lines))
    harness.say(pod, "again")
    eventually(lambda: "again\n" in "".join(text for _, text in lines))
    assert follower.is_alive(), "following stopped while the pod runs"
    harness.exit(pod, 0)
    follower.join(timeout=10)
    assert not follower.is_alive(), "following did not end with the task's pods"
    assert all(name.startswith("w0.") for name, _ in lines)
    again = "".join(text for _, text in executor.logs("r1", "t", "", follow=False))
    assert "hello\nagain\n" in again


def test_a_pod_s_measured_memory_is_what_it_held_or_unknown(harness: Harness) -> None:
    """An adapter measures a pod's anonymous memory itself (it bounds what the pod's report may claim to the
    learner) or says it measures nothing (None); a measurement is the most the pod held, kept past its end."""
    executor = harness.executor
    pod = spec("r1", "t", memory_gb=0.5)
    executor.start_pods([pod])
    eventually(phase(executor, pod, PodPhase.RUNNING))
    harness.hold(pod, 96)
    if observed(executor, pod).peak_memory_gb is not None:
        eventually(lambda: (observed(executor, pod).peak_memory_gb or 0.0) >= 96 / 1024)
    harness.exit(pod, 0)
    eventually(phase(executor, pod, PodPhase.SUCCEEDED))
    peak = observed(executor, pod).peak_memory_gb
    assert peak is None or 96 / 1024 <= peak < 0.5, peak


def test_an_adapter_that_measures_tells_its_listeners_as_a_running_pod_s_peak_grows(harness: Harness) -> None:
    """The tracker keeps a running pod's measured memory in its run's record when told of a change, so the pages
    show it while the pod runs; the telling is bounded (a quarter's growth, and 64 MiB), not one per sample."""
    executor = harness.executor
    told: list[str] = []
    executor.subscribe(told.append)
    pod = spec("r1", "t", memory_gb=0.5)
    executor.start_pods([pod])
    eventually(phase(executor, pod, PodPhase.RUNNING))
    if observed(executor, pod).peak_memory_gb is None:
        pytest.skip("this adapter measures nothing")
    eventually(lambda: (observed(executor, pod).peak_memory_gb or 0.0) > 0)
    before = len(told)
    harness.hold(pod, 160)  # more than the least growth told (64 MiB) above what the pod held at its start
    eventually(lambda: (observed(executor, pod).peak_memory_gb or 0.0) >= 160 / 1024)
    eventually(lambda: len(told) > before)  # no phase changed: the growing peak was told
    time.sleep(1.0)  # five samples of an unchanged peak
    settled = len(told)
    time.sleep(1.0)
    assert len(told) == settled, "an unchanged peak was told again"
    harness.exit(pod, 0)
    eventually(phase(executor, pod, PodPhase.SUCCEEDED))


def test_a_run_restored_without_its_node_keeps_its_pods_memory_kills_and_attempts(harness: Harness) -> None:
    # The node it reserved is gone from the config: the reservation cannot be taken again, its history still is.
    if isinstance(harness, KubernetesHarness):
        pytest.skip("a cluster adapter restores a run by adopting its Workflow, whose status holds the attempts")
    executor = harness.executor
    history = [PodHistory("t", "w0", [MemoryKill(0.25, 0.25, "recorded")], 1)]
    with contextlib.suppress(NotFound):
        executor.restore(RunRecovery("r1", "gone", history))
    pod = spec("r1", "t")
    executor.start_pods([pod])
    eventually(phase(executor, pod, PodPhase.RUNNING, attempts=2))
    assert observed(executor, pod).memory_gb == 0.375 and len(observed(executor, pod).memory_kills) == 1


def test_a_restarted_executor_takes_back_a_sigkill_so_a_second_one_fails_the_pod(harness: Harness) -> None:
    pod = spec("r1", "t")
    harness.executor.start_pods([pod])
    eventually(phase(harness.executor, pod, PodPhase.RUNNING))
    harness.sigkill(pod)
    eventually(phase(harness.executor, pod, PodPhase.RUNNING, attempts=2))
    first = observed(harness.executor, pod)
    assert (first.sigkills, first.memory_kills, first.memory_gb) == (1, [], 0.375)
    executor = harness.restart()
    executor.restore(RunRecovery("r1", None, [PodHistory("t", "w0", [], 2, sigkills=1)]))
    executor.start_pods([pod])
    eventually(phase(executor, pod, PodPhase.RUNNING, attempts=3))
    assert observed(executor, pod).memory_gb == 0.375
    harness.sigkill(pod)
    eventually(phase(executor, pod, PodPhase.FAILED))
    assert "not retried again" in observed(executor, pod).message
