"""The driver's state machine against the scripted fake executor: merging, the legacy merge pod, memory kills
across a restart, the learner failing, errors that back off or fail a run, environments that build, and an
adapter that orders tasks itself."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from fake_executor import FakeExecutor
from simrun_core.config import DriverConfig
from simrun_core.errors import InvalidArgument, Unavailable
from simrun_core.identity import Priority
from simrun_core.resources import ObservationKey, ResolvedResources, SplitMode
from simrun_learner.learner import ResourceLearner
from simrun_planner import Node, plan_task
from simrun_runtime.layout import StoreLayout, TaskLayout
from simrun_runtime.record import Identity, RunRecord, RunState, SnapshotRef, TaskRecord, TaskState
from simrun_runtime.reports import WorkerEnd, WorkerReport
from simrun_tracker.driver import Driver
from simrun_tracker.executor import TaskOrdering
from simrun_tracker.learning import InProcessLearner
from simrun_tracker.ports import Environment, EnvironmentState
from simrun_tracker.reads import Hangup, RunReader
from simrun_tracker.runstore import RunStore

NODES = [Node("n1", cores=4, memory_gb=16)]
AGENT = Identity(name="bob-agent", kind="agent", on_behalf_of="bob", priority="agent")


class Learner:
    """The learner port, recording what the driver reports; it can be made to fail."""

    def __init__(self) -> None:
        self.recorded: list[tuple[str, str, bool]] = []
        self.fail = False

    def resolve(self, key: ObservationKey, hint: ResolvedResources) -> ResolvedResources:
        return hint

    def record_reports(self, record: RunRecord, task_id: str, succeeded: bool) -> int:
        if self.fail:
            raise Unavailable("the learner is down")
        self.recorded.append((record.run_id, task_id, succeeded))
        return 0

    def estimate(self, key: ObservationKey, units: int, pods: int, processes: int) -> float | None:
        return None

    def close(self) -> None:
        return None


class Environments:
    """The environment port with a state the test sets."""

    def __init__(self) -> None:
        self.state = EnvironmentState.READY
        self.message = ""
        self.locks_written: list[tuple[str, str]] = []

    def resolve(self, snapshots: object) -> Environment:
        return self.get("env-1")

    def get(self, environment_id: str) -> Environment:
        return Environment(environment_id, self.state, self.message)

    def write_run_lock(self, run_id: str, environment_id: str) -> None:
        self.locks_written.append((run_id, environment_id))

    def close(self) -> None:
        return None


def plan(task_id: str, split: bool, units: int | None, merges: bool = True) -> dict:
    planned = plan_task(
        SimpleNamespace(id=task_id),
        SimpleNamespace(name="m:T", split=split),
        ResolvedResources(base_memory_gb=0.5, per_worker_gb=0.25),
        NODES,
        SplitMode.SINGLE_SERVER,
        Priority.AGENT,
        units,
        run_id="r",
    )
    shaped = dataclasses.asdict(planned)
    shaped["coordinator_merges"] = merges
    return shaped


def task(task_id: str, split: bool = False, merges: bool = True, inputs: dict[str, str] | None = None) -> TaskRecord:
    return TaskRecord(
        task_id=task_id,
        type="m:T",
        split=split,
        units=8 if split else None,
        plan=plan(task_id, split, 8 if split else None, merges),
        inputs=inputs or {},
    )


@dataclasses.dataclass
class World:
    runs: RunStore
    executor: FakeExecutor
    learner: Learner
    environments: Environments
    driver: Driver
    planned: list[str]

    def submit(self, *tasks: TaskRecord, run_id: str = "r1", unplanned: bool = False, reserve: str = "") -> str:
        records = {t.task_id: (t.model_copy(update={"plan": None}) if unplanned else t) for t in tasks}
        record = RunRecord(
            run_id=run_id,
            identity=AGENT,
            tasks=records,
            environment="env-1",
            reservation=reserve or None,
            snapshots=[SnapshotRef(name="m", snapshot_id="s1", path="snapshots/m/s1")],
        )
        if reserve:
            self.executor.reserve(reserve, run_id)
        self.runs.create(record, lambda staging: staging.tasks.mkdir(parents=True))
        self._planned_tasks = {t.task_id: t for t in tasks}
        return run_id

    def state(self, run_id: str = "r1") -> RunRecord:
        return self.runs.get(run_id)

    def until(self, check: Callable[[RunRecord], bool], run_id: str = "r1", timeout_s: float = 10) -> RunRecord:
        deadline = time.monotonic() + timeout_s
        while True:
            record = self.state(run_id)
            if check(record):
                return record
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out; the run is {record.state}: {record.message}")
            time.sleep(0.01)

    def merged(self, task_id: str, run_id: str = "r1") -> None:
        marker = self.runs.layout.run(run_id).task(task_id).merge_marker
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text("{}")


@pytest.fixture
def make_world(tmp_path: Path) -> Iterator[Callable[..., World]]:
    made: list[World] = []

    def make(
        executor: FakeExecutor | None = None,
        merge_wait_s: float = 5.0,
        config: DriverConfig | None = None,
        output_check: Callable[[TaskLayout], str | None] | None = None,
        learner: Any = None,
    ) -> World:
        runs = RunStore(StoreLayout(tmp_path / "store"))
        executor = executor or FakeExecutor(list(NODES))
        learner, environments, planned = learner or Learner(), Environments(), []
        world: World

        def planner(record: RunRecord) -> None:
            planned.append(record.run_id)
            record.tasks = {k: world._planned_tasks[k].model_copy(deep=True) for k in record.tasks}

        driver = Driver(
            runs,
            executor,
            learner,
            environments,
            planner,
            grace_s=1,
            merge_wait_s=merge_wait_s,
            config=config or DriverConfig(backoff_initial_s=0.05, backoff_max_s=0.2, give_up_s=30, tick_s=0.5),
            output_check=output_check,
        )
        world = World(runs, executor, learner, environments, driver, planned)
        driver.recover(runs.load())
        driver.start()
        made.append(world)
        return world

    yield make
    for world in made:
        world.driver.stop()
        world.runs.close()


def running(record: RunRecord) -> bool:
    return record.state == RunState.RUNNING


def test_a_split_task_succeeds_once_its_coordinator_succeeded_and_its_merge_marker_is_seen(make_world) -> None:
    world = make_world()
    world.submit(task("scan", split=True))
    world.until(running)
    world.merged("scan")
    world.executor.exit("r1", "scan")
    record = world.until(lambda r: r.state.final)
    assert (record.state, record.tasks["scan"].state) == (RunState.SUCCEEDED, TaskState.SUCCEEDED)
    assert world.learner.recorded == [("r1", "scan", True)]
    assert record.tasks["scan"].attempts == {"w0": 1}
    assert world.executor.calls.get("forget") == 1 and world.executor.pods("r1") == []


def test_a_coordinator_without_a_merge_marker_fails_its_task_after_the_wait(make_world) -> None:
    world = make_world(merge_wait_s=0.3)
    world.submit(task("scan", split=True))
    world.until(running)
    world.executor.exit("r1", "scan")
    record = world.until(lambda r: r.state.final)
    assert record.state == RunState.FAILED
    assert record.message == "task scan failed: the coordinator succeeded but no merge marker appeared within 0.3 s"


def test_a_plan_recorded_before_the_coordinator_merged_runs_the_merge_pod_after_it(make_world) -> None:
    world = make_world()
    world.submit(task("scan", split=True, merges=False))
    world.until(running)
    world.executor.exit("r1", "scan")
    world.until(lambda r: any(p.spec.worker == "merge" for p in world.executor.pods("r1")))
    merge = world.executor.status("r1", "scan", "merge")
    assert merge.spec.contract["SIMRUN_MERGE"] == "1" and merge.spec.role.value == "merge"
    world.merged("scan")
    world.executor.exit("r1", "scan", "merge")
    assert world.until(lambda r: r.state.final).state == RunState.SUCCEEDED


def test_a_merge_pod_that_wrote_no_marker_fails_the_task(make_world) -> None:
    world = make_world()
    world.submit(task("scan", split=True, merges=False))
    world.until(running)
    world.executor.exit("r1", "scan")
    world.until(lambda r: any(p.spec.worker == "merge" for p in world.executor.pods("r1")))
    world.executor.exit("r1", "scan", "merge")
    record = world.until(lambda r: r.state.final)
    assert record.message == "task scan failed: the merge pod succeeded but wrote no merge marker"


def test_a_running_task_past_its_output_bound_has_its_pods_stopped_and_fails_the_run(make_world) -> None:
    written = {"bytes": 0}
    measured: list[float] = []

    def output_check(task: TaskLayout) -> str | None:
        measured.append(time.monotonic())
        return f"the task wrote {written['bytes']} bytes" if written["bytes"] > 100 else None

    config = DriverConfig(tick_s=30, output_check_s=0.2)
    world = make_world(config=config, output_check=output_check)
    world.submit(task("scan", split=True))
    world.until(running)
    deadline = time.monotonic() + 20
    while len(measured) < 2:  # measured while it runs, on a timer (no pod changes in between)
        assert time.monotonic() < deadline, measured
        time.sleep(0.05)
    assert world.state("r1").state == RunState.RUNNING
    written["bytes"] = 101
    record = world.until(lambda r: r.state.final)
    assert record.state == RunState.FAILED
    assert record.tasks["scan"].state == TaskState.FAILED
    assert record.message == "task scan failed: the task wrote 101 bytes"
    assert world.executor.calls.get("stop_pods", 0) >= 1 and world.executor.pods("r1") == []


def test_a_learner_that_fails_does_not_fail_the_run(make_world) -> None:
    world = make_world()
    world.learner.fail = True
    world.submit(task("fit"))
    world.until(running)
    world.executor.exit("r1", "fit")
    assert world.until(lambda r: r.state.final).state == RunState.SUCCEEDED


def test_a_step_taken_again_after_it_recorded_a_task_s_observations_records_none_twice(
    make_world, tmp_path: Path
) -> None:
    """The step that ends a task records its pods' observations, then fails to save the run's final state (a full
    disk): the driver takes the step again and ends the task again, and the learner keeps one observation per pod
    incarnation (keyed by run, task and the report's worker and start), not two."""
    learner = ResourceLearner(tmp_path / "observations.db")
    world = make_world(learner=InProcessLearner(learner, StoreLayout(tmp_path / "store")))
    world.submit(task("fit"))
    world.until(running)
    layout = world.runs.layout.run("r1").task("fit")
    started = datetime.now(UTC)
    WorkerReport(
        run_id="r1",
        task_id="fit",
        worker="w0",
        role="exec",
        started_ms=int(started.timestamp() * 1000),
        task_type="m:T",
        processes=1,
        memory_source="cgroup_v2",
        peak_memory_gb=0.1,
        per_process_gb=0.1,
        ended=WorkerEnd.DONE,
        exit_code=0,
        started_at=started,
        ended_at=started,
    ).write(layout)
    save, failed = world.runs.save, []

    def save_failing_once(record: RunRecord) -> None:
        if record.state.final and not failed:
            failed.append(record.run_id)
            raise OSError(28, "No space left on device")
        save(record)

    world.runs.save = save_failing_once  # type: ignore[method-assign]
    world.executor.exit("r1", "fit")
    assert world.until(lambda r: r.state.final).state == RunState.SUCCEEDED
    assert failed == ["r1"]
    observations = learner.observations(ObservationKey("m:T", "m", ""))
    assert len(observations) == 1, observations
    assert observations[0].source == f"r1/fit/w0-{int(started.timestamp() * 1000)}"


def test_the_runtime_s_failure_message_becomes_the_task_s(make_world) -> None:
    world = make_world()
    world.submit(task("fit"))
    world.until(running)
    failure = world.runs.layout.run("r1").task("fit").failure
    failure.parent.mkdir(parents=True, exist_ok=True)
    failure.write_text('{"message": "unit 7 raised ValueError: bad seed (worker w0)"}')
    world.executor.exit("r1", "fit", code=1)
    record = world.until(lambda r: r.state.final)
    assert record.message == "task fit failed: unit 7 raised ValueError: bad seed (worker w0)"


def test_memory_kills_survive_a_restart_and_the_second_fails_the_run(make_world) -> None:
    first = make_world()
    first.submit(task("fit"))
    first.until(running)
    first.executor.kill_for_memory("r1", "fit")
    first.until(lambda r: len(r.oom_kills) == 1 and r.tasks["fit"].attempts.get("w0") == 2)
    first.driver.stop()
    # A new tracker: the pods are gone with the old executor; the record says what happened.
    second = make_world()
    second._planned_tasks = first._planned_tasks
    second.until(lambda r: second.executor.pods("r1") != [] and second.executor.status("r1", "fit").attempts == 3)
    restarted = second.executor.status("r1", "fit")
    assert restarted.memory_gb == restarted.spec.retry_memory_gb and len(restarted.memory_kills) == 1
    second.executor.kill_for_memory("r1", "fit")
    record = second.until(lambda r: r.state.final)
    assert record.state == RunState.FAILED and "killed for memory twice" in record.message
    assert len(record.oom_kills) == 2


def test_a_reservation_is_held_again_after_a_restart(make_world) -> None:
    first = make_world()
    first.submit(task("fit"), reserve="n1")
    first.until(running)
    first.driver.stop()
    second = make_world()
    assert {n.name: n.reserved_by for n in second.executor.nodes()} == {"n1": "r1"}


class Refusing(FakeExecutor):
    def start_pods(self, pods):  # type: ignore[no-untyped-def]
        raise InvalidArgument("the cluster refused the pod: bad label")


class Flaky(FakeExecutor):
    """Unavailable for the first `failures` observations."""

    def __init__(self, failures: int, **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self.failures = failures

    def pods(self, run_id):  # type: ignore[no-untyped-def]
        if self.failures > 0:
            self.failures -= 1
            raise Unavailable("the API server is not answering")
        return super().pods(run_id)


def test_a_step_refused_for_good_fails_its_run_with_the_message(make_world) -> None:
    world = make_world(Refusing(list(NODES)))
    world.submit(task("fit"))
    record = world.until(lambda r: r.state.final)
    assert (record.state, record.message) == (RunState.FAILED, "the cluster refused the pod: bad label")


def test_a_transient_failure_backs_off_and_recovers(make_world) -> None:
    flaky = Flaky(3, nodes=list(NODES))
    world = make_world(flaky)
    world.submit(task("fit"))
    world.until(running)
    assert flaky.failures == 0
    world.executor.exit("r1", "fit")
    assert world.until(lambda r: r.state.final).state == RunState.SUCCEEDED


def test_a_transient_failure_that_lasts_fails_the_run_once_the_bound_passes(make_world) -> None:
    config = DriverConfig(backoff_initial_s=0.05, backoff_max_s=0.1, give_up_s=0.5, tick_s=0.5)
    world = make_world(Flaky(10**6, nodes=list(NODES)), config=config)
    world.submit(task("fit"))
    record = world.until(lambda r: r.state.final)
    assert record.state == RunState.FAILED
    assert record.message.startswith("failing for ") and "the API server is not answering" in record.message
    # Backing off, the driver did not spin: far fewer steps than a 0.05 s loop for that long would take.
    assert world.driver.steps < 30


def test_a_run_waits_while_its_environment_builds_then_is_planned_and_runs(make_world) -> None:
    world = make_world()
    world.environments.state = EnvironmentState.BUILDING
    world.environments.message = "uv sync: 12 of 40 packages"
    world.submit(task("fit"), unplanned=True)
    record = world.until(lambda r: "building" in r.message)
    assert record.state == RunState.SUBMITTING
    assert record.message == "building environment env-1: uv sync: 12 of 40 packages"
    assert world.executor.pods("r1") == [] and world.planned == [] and world.environments.locks_written == []
    world.environments.state = EnvironmentState.READY
    world.until(running)
    assert world.planned == ["r1"]
    assert world.environments.locks_written[:1] == [("r1", "env-1")]  # runs/r1/environment.lock once it is ready
    world.executor.exit("r1", "fit")
    assert world.until(lambda r: r.state.final).state == RunState.SUCCEEDED


def test_a_failed_environment_fails_the_run_with_the_builder_s_message(make_world) -> None:
    world = make_world()
    world.environments.state = EnvironmentState.FAILED
    world.environments.message = "uv sync failed: no wheel for scipy"
    world.submit(task("fit"), unplanned=True)
    record = world.until(lambda r: r.state.final)
    assert (record.state, record.message) == (
        RunState.FAILED,
        "environment env-1 failed: uv sync failed: no wheel for scipy",
    )


def test_an_adapter_that_orders_tasks_gets_the_whole_run_once(make_world) -> None:
    executor = FakeExecutor(list(NODES), ordering=TaskOrdering.ADAPTER)
    world = make_world(executor)
    world.submit(task("scan", split=True), task("report", inputs={"points": "scan.points"}))
    world.until(running)
    assert executor.calls.get("start_run") == 1 and executor.calls.get("start_pods") == 1
    world.merged("scan")
    executor.exit("r1", "scan")
    world.until(lambda r: r.tasks["scan"].state == TaskState.SUCCEEDED)
    world.until(lambda r: any(p.spec.task_id == "report" for p in executor.pods("r1")))
    executor.exit("r1", "report")
    assert world.until(lambda r: r.state.final).state == RunState.SUCCEEDED
    assert executor.calls.get("start_run") == 1


def test_a_cancel_request_is_carried_out_by_the_driver(make_world) -> None:
    world = make_world()
    world.submit(task("fit"))
    world.until(running)
    with world.runs.run_lock("r1"):
        record = world.state()
        record.cancel_requested = True
        record.message = "cancelled by bob"
        world.runs.save(record)
    record = world.until(lambda r: r.state.final)
    assert (record.state, record.message, record.tasks["fit"].state) == (
        RunState.CANCELLED,
        "cancelled by bob",
        TaskState.CANCELLED,
    )
    assert world.executor.status("r1", "fit").message == "stopped"
    assert world.executor.pods("r1") == [], "the executor was told to forget the ended run"


def test_a_run_ending_releases_its_reservation(make_world) -> None:
    world = make_world()
    world.submit(task("fit"), reserve="n1")
    world.until(running)
    assert world.executor.nodes()[0].reserved_by == "r1"
    world.executor.exit("r1", "fit")
    world.until(lambda r: r.state.final)
    assert world.executor.nodes()[0].reserved_by is None


def test_a_slow_executor_does_not_slow_reading_a_run(make_world) -> None:
    world = make_world(FakeExecutor(list(NODES), pods_delay_s=0.3))
    for index in range(5):
        world.submit(task("fit"), run_id=f"r{index}")
    world.until(running, run_id="r0", timeout_s=20)
    slowest = 0.0
    for _ in range(50):
        began = time.monotonic()
        world.runs.get("r2")
        slowest = max(slowest, time.monotonic() - began)
    assert slowest < 0.1, f"a read waited {slowest:.3f} s for the driver"


def test_the_safety_net_finds_every_lost_event_in_turn_and_visits_a_bounded_share_per_tick(make_world) -> None:
    config = DriverConfig(backoff_initial_s=0.05, give_up_s=30, tick_s=0.2, safety_visits_per_tick=2)
    world = make_world(FakeExecutor([Node(f"n{i}", cores=4, memory_gb=16) for i in range(5)]), config=config)
    runs = [world.submit(task("fit"), run_id=f"r{index}") for index in range(5)]
    for run_id in runs:
        world.until(running, run_id=run_id)
    world.executor.events_lost = True
    began, steps = time.monotonic(), world.driver.steps
    time.sleep(1.0)
    ticks = (time.monotonic() - began) / config.tick_s + 1
    assert world.driver.steps - steps <= ticks * config.safety_visits_per_tick + 1
    for run_id in runs:
        world.executor.exit(run_id, "fit")
    for run_id in runs:  # only the safety net can see these: 2 a tick, every run in its turn
        assert world.until(lambda r: r.state.final, run_id=run_id).state == RunState.SUCCEEDED


def follow_report_logs(world: World) -> tuple[threading.Thread, list[tuple[str, str]]]:
    """A run whose `report` waits on its running `scan`, and a thread following the logs of `report` into a list."""
    world.submit(task("scan", split=True), task("report", inputs={"points": "scan.points"}))
    world.until(running)
    reader = RunReader(world.runs, world.executor)
    lines: list[tuple[str, str]] = []
    follower = threading.Thread(target=lambda: lines.extend(reader.logs("r1", "report", follow=True)))
    follower.start()
    return follower, lines


def test_following_the_logs_of_a_task_not_started_waits_for_it_then_ends_with_it(make_world) -> None:
    world = make_world()
    follower, lines = follow_report_logs(world)
    time.sleep(0.3)
    assert follower.is_alive(), "following a task whose inputs are not done ended before the task started"
    world.merged("scan")
    world.executor.exit("r1", "scan")
    world.until(lambda r: r.tasks["report"].state == TaskState.RUNNING)
    world.executor.write_log("r1", "report", "w0", "reporting\n")
    world.executor.exit("r1", "report")
    follower.join(timeout=10)
    assert not follower.is_alive() and lines == [("w0.log", "reporting\n")]


def test_following_the_logs_of_a_task_that_never_starts_ends_with_its_run(make_world) -> None:
    world = make_world()
    follower, lines = follow_report_logs(world)
    world.executor.exit("r1", "scan", code=1)
    follower.join(timeout=10)
    assert not follower.is_alive() and lines == []
    assert world.state().tasks["report"].state == TaskState.CANCELLED


def test_following_stops_waiting_once_its_caller_has_gone(make_world) -> None:
    world = make_world()
    world.submit(task("scan", split=True), task("report", inputs={"points": "scan.points"}))
    world.until(running)
    listening = threading.Event()
    listening.set()
    follower = threading.Thread(
        target=lambda: list(RunReader(world.runs, world.executor).logs("r1", "report", "", True, listening.is_set))
    )
    follower.start()
    time.sleep(0.2)
    listening.clear()
    follower.join(timeout=5)
    assert not follower.is_alive()


def test_a_cancel_is_carried_out_while_the_run_backs_off(make_world) -> None:
    config = DriverConfig(backoff_initial_s=30, backoff_max_s=30, give_up_s=600, tick_s=0.5)
    world = make_world(Flaky(10**6, nodes=list(NODES)), config=config)
    world.submit(task("fit"))
    world.until(lambda r: world.driver.steps >= 1 and "r1" in world.driver._backoff)
    with world.runs.run_lock("r1"):
        record = world.state()
        record.cancel_requested = True
        record.message = "cancelled by bob"
        world.runs.save(record)
    record = world.until(lambda r: r.state.final, timeout_s=5)
    assert (record.state, record.message) == (RunState.CANCELLED, "cancelled by bob")


class Unreleasing(FakeExecutor):
    """Its reservations cannot be released: the step that ends a run fails, and so does failing the run."""

    def release(self, run_id):  # type: ignore[no-untyped-def]
        raise RuntimeError("the node's taint cannot be removed")


def test_a_run_whose_end_cannot_be_carried_out_does_not_stop_the_driver_for_other_runs(make_world) -> None:
    config = DriverConfig(backoff_initial_s=0.05, backoff_max_s=0.1, give_up_s=0.3, tick_s=0.5)
    world = make_world(
        Unreleasing([Node("n1", cores=4, memory_gb=16), Node("n2", cores=4, memory_gb=16)]), config=config
    )
    world.submit(task("fit"), reserve="n1")
    world.until(running)
    world.executor.exit("r1", "fit")
    time.sleep(1.0)  # the end fails, backs off, gives up, and failing the run fails too
    world.submit(task("fit"), run_id="r2")
    world.until(running, run_id="r2")
    world.executor.exit("r2", "fit")
    assert world.until(lambda r: r.state.final, run_id="r2").state == RunState.SUCCEEDED
    steps = world.driver.steps
    time.sleep(0.5)
    assert world.driver.steps - steps < 10, "the run that cannot end spins"


def test_a_workflow_found_invalid_once_its_environment_is_ready_fails_with_the_describer_s_reason(make_world) -> None:
    world = make_world()
    world.environments.state = EnvironmentState.BUILDING

    def planner(record: RunRecord) -> None:
        raise InvalidArgument("task fit: m:T has no setting 'sead' (did you mean 'seed'?)")

    world.driver.planner = planner
    world.submit(task("fit"), unplanned=True)
    world.until(lambda r: "building" in r.message)
    world.environments.state = EnvironmentState.READY
    record = world.until(lambda r: r.state.final)
    assert (record.state, record.message) == (
        RunState.FAILED,
        "task fit: m:T has no setting 'sead' (did you mean 'seed'?)",
    )
    assert world.executor.pods("r1") == [] and record.tasks["fit"].state == TaskState.CANCELLED


def test_a_sigkill_survives_a_restart_and_the_second_fails_the_run(make_world) -> None:
    first = make_world()
    first.submit(task("fit"))
    first.until(running)
    first.executor.exit("r1", "fit", code=137)  # no evidence of the OOM killer: retried once, not a kill for memory
    first.until(lambda r: r.tasks["fit"].sigkills == {"w0": 1} and r.tasks["fit"].attempts.get("w0") == 2)
    first.driver.stop()
    second = make_world()
    second._planned_tasks = first._planned_tasks
    second.until(lambda r: second.executor.pods("r1") != [] and second.executor.status("r1", "fit").attempts == 3)
    restarted = second.executor.status("r1", "fit")
    assert (restarted.memory_gb, restarted.sigkills) == (restarted.spec.retry_memory_gb, 1)
    second.executor.exit("r1", "fit", code=137)
    record = second.until(lambda r: r.state.final)
    assert record.state == RunState.FAILED and "not retried again" in record.message and record.oom_kills == []


def test_the_node_each_pod_ran_on_and_its_memory_are_kept_in_the_record_and_shown_with_its_pod(make_world) -> None:
    from simrun_tracker.convert import run_message

    world = make_world(FakeExecutor([Node("n1", cores=1, memory_gb=16), Node("n2", cores=4, memory_gb=16)]))
    world.submit(task("fit"))
    placed = world.until(lambda r: r.tasks["fit"].nodes.get("w0") is not None)
    node = placed.tasks["fit"].nodes["w0"]
    spec = world.executor.status("r1", "fit").spec
    assert node == world.executor.status("r1", "fit").node and node in {"n1", "n2"}
    assert placed.tasks["fit"].memory_gb == {"w0": spec.memory_gb}
    world.executor.exit("r1", "fit", code=137)  # retried: the pod leaves its node, and is placed again
    world.until(lambda r: r.tasks["fit"].attempts.get("w0") == 2)
    world.executor.exit("r1", "fit", code=0)
    record = world.until(lambda r: r.state.final)
    assert record.state == RunState.SUCCEEDED and record.tasks["fit"].nodes == {"w0": node}
    assert spec.retry_memory_gb > spec.memory_gb and record.tasks["fit"].memory_gb == {"w0": spec.retry_memory_gb}
    (pod,) = run_message(record).tasks[0].pods
    assert (pod.worker, pod.node, pod.attempts, pod.sigkills, pod.memory_gb) == ("w0", node, 2, 1, spec.retry_memory_gb)
    # A record written before nodes and memory were kept is read as before: its pods name neither.
    old = record.model_dump(mode="json")
    del old["tasks"]["fit"]["nodes"], old["tasks"]["fit"]["memory_gb"]
    (old_pod,) = run_message(RunRecord.model_validate(old)).tasks[0].pods
    assert not old_pod.HasField("node") and not old_pod.HasField("memory_gb") and old_pod.attempts == 2


def _watcher(reader: RunReader, hangup: Hangup | None = None, alive: Callable[[], bool] | None = None) -> Any:
    """A thread watching r1 into its `seen` list of states, counting the times it asked `alive`."""
    asked: list[float] = []

    def still_there() -> bool:
        asked.append(time.monotonic())
        return alive() if alive is not None else True

    seen: list[RunState] = []
    thread = threading.Thread(target=lambda: seen.extend(r.state for r, _ in reader.watch("r1", still_there, hangup)))
    thread.start()
    return SimpleNamespace(thread=thread, seen=seen, asked=asked)


def test_the_watchers_of_a_run_share_one_reading_a_change_and_sleep_until_it_changes(make_world) -> None:
    world = make_world()
    world.submit(task("fit"))
    world.until(running)
    reader = RunReader(world.runs, world.executor)
    watchers = [_watcher(reader, Hangup()) for _ in range(20)]
    deadline = time.monotonic() + 10
    while not all(w.seen for w in watchers) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert all(w.seen == [RunState.RUNNING] for w in watchers)
    reads = reader.watch_reads
    assert reads < 5, reads  # one reading of the run for all twenty (another if it changed as they joined)
    time.sleep(1.5)
    assert [w.asked for w in watchers] == [[]] * 20  # asleep: nobody polled its caller
    assert reader.watch_reads == reads
    world.executor.exit("r1", "fit")
    for w in watchers:
        w.thread.join(timeout=10)
        assert not w.thread.is_alive() and w.seen[-1] == RunState.SUCCEEDED
    assert reader.watch_reads - reads <= 4, reader.watch_reads - reads  # a reading per save, not per watcher


def test_a_watcher_whose_caller_hangs_up_ends_at_once(make_world) -> None:
    world = make_world()
    world.submit(task("fit"))
    world.until(running)
    reader = RunReader(world.runs, world.executor)
    hangup, gone = Hangup(), threading.Event()
    told, asked = _watcher(reader, hangup), _watcher(reader, alive=lambda: not gone.is_set())
    time.sleep(0.3)
    start = time.monotonic()
    hangup()
    told.thread.join(timeout=5)
    assert not told.thread.is_alive() and time.monotonic() - start < 0.5 and told.asked == []
    gone.set()  # without a hang-up, a watcher still finds its caller gone within a check
    asked.thread.join(timeout=5)
    assert not asked.thread.is_alive() and asked.asked
    assert told.seen == asked.seen == [RunState.RUNNING]


def test_watchers_see_the_units_done_as_the_progress_moves(make_world) -> None:
    from simrun_runtime.reports import ProgressLog

    world = make_world()
    world.submit(task("scan", split=True))
    world.until(running)
    reader = RunReader(world.runs, world.executor)
    done: list[list[int]] = [[], []]
    hangups = [Hangup(), Hangup()]

    def watch(i: int) -> None:
        for _, progress in reader.watch("r1", hangup=hangups[i]):
            done[i].append(progress[0].units_done)

    threads = [threading.Thread(target=watch, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    log = ProgressLog(world.runs.layout.run("r1").task("scan").progress)
    try:
        for unit in range(3):
            log.append(unit, "w0", 0.01, 1.0)
            deadline = time.monotonic() + 5
            while not all(d and d[-1] == unit + 1 for d in done) and time.monotonic() < deadline:
                time.sleep(0.01)
            assert [d[-1] for d in done] == [unit + 1, unit + 1], done
    finally:
        log.close()
        for hangup in hangups:
            hangup()
        for thread in threads:
            thread.join(timeout=5)
    reader.close()
