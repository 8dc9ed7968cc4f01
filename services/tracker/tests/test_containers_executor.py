"""What the containers executor adds to the contract suite: pods it cannot run fail in one line that says why, the
containers of an executor that died are removed when another starts, and it refuses to run without cgroups."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from images import PODMAN, ULIMITS, ensure_base_image
from simrun_core.config import ContainersConfig
from simrun_core.errors import FailedPrecondition
from simrun_planner import Node
from simrun_tracker.containers import EXECUTOR_LABEL, ContainerExecutor
from simrun_tracker.executor import PodPhase, PodRole, PodSpec, PodStatus

NODES = [Node("n1", cores=1, memory_gb=1.0)]


def spec(run: str = "r1") -> PodSpec:
    return PodSpec(
        run_id=run,
        task_id="t",
        worker="w0",
        role=PodRole.EXECUTE,
        environment_id="e",
        contract={"SIMRUN_RUN_DIR": f"runs/{run}", "SIMRUN_TASK": "t", "SIMRUN_WORKER": "w0"},
        cores=1,
        memory_gb=0.25,
        processes=1,
        retry_memory_gb=0.375,
        priority_class="simrun-standard-base",
        grace_s=1.0,
    )


def final(executor: ContainerExecutor, run: str, timeout_s: float = 60) -> PodStatus:
    deadline = time.monotonic() + timeout_s
    while not (status := executor.pods(run)[0]).phase.final:
        assert time.monotonic() < deadline, status
        time.sleep(0.05)
    return status


@pytest.fixture
def executor_of(tmp_path: Path) -> Iterator:
    made: list[ContainerExecutor] = []

    def make(image: str) -> ContainerExecutor:
        ensure_base_image()  # skips without podman, buildah, runc and root
        executor = ContainerExecutor(tmp_path, lambda spec: image, ContainersConfig(), nodes=list(NODES), poll_s=0.02)
        made.append(executor)
        return executor

    yield make
    for executor in made:
        executor.close()


def test_a_pod_whose_image_cannot_be_pulled_fails_naming_podman(executor_of) -> None:
    executor = executor_of("127.0.0.1:9/simrun/missing@sha256:" + "0" * 64)
    executor.start_pods([spec()])
    status = final(executor, "r1")
    assert status.phase is PodPhase.FAILED and status.exit_code == 125
    assert status.message.startswith("podman could not run the container (exit code 125"), status.message
    log = (executor._store.run("r1").task("t").logs / "w0.log").read_text()
    assert "127.0.0.1:9" in log, "podman's reason is in the pod's log"


def test_a_pod_without_an_image_fails_saying_which_setting_gives_one(executor_of) -> None:
    executor = executor_of("")
    executor.start_pods([spec()])
    status = final(executor, "r1")
    assert status.phase is PodPhase.FAILED and "environments.kind: image" in status.message, status.message


def test_a_pod_with_an_image_not_by_digest_fails_before_podman_runs(executor_of) -> None:
    executor = executor_of("localhost/simrun-test-base:latest")
    executor.start_pods([spec()])
    status = final(executor, "r1")
    assert status.phase is PodPhase.FAILED and "not named by digest" in status.message, status.message


def test_the_containers_of_an_executor_that_died_are_removed_when_another_starts(executor_of) -> None:
    base = ensure_base_image()
    name = "simrun-test-orphan"
    subprocess.run([*PODMAN, "rm", "--force", name], capture_output=True)
    started = subprocess.run(
        [
            *PODMAN,
            "run",
            "--detach",
            "--name",
            name,
            *ULIMITS,
            "--label",
            f"{EXECUTOR_LABEL}=999999999-deadbeef",
            base,
            "sleep",
            "300",
        ],
        capture_output=True,
        text=True,
    )
    assert started.returncode == 0, started.stderr
    alive = subprocess.run(
        [*PODMAN, "run", "--detach", "--rm", *ULIMITS, "--label", f"{EXECUTOR_LABEL}=1-0000aaaa", base, "sleep", "300"],
        capture_output=True,
        text=True,
    )
    try:
        executor_of("")  # pid 1 is alive: its container stays
        assert subprocess.run([*PODMAN, "container", "exists", name]).returncode == 1, "the orphan is gone"
        assert subprocess.run([*PODMAN, "container", "exists", alive.stdout.strip()]).returncode == 0
    finally:
        subprocess.run([*PODMAN, "rm", "--force", "--time", "0", name, alive.stdout.strip()], capture_output=True)


def test_without_memory_cgroups_it_refuses_to_start_saying_why(tmp_path: Path) -> None:
    ensure_base_image()
    with pytest.raises(FailedPrecondition, match="needs memory cgroups"):
        ContainerExecutor(tmp_path, lambda spec: "", ContainersConfig(), nodes=list(NODES), cgroup_root=None)
