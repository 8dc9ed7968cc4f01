"""Tests of the local executor with real processes: admission, priorities, preemption, reservations, exits, memory."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from simrun_core.config import ServerConfig
from simrun_core.errors import FailedPrecondition, InvalidArgument, NotFound
from simrun_planner import Node
from simrun_tracker.executor import PodPhase, PodRole, PodSpec, PodStatus
from simrun_tracker.local import LocalExecutor, configured_nodes, default_nodes
from simrun_tracker.local.confinement import PodConfinement
from simrun_tracker.local.memory import detect_cgroup_root

# A pod that counts its starts, waits for its go file, and exits with its code (143 on SIGTERM).
WAIT = """
import pathlib, signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
box, name, code = pathlib.Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
with open(box / (name + ".starts"), "a") as f:
    f.write("start\\n")
print("hello from", name, flush=True)
while not (box / (name + ".go")).exists():
    time.sleep(0.02)
sys.exit(code)
"""

# A pod that takes MiB of anonymous memory page by page, holds it a while, and exits 0.
ALLOCATE = """
import sys, time
chunks = []
for _ in range(int(sys.argv[1])):
    chunk = bytearray(1024 * 1024)
    for i in range(0, len(chunk), 4096):
        chunk[i] = 1
    chunks.append(chunk)
print("allocated", flush=True)
time.sleep(float(sys.argv[2]))
"""

HAS_CGROUPS = detect_cgroup_root() is not None


class Pods:
    """Specs of test pods in one directory, and the files through which the test controls them."""

    def __init__(self, box: Path) -> None:
        self.box = box
        self.commands: dict[str, list[str]] = {}

    def launch(self, spec: PodSpec) -> list[str]:
        """The launcher the executor is given: the command each test pod was made with."""
        return self.commands[spec.pod_id]

    def log(self, spec: PodSpec) -> Path:
        """Where the executor writes a pod's log: `tasks/<task>/logs/<worker>.log` of the store (the box)."""
        return self.box / "runs" / spec.run_id / "tasks" / spec.task_id / "logs" / f"{spec.worker}.log"

    def spec(
        self,
        name: str,
        *,
        code: int = 0,
        run: str = "r1",
        worker: str = "w0",
        cores: int = 1,
        memory_gb: float = 0.25,
        retry_memory_gb: float = 0.375,
        priority: str = "simrun-standard-base",
        grace_s: float = 5.0,
        processes: int = 1,
        command: list[str] | None = None,
    ) -> PodSpec:
        spec = PodSpec(
            run_id=run,
            task_id=name,
            worker=worker,
            role=PodRole.EXECUTE,
            environment_id="test",
            contract={"SIMRUN_TASK": name},
            cores=cores,
            memory_gb=memory_gb,
            processes=processes,
            retry_memory_gb=retry_memory_gb,
            priority_class=priority,
            grace_s=grace_s,
        )
        self.commands[spec.pod_id] = command or [sys.executable, "-c", WAIT, str(self.box), name, str(code)]
        return spec

    def go(self, name: str) -> None:
        (self.box / f"{name}.go").touch()

    def starts(self, name: str) -> int:
        path = self.box / f"{name}.starts"
        return len(path.read_text().splitlines()) if path.exists() else 0


def stubborn_command(pods: Pods) -> list[str]:
    """A pod that ignores SIGTERM (so only the SIGKILL after its grace ends it) and marks its start."""
    return [
        sys.executable,
        "-c",
        "import signal, sys, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "open(sys.argv[1], 'w').write('x\\n')\ntime.sleep(60)",
        str(pods.box / "stubborn.starts"),
    ]


def status(executor: LocalExecutor, spec: PodSpec) -> PodStatus:
    return next(p for p in executor.pods(spec.run_id) if p.spec.pod_id == spec.pod_id)


def wait_for(predicate: Callable[[], bool], timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        time.sleep(0.02)


def phase_is(executor: LocalExecutor, spec: PodSpec, phase: PodPhase) -> Callable[[], bool]:
    return lambda: status(executor, spec).phase is phase


def started(executor: LocalExecutor, pods: Pods, spec: PodSpec, times: int = 1) -> Callable[[], bool]:
    return lambda: pods.starts(spec.task_id) >= times and status(executor, spec).phase is PodPhase.RUNNING


@pytest.fixture
def pods(tmp_path: Path) -> Pods:
    return Pods(tmp_path)


@pytest.fixture
def make_executor(pods: Pods) -> Iterator[Callable[..., LocalExecutor]]:
    made: list[LocalExecutor] = []

    def make(nodes: list[Node] | None = None, **kw: object) -> LocalExecutor:
        kw.setdefault("cgroup_root", None)
        # These pods are test scripts writing beside the store; confinement has its own tests (test_confinement).
        kw.setdefault("confinement", PodConfinement("off"))
        nodes = nodes or [Node("n1", cores=1, memory_gb=1.0)]
        executor = LocalExecutor(pods.box, pods.launch, nodes, poll_s=0.02, **kw)  # type: ignore[arg-type]
        made.append(executor)
        return executor

    yield make
    for executor in made:
        executor.close()


def test_a_pod_runs_with_its_environment_and_logs_every_attempt(make_executor, pods: Pods) -> None:
    executor = make_executor()
    ok = pods.spec("ok")
    executor.start_pods([ok])
    wait_for(started(executor, pods, ok))
    pods.go("ok")
    wait_for(phase_is(executor, ok, PodPhase.SUCCEEDED))
    done = status(executor, ok)
    assert (done.node, done.attempts, done.exit_code, done.memory_gb) == ("n1", 1, 0, 0.25)
    log = pods.log(ok).read_text().splitlines()
    assert log[0].startswith("=== simrun: attempt 1 of pod r1.ok.w0 on node n1, memory limit 0.25 GiB")
    assert "hello from ok" in log
    # A pod id that is known already is left as it is.
    executor.start_pods([ok])
    assert [p.attempts for p in executor.pods("r1")] == [1]


def test_exit_codes_one_fails_and_143_is_retried(make_executor, pods: Pods) -> None:
    executor = make_executor([Node("n1", cores=2, memory_gb=1.0)])
    failing = pods.spec("failing", code=1)
    stopped = pods.spec("stopped", code=143)
    executor.start_pods([failing, stopped])
    wait_for(lambda: pods.starts("failing") == 1 and pods.starts("stopped") == 1)
    pods.go("failing")
    pods.go("stopped")
    wait_for(phase_is(executor, failing, PodPhase.FAILED))
    assert status(executor, failing).message == "failed with exit code 1"
    assert status(executor, failing).attempts == 1
    # 143 comes back for ever while the go file says 143; it is queued again each time, not failed.
    wait_for(lambda: status(executor, stopped).attempts >= 3)
    assert status(executor, stopped).phase is not PodPhase.FAILED
    assert status(executor, stopped).preemptions >= 2
    executor.stop_pods("r1")
    wait_for(phase_is(executor, stopped, PodPhase.FAILED))
    assert status(executor, stopped).message == "stopped"


def test_a_pod_waits_for_cores_and_for_memory(make_executor, pods: Pods) -> None:
    executor = make_executor([Node("n1", cores=2, memory_gb=1.0)])
    wide = pods.spec("wide", cores=2, memory_gb=0.25)
    narrow = pods.spec("narrow", cores=1, memory_gb=0.25)
    executor.start_pods([wide, narrow])
    wait_for(started(executor, pods, wide))
    time.sleep(0.3)
    assert status(executor, narrow).phase is PodPhase.PENDING
    pods.go("wide")
    wait_for(started(executor, pods, narrow))

    big = pods.spec("big", memory_gb=0.75)
    small = pods.spec("small", memory_gb=0.5)
    executor.start_pods([big, small])
    wait_for(started(executor, pods, big))
    time.sleep(0.3)
    assert status(executor, small).phase is PodPhase.PENDING
    pods.go("big")
    wait_for(started(executor, pods, small))
    pods.go("narrow")
    pods.go("small")
    wait_for(lambda: all(p.phase is PodPhase.SUCCEEDED for p in executor.pods("r1")))


def test_admission_follows_priority_then_arrival(make_executor, pods: Pods) -> None:
    executor = make_executor()
    blocker = pods.spec("blocker", priority="simrun-owner-base")
    executor.start_pods([blocker])
    wait_for(started(executor, pods, blocker))
    low = pods.spec("low", run="r2", priority="simrun-agent-base")
    first = pods.spec("first", run="r3", priority="simrun-standard-base")
    second = pods.spec("second", run="r4", priority="simrun-standard-base")
    executor.start_pods([low])
    executor.start_pods([first])
    executor.start_pods([second])
    expected = [first, second, low]
    for position, spec in enumerate(expected):
        if spec is first:
            pods.go("blocker")
        wait_for(started(executor, pods, spec))
        # Whatever comes later in the expected order has not started yet: the order is the admission's.
        assert [pods.starts(s.task_id) for s in expected[position + 1 :]] == [0] * (len(expected) - position - 1)
        pods.go(spec.task_id)
    assert status(executor, blocker).preemptions == 0


def test_a_higher_priority_preempts_with_sigterm_and_the_victim_runs_again(make_executor, pods: Pods) -> None:
    executor = make_executor()
    victim = pods.spec("victim", run="r1", worker="w1", priority="simrun-agent-extra")
    executor.start_pods([victim])
    wait_for(started(executor, pods, victim))
    high = pods.spec("high", run="r2", priority="simrun-agent-base")
    executor.start_pods([high])
    wait_for(started(executor, pods, high))
    preempted = status(executor, victim)
    assert (preempted.phase, preempted.preemptions, preempted.exit_code) == (PodPhase.PENDING, 1, 143)
    assert "preempted" in preempted.message
    pods.go("high")
    pods.go("victim")
    wait_for(phase_is(executor, victim, PodPhase.SUCCEEDED))
    assert status(executor, victim).attempts == 2
    assert pods.starts("victim") == 2
    assert status(executor, high).phase is PodPhase.SUCCEEDED
    assert "exited with exit code 143: preempted by a higher priority; queued again" in pods.log(victim).read_text()


def test_equal_priorities_never_preempt(make_executor, pods: Pods) -> None:
    executor = make_executor()
    running = pods.spec("running", run="r1", worker="w1", priority="simrun-standard-extra")
    executor.start_pods([running])
    wait_for(started(executor, pods, running))
    waiting = pods.spec("waiting", run="r2", worker="w1", priority="simrun-standard-extra")
    executor.start_pods([waiting])
    time.sleep(0.5)
    assert status(executor, running).preemptions == 0
    assert status(executor, running).phase is PodPhase.RUNNING
    assert status(executor, waiting).phase is PodPhase.PENDING
    pods.go("running")
    wait_for(started(executor, pods, waiting))


def test_a_new_run_takes_back_extra_workers_and_every_run_keeps_its_coordinator(make_executor, pods: Pods) -> None:
    executor = make_executor([Node("n1", cores=2, memory_gb=1.0)])
    a_w0 = pods.spec("a0", run="ra", worker="w0", priority="simrun-standard-base")
    a_w1 = pods.spec("a1", run="ra", worker="w1", priority="simrun-standard-extra")
    executor.start_pods([a_w0, a_w1])
    wait_for(lambda: started(executor, pods, a_w0)() and started(executor, pods, a_w1)())
    b_w0 = pods.spec("b0", run="rb", worker="w0", priority="simrun-standard-base")
    b_w1 = pods.spec("b1", run="rb", worker="w1", priority="simrun-standard-extra")
    executor.start_pods([b_w0, b_w1])
    wait_for(started(executor, pods, b_w0))
    time.sleep(0.3)
    assert status(executor, a_w0).phase is PodPhase.RUNNING
    assert status(executor, a_w0).preemptions == 0
    assert (status(executor, a_w1).phase, status(executor, a_w1).preemptions) == (PodPhase.PENDING, 1)
    # The extra workers of both runs are of one priority: they wait for each other, first in first out.
    assert status(executor, b_w1).phase is PodPhase.PENDING
    pods.go("a0")
    wait_for(started(executor, pods, b_w1))
    assert status(executor, a_w1).phase is PodPhase.PENDING


def test_reservations_evict_other_runs_and_hold_the_node_until_released(make_executor, pods: Pods) -> None:
    executor = make_executor([Node("n1", cores=1, memory_gb=1.0), Node("n2", cores=1, memory_gb=1.0)])
    other = pods.spec("other", run="r-other", priority="simrun-owner-base")
    executor.start_pods([other])
    wait_for(started(executor, pods, other))
    assert status(executor, other).node == "n1"

    executor.reserve("n1", "r-bench")
    assert [(n.name, n.reserved_by) for n in executor.nodes()] == [("n1", "r-bench"), ("n2", None)]
    # Evicted as a NoExecute taint would, though its priority is the highest, and placed again on the free node.
    wait_for(lambda: pods.starts("other") == 2 and status(executor, other).phase is PodPhase.RUNNING)
    evicted = status(executor, other)
    assert (evicted.node, evicted.preemptions, evicted.attempts) == ("n2", 1, 2)
    assert "evicted by a reservation" in pods.log(other).read_text()

    bench = pods.spec("bench", run="r-bench", priority="simrun-agent-extra")
    third = pods.spec("third", run="r-third", priority="simrun-owner-base")
    executor.start_pods([bench, third])
    wait_for(started(executor, pods, bench))
    assert status(executor, bench).node == "n1"
    time.sleep(0.3)
    assert status(executor, third).phase is PodPhase.PENDING

    with pytest.raises(FailedPrecondition, match="reserved by run r-bench"):
        executor.reserve("n1", "r-third")
    with pytest.raises(NotFound):
        executor.reserve("n9", "r-third")
    executor.reserve("n1", "r-bench")  # the holder may ask again

    pods.go("bench")
    wait_for(phase_is(executor, bench, PodPhase.SUCCEEDED))
    time.sleep(0.2)
    assert status(executor, third).phase is PodPhase.PENDING  # the reservation outlives the pod until released
    executor.release("r-bench")
    assert [n.reserved_by for n in executor.nodes()] == [None, None]
    wait_for(started(executor, pods, third))
    assert status(executor, third).node == "n1"


def test_stop_fails_running_and_pending_pods_and_kills_after_the_grace(make_executor, pods: Pods) -> None:
    executor = make_executor()
    stubborn = pods.spec("stubborn", grace_s=0.3, command=stubborn_command(pods))
    queued = pods.spec("queued")
    other = pods.spec("other", run="r2")
    executor.start_pods([stubborn, queued, other])
    wait_for(started(executor, pods, stubborn))
    executor.stop_pods("r1", "queued")
    assert status(executor, queued).phase is PodPhase.FAILED
    assert status(executor, queued).message == "stopped"
    assert status(executor, stubborn).phase is PodPhase.RUNNING
    begun = time.monotonic()
    executor.stop_pods("r1")
    wait_for(phase_is(executor, stubborn, PodPhase.FAILED))
    assert time.monotonic() - begun >= 0.3
    assert (status(executor, stubborn).message, status(executor, stubborn).exit_code) == ("stopped", 137)
    assert status(executor, stubborn).memory_kills == []
    wait_for(started(executor, pods, other))


def test_a_pod_larger_than_every_node_fails_and_bad_specs_are_refused(make_executor, pods: Pods) -> None:
    executor = make_executor()
    huge = pods.spec("huge", cores=4)
    executor.start_pods([huge])
    wait_for(phase_is(executor, huge, PodPhase.FAILED))
    assert status(executor, huge).message == "needs 4 cores and 0.25 GiB; no node has that much"
    with pytest.raises(InvalidArgument, match="unknown priority class"):
        executor.start_pods([pods.spec("odd", priority="simrun-nobody-base")])
    missing = pods.spec("missing", command=["/nonexistent/simrun-worker"])
    executor.start_pods([missing])
    wait_for(phase_is(executor, missing, PodPhase.FAILED))
    assert status(executor, missing).message.startswith("cannot start:")


def _memory_pod(pods: Pods, name: str, mib: int, processes: int = 1) -> PodSpec:
    command = [sys.executable, "-c", ALLOCATE, str(mib), "1.0"]
    return pods.spec(name, memory_gb=0.25, retry_memory_gb=0.5, processes=processes, command=command)


@pytest.mark.parametrize(
    "cgroups",
    [
        pytest.param(True, marks=pytest.mark.skipif(not HAS_CGROUPS, reason="no memory cgroups on this machine")),
        False,
    ],
    ids=["cgroup", "watchdog"],
)
def test_a_pod_over_its_memory_is_killed_and_retried_once_with_the_retry_memory(
    make_executor, pods: Pods, cgroups: bool
) -> None:
    executor = make_executor([Node("n1", cores=2, memory_gb=2.0)], cgroup_root="auto" if cgroups else None)
    assert (executor.cgroup_version is not None) is cgroups
    fits = _memory_pod(pods, "fits", 384)
    never = _memory_pod(pods, "never", 640, processes=2)
    executor.start_pods([fits, never])
    wait_for(phase_is(executor, fits, PodPhase.SUCCEEDED))
    wait_for(phase_is(executor, never, PodPhase.FAILED))
    evidence = "cgroup" if cgroups else "watchdog"

    retried = status(executor, fits)
    assert (retried.attempts, retried.memory_gb, retried.preemptions) == (2, 0.5, 0)
    assert [(k.memory_gb, k.per_worker_gb, k.evidence) for k in retried.memory_kills] == [(0.25, 0.25, evidence)]
    log = pods.log(fits).read_text()
    assert "attempt 2 of pod r1.fits.w0 on node n1, memory limit 0.5 GiB" in log
    assert "killed for memory" in log

    failed = status(executor, never)
    assert failed.message == "killed for memory twice; the retry had 0.5 GiB (0.25 GiB per process)"
    assert [(k.memory_gb, k.evidence) for k in failed.memory_kills] == [(0.25, evidence), (0.5, evidence)]


@pytest.mark.parametrize(
    "cgroups",
    [
        pytest.param(True, marks=pytest.mark.skipif(not HAS_CGROUPS, reason="no memory cgroups on this machine")),
        False,
    ],
    ids=["cgroup", "watchdog"],
)
def test_the_executor_measures_the_anonymous_memory_a_pod_held_itself(make_executor, pods: Pods, cgroups: bool) -> None:
    """A pod's measured peak is the executor's own sample of its anonymous memory (its cgroup's, or its process
    group's), what bounds the pod's report to the learner: here 160 MiB held for a second, under a 0.5 GiB limit,
    while the pod's page cache (a 200 MiB file it writes) is not counted."""
    executor = make_executor([Node("n1", cores=2, memory_gb=2.0)], cgroup_root="auto" if cgroups else None)
    cached = pods.box / "cache.bin"
    command = [
        sys.executable,
        "-c",
        f"with open({str(cached)!r}, 'wb') as f:\n    for _ in range(200):\n        f.write(bytes(1 << 20))\n"
        + ALLOCATE,
        "160",
        "1.0",
    ]
    held = pods.spec("held", memory_gb=0.5, retry_memory_gb=0.75, command=command)
    quick = pods.spec("quick", command=[sys.executable, "-c", "pass"])
    executor.start_pods([held, quick])
    wait_for(phase_is(executor, held, PodPhase.SUCCEEDED))
    wait_for(phase_is(executor, quick, PodPhase.SUCCEEDED))
    peak = status(executor, held).peak_memory_gb
    assert peak is not None and 160 / 1024 <= peak < 0.3, peak
    # A pod too brief for a sample was measured as using nothing, never as unmeasured (bounded by its limit only).
    assert (quick_peak := status(executor, quick).peak_memory_gb) is not None and quick_peak < 0.1


@pytest.mark.skipif(not HAS_CGROUPS, reason="no memory cgroups on this machine")
def test_pods_run_in_their_own_cgroup_which_is_removed_after(make_executor, pods: Pods) -> None:
    executor = make_executor(cgroup_root="auto")
    probe = [
        sys.executable,
        "-c",
        "import os; print('cgroup', os.environ['SIMRUN_CGROUP'])\nprint(open('/proc/self/cgroup').read())",
    ]
    spec = pods.spec("probe", command=probe)
    executor.start_pods([spec])
    wait_for(phase_is(executor, spec, PodPhase.SUCCEEDED))
    log = pods.log(spec).read_text()
    cgroup = Path(log.split("\ncgroup ", 1)[1].split()[0])
    assert cgroup.parent.name == executor.executor_id
    assert f"/simrun/{executor.executor_id}/{cgroup.name}" in log  # the process itself was in it
    assert not cgroup.exists()
    parent = cgroup.parent
    assert parent.exists()
    executor.close()
    assert not parent.exists()


@pytest.mark.skipif(not HAS_CGROUPS, reason="no memory cgroups on this machine")
def test_sigkill_in_a_cgroup_that_counted_no_oom_kill_is_no_kill_for_memory(make_executor, pods: Pods) -> None:
    executor = make_executor(cgroup_root="auto")
    command = [sys.executable, "-c", "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)"]
    killed = pods.spec("killed", command=command, memory_gb=0.25, retry_memory_gb=0.375)
    executor.start_pods([killed])
    wait_for(phase_is(executor, killed, PodPhase.FAILED))
    final = status(executor, killed)
    assert (final.memory_kills, final.sigkills, final.attempts) == ([], 2, 2)
    assert final.message == "killed (SIGKILL), not for memory, with 0.375 GiB after its retry; not retried again"


def test_config_lists_nodes_or_defaults_to_this_machine(pods: Pods) -> None:
    config = ServerConfig.model_validate(
        {
            "nodes": [{"name": "a", "cores": 2, "memory_gb": 4}, {"name": "b", "cores": 1, "memory_gb": 0.5}],
            "cgroup_root": None,
        }
    )
    local = config.executor.local
    # Settings written at the top, as before the `executor:` section, land in its `local` part.
    assert (config.executor.kind, local.cgroup_root) == ("local", None)
    assert [(n.name, n.cores, n.memory_gb, n.allocatable_cores) for n in configured_nodes(local.nodes) or []] == [
        ("a", 2, 4.0, 2.0),
        ("b", 1, 0.5, 1.0),
    ]
    assert ServerConfig().executor.local.cgroup_root == "auto"
    assert configured_nodes(ServerConfig().executor.local.nodes) is None
    with pytest.raises(ValueError, match="unique"):
        ServerConfig.model_validate({"nodes": [{"name": "a", "cores": 1, "memory_gb": 1}] * 2})
    (machine,) = default_nodes()
    assert machine.cores >= 1
    assert 0 < machine.memory_gb == int(machine.memory_gb) or machine.memory_gb == 0.5
    with LocalExecutor.from_config(local, pods.box, pods.launch) as executor:
        assert [n.name for n in executor.nodes()] == ["a", "b"]
        assert executor.cgroup_version is None


@pytest.mark.parametrize(
    "cgroups",
    [False, pytest.param(True, marks=pytest.mark.skipif(not HAS_CGROUPS, reason="no memory cgroups here"))],
    ids=["watchdog", "cgroup"],
)
@pytest.mark.parametrize("niceness", [0, 7])
def test_a_pod_starts_at_the_configured_niceness(make_executor, pods: Pods, niceness: int, cgroups: bool) -> None:
    executor = make_executor(pod_nice=niceness, cgroup_root="auto" if cgroups else None)
    report = pods.box / "niceness"
    spec = pods.spec(
        "nice", command=[sys.executable, "-c", f"import os; open({str(report)!r}, 'w').write(str(os.nice(0)))"]
    )
    executor.start_pods([spec])
    wait_for(phase_is(executor, spec, PodPhase.SUCCEEDED))
    assert int(report.read_text()) == min(19, os.nice(0) + niceness)
    assert f", nice +{niceness}, " in pods.log(spec).read_text().splitlines()[0]


def test_a_niceness_out_of_range_is_refused(pods: Pods) -> None:
    with pytest.raises(InvalidArgument, match="pod_nice must be from 0 to 19, not 20"):
        LocalExecutor(pods.box, pods.launch, [Node("n1", cores=1, memory_gb=1.0)], cgroup_root=None, pod_nice=20)
    with pytest.raises(ValueError, match="pod_nice"):
        ServerConfig.model_validate({"executor": {"local": {"pod_nice": -1}}})
    assert ServerConfig().executor.local.pod_nice == 10


@pytest.mark.skipif(not HAS_CGROUPS, reason="no memory cgroups on this machine")
def test_the_cgroups_and_pods_of_a_dead_executor_are_removed_at_start(make_executor) -> None:
    root = detect_cgroup_root()
    assert root is not None
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = root / "simrun" / f"{dead.pid}-0badcafe"
    (stale / "pod.1").mkdir(parents=True)
    enter = 'echo $$ > "$0" && exec sleep 60'
    orphan = subprocess.Popen(["/bin/sh", "-c", enter, str(stale / "pod.1" / "cgroup.procs")], start_new_session=True)
    try:
        wait_for(lambda: (stale / "pod.1" / "cgroup.procs").read_text().split() == [str(orphan.pid)])
        make_executor(cgroup_root="auto")
        assert orphan.wait(timeout=5) == -9
        assert not stale.exists()
    finally:
        orphan.kill()
        orphan.wait()
        if stale.exists():
            (stale / "pod.1").rmdir()
            stale.rmdir()


def test_a_retry_after_a_kill_for_memory_runs_the_retry_processes(make_executor, pods: Pods) -> None:
    executor = make_executor()
    record = pods.box / "processes.txt"
    # The first attempt notes its processes and dies by SIGKILL; the retry notes its processes and succeeds.
    script = (
        "import os, signal, sys, pathlib\n"
        "p = pathlib.Path(sys.argv[1])\n"
        "first = not p.exists()\n"
        "with p.open('a') as f: f.write(os.environ['SIMRUN_PROCESSES'] + '\\n')\n"
        "if first: os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    spec = dataclasses.replace(
        pods.spec("retry", command=[sys.executable, "-c", script, str(record)], processes=4, memory_gb=0.5),
        contract={"SIMRUN_PROCESSES": "4"},
        retry_memory_gb=0.75,
        retry_processes=2,
    )
    executor.start_pods([spec])
    wait_for(phase_is(executor, spec, PodPhase.SUCCEEDED))
    assert record.read_text().split() == ["4", "2"]
    # A SIGKILL without evidence of the OOM killer is retried at the retry memory, but it is no kill for memory.
    retried = status(executor, spec)
    assert (retried.memory_kills, retried.sigkills, retried.memory_gb, retried.exit_code) == ([], 1, 0.75, 0)
    assert spec.retry_per_worker_gb == 0.375
    assert "killed (SIGKILL), not for memory, with 0.5 GiB; retried with 0.75 GiB (0.375 GiB per process)" in (
        pods.log(spec).read_text()
    )


def test_a_second_sigkill_fails_the_pod_without_calling_it_a_kill_for_memory(make_executor, pods: Pods) -> None:
    executor = make_executor()
    die = [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"]
    spec = pods.spec("die", command=die, memory_gb=0.25, retry_memory_gb=0.5)
    executor.start_pods([spec])
    wait_for(phase_is(executor, spec, PodPhase.FAILED))
    failed = status(executor, spec)
    assert (failed.attempts, failed.sigkills, failed.memory_kills, failed.exit_code) == (2, 2, [], 137)
    assert failed.message == "killed (SIGKILL), not for memory, with 0.5 GiB after its retry; not retried again"


def test_a_restored_pod_keeps_its_memory_kills_attempts_and_reservation(make_executor, pods: Pods) -> None:
    from simrun_tracker.executor import MemoryKill, PodHistory, RunRecovery

    executor = make_executor([Node("n1", cores=1, memory_gb=1.0), Node("n2", cores=1, memory_gb=1.0)])
    kill = MemoryKill(0.25, 0.25, "cgroup")
    executor.restore(RunRecovery("r1", "n2", [PodHistory("again", "w0", [kill], attempts=3)]))
    assert {n.name: n.reserved_by for n in executor.nodes()} == {"n1": None, "n2": "r1"}
    again = pods.spec("again")
    executor.start_pods([again])
    wait_for(started(executor, pods, again))
    restored = status(executor, again)
    # The retry memory after the recorded kill, the next attempt's number, and the reserved node.
    assert (restored.memory_gb, restored.attempts, restored.node, len(restored.memory_kills)) == (0.375, 4, "n2", 1)
    assert "attempt 4 of pod r1.again.w0" in pods.log(again).read_text()
    pods.go("again")
    wait_for(phase_is(executor, again, PodPhase.SUCCEEDED))


def test_a_forgotten_run_s_stopping_pod_stays_supervised_until_it_is_killed_then_is_dropped(
    make_executor, pods: Pods
) -> None:
    executor = make_executor()
    stubborn = pods.spec("stubborn", grace_s=0.5, command=stubborn_command(pods))
    executor.start_pods([stubborn])
    wait_for(started(executor, pods, stubborn))
    executor.stop_pods("r1")
    executor.forget("r1")
    time.sleep(0.2)
    assert status(executor, stubborn).phase is PodPhase.RUNNING, "a pod still stopping is not dropped"
    wait_for(lambda: executor.pods("r1") == [])
    assert not executor._pods and not executor._by_run and not executor._forgotten
    # The next run finds the node free: the dropped pod's process is gone, not merely forgotten.
    after = pods.spec("after", run="r2")
    executor.start_pods([after])
    wait_for(started(executor, pods, after))
