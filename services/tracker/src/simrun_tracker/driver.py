"""The driver: a level-triggered reconciler that moves each active run toward its goal, one step at a time.

A step reads the run's record and what the executor observed of its pods (once per run per step, from the
adapter's cache), and decides: build the environment, plan, start tasks whose inputs are merged, follow pods,
record memory kills, end tasks, carry out a cancellation, end the run. It works on its own copy of the record under
the run's own lock, so readers never wait for it. It is woken by events (a submission, a cancellation, a pod's
change) and by timers it sets itself (a build to ask about, a merge marker to await, a backoff to wait out).

Errors are classified: a transient one (a service unavailable, an unexpected failure) is retried with an
exponential backoff per run, up to a bound after which the run fails with the error; a permanent one (a refusal: a
bad workflow, a refused object) fails the run at once with its message. A run never spins.
"""

from __future__ import annotations

import heapq
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from opentelemetry.trace import Span
from simrun_core.config import DriverConfig
from simrun_core.errors import SimrunError
from simrun_core.key_index import KeyIndex
from simrun_core.telemetry import Telemetry, context_from_traceparent, traceparent_of, within_trace
from simrun_core.text import printable
from simrun_runtime.layout import RunLayout, TaskLayout, read_beneath
from simrun_runtime.record import OomKill, RunRecord, RunState, TaskRecord, TaskState
from simrun_runtime.reports import WorkerEnd, load_reports

from simrun_tracker.executor import (
    COORDINATOR,
    MERGE_WORKER,
    Executor,
    MemoryKill,
    PodHistory,
    PodPhase,
    PodStatus,
    RunRecovery,
    TaskOrdering,
)
from simrun_tracker.pods import coordinator_merges, merge_pod, run_spec, task_pods
from simrun_tracker.ports import EnvironmentPort, EnvironmentState, LearnerPort
from simrun_tracker.runstore import RunStore
from simrun_tracker.turns import Turns, stepping_out

log = logging.getLogger(__name__)

FAILURE_MESSAGE_CHARS = 4096
"""Characters of a task's own failure message (its `failure.json`) kept as the task's message, shown in every
listing of the run; the traceback stays in the file."""

BUILD_POLL_S = 1.0
"""Seconds between two questions to the environment builder about a run's build."""

MERGE_POLL_S = 0.5
"""Seconds between two looks for a merge marker after the coordinator succeeded."""

CANCELLED_BY = "cancelled by "


Planner = Callable[[RunRecord], None]
"""Describes and plans a run's tasks in place (for a run whose environment was building at submission)."""


@dataclass
class _Backoff:
    """A run whose steps fail transiently: since when, how often, and when to try again."""

    failures: int
    first_failure: float
    next_try: float
    cancelling: bool = False
    """Whether the failing steps were carrying out a cancellation already (then a cancellation waits too)."""


class Driver:
    """Drives the active runs of a run store through the executor, the learner and the environment builder."""

    def __init__(
        self,
        runs: RunStore,
        executor: Executor,
        learner: LearnerPort,
        environments: EnvironmentPort,
        planner: Planner,
        *,
        grace_s: float = 10.0,
        merge_wait_s: float = 120.0,
        config: DriverConfig | None = None,
        output_check: Callable[[TaskLayout], str | None] | None = None,
        telemetry: Telemetry | None = None,
        keys: KeyIndex | None = None,
        turns: Turns | None = None,
    ) -> None:
        self.turns = turns or Turns()
        """The submissions' turns (`simrun_tracker.turns`): a step takes one, ahead of the queued submissions, and
        steps out of it to call the executor, the learner, the planner or the task key index, to check outputs,
        and to save a record."""
        self.runs = runs
        self.output_check = output_check or (lambda task: None)
        """Why a task fails for the size of what it wrote (`Guard.output_failure`), or None: measured when its pods
        succeeded and, while it runs, every `config.output_check_s`."""
        self.telemetry = telemetry or Telemetry.off()
        # The key index's lock is shared with the submissions' lookups of earlier results, which hold it outside
        # their turns: waited for in the driver's turn, it would hold up every submission.
        self.keys = stepping_out(keys, self.turns) if keys is not None else None
        self.executor = stepping_out(executor, self.turns)
        self.learner = stepping_out(learner, self.turns)
        self.environments = environments
        self.planner = planner
        self.grace_s = grace_s
        self.merge_wait_s = merge_wait_s
        self.config = config or DriverConfig()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._dirty: set[str] = set()
        self._timers: list[tuple[float, str]] = []
        self._backoff: dict[str, _Backoff] = {}
        self._merge_seen: dict[tuple[str, str], float] = {}
        self._output_due: dict[tuple[str, str], float] = {}
        """When each running task's folder is measured next against its output bound (`_check_running_output`)."""
        self._task_spans: dict[tuple[str, str], Span] = {}
        """The span of each task whose pods this driver started, ended with the task (lost on a restart)."""
        self._thread: threading.Thread | None = None
        self.steps = 0
        """Steps taken (for tests and benchmarks)."""
        executor.subscribe(self.wake)
        runs.on_change(self._on_save)

    # --- lifecycle -------------------------------------------------------------------------------------------

    def recover(self, records: list[RunRecord]) -> None:
        """Re-applies what each active run's record says to the executor, as if the tracker never stopped."""
        for record in records:
            pods = []
            for task in record.tasks.values():
                workers = set(task.attempts) | set(task.sigkills)
                for worker in sorted(workers | {k.worker for k in record.oom_kills if k.task_id == task.task_id}):
                    kills = [
                        MemoryKill(k.memory_gb, k.per_worker_gb, "recorded")
                        for k in record.oom_kills
                        if k.task_id == task.task_id and k.worker == worker
                    ]
                    pods.append(
                        PodHistory(
                            task.task_id, worker, kills, task.attempts.get(worker, 0), task.sigkills.get(worker, 0)
                        )
                    )
            try:
                self.executor.restore(RunRecovery(record.run_id, record.reservation, pods))
            except SimrunError as exc:
                log.warning("restoring run %s: %s", record.run_id, exc)
            self.wake(record.run_id)

    def start(self) -> Driver:
        self._thread = threading.Thread(target=self._loop, name="simrun-run-driver", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def wake(self, run_id: str) -> None:
        """Asks for a step of a run as soon as the driver is free."""
        with self._lock:
            self._dirty.add(run_id)
        self._wake.set()

    def _on_save(self, run_id: str) -> None:
        # The driver's own saves need no further step; a new run or a cancellation does.
        if threading.current_thread() is not self._thread:
            self.wake(run_id)

    def _after(self, run_id: str, delay_s: float) -> None:
        with self._lock:
            heapq.heappush(self._timers, (time.monotonic() + delay_s, run_id))
        self._wake.set()

    # --- the loop --------------------------------------------------------------------------------------------

    def _loop(self) -> None:
        next_resync = time.monotonic() + self.config.tick_s
        round_left: list[str] = []  # the runs this round of the safety net has still to visit
        while not self._stop.is_set():
            now = time.monotonic()
            with self._lock:
                due = self._dirty
                self._dirty = set()
                while self._timers and self._timers[0][0] <= now:
                    due.add(heapq.heappop(self._timers)[1])
                next_timer = self._timers[0][0] if self._timers else None
            if now >= next_resync:
                # A safety net for a lost event: a bounded share of the active runs each tick, in turn.
                if not round_left:
                    round_left = sorted(self.runs.active_ids(), reverse=True)
                share = self.config.safety_visits_per_tick
                due.update(round_left[-share:])
                del round_left[-share:]
                next_resync = now + self.config.tick_s
            for run_id in sorted(due):
                if self._stop.is_set():
                    return
                self.step(run_id)
            wait = next_resync - time.monotonic()
            if next_timer is not None:
                wait = min(wait, next_timer - time.monotonic())
            self._wake.wait(max(wait, 0.0))
            self._wake.clear()

    def step(self, run_id: str) -> None:
        """One step of a run, with its errors classified; a run backing off waits, unless a cancellation came."""
        lock = self.runs.run_lock(run_id)
        with lock:
            try:
                record = self.runs.get(run_id)
            except SimrunError:
                return
            if record.state.final:
                self.runs.forget_lock(run_id)
                return
            backoff = self._backoff.get(run_id)
            # A cancellation requested since the run began backing off is carried out now, not after the wait.
            waits = backoff is not None and (backoff.cancelling or not record.cancel_requested)
            if backoff is not None and waits and time.monotonic() < backoff.next_try:
                self._after(run_id, backoff.next_try - time.monotonic())
                return
            self.steps += 1
            try:
                with self.turns.turn(first=True):
                    self._take_step(record)
            except Exception:
                # Recording the failure failed too (the record cannot be written, the executor refuses to end the
                # run): the driver goes on with the other runs and comes back to this one after the longest wait.
                log.exception("run %s: its failure could not be recorded", run_id)
                now = time.monotonic()
                held = self._backoff.setdefault(run_id, _Backoff(1, now, now))
                held.next_try = now + self.config.backoff_max_s
                held.cancelling = record.cancel_requested
                self._after(run_id, self.config.backoff_max_s)

    def _take_step(self, record: RunRecord) -> None:
        try:
            delay = self._advance(record)
        except SimrunError as exc:
            if exc.transient:
                self._failed_transiently(record, str(exc))
            else:
                self._fail_run(record, str(exc))
            return
        except Exception as exc:
            log.exception("a step of run %s failed", record.run_id)
            self._failed_transiently(record, f"{type(exc).__name__}: {exc}")
            return
        self._backoff.pop(record.run_id, None)
        if delay is not None:
            self._after(record.run_id, delay)

    def _failed_transiently(self, record: RunRecord, error: str) -> None:
        now = time.monotonic()
        backoff = self._backoff.setdefault(record.run_id, _Backoff(0, now, now))
        backoff.failures += 1
        backoff.cancelling = record.cancel_requested
        if now - backoff.first_failure >= self.config.give_up_s:
            self._fail_run(record, f"failing for {now - backoff.first_failure:.0f} s: {error}")
            return
        delay = min(self.config.backoff_initial_s * 2 ** (backoff.failures - 1), self.config.backoff_max_s)
        backoff.next_try = now + delay
        log.warning("run %s: a step failed (%s); tried again in %.1f s", record.run_id, error, delay)
        self._after(record.run_id, delay)

    def _fail_run(self, record: RunRecord, message: str) -> None:
        """Fails a run whose step cannot succeed, keeping what the step changed."""
        self._backoff.pop(record.run_id, None)
        try:
            self.executor.stop_pods(record.run_id)
        except Exception:
            log.exception("stopping the pods of failed run %s", record.run_id)
        self._finish(record, RunState.FAILED, message)

    # --- one step --------------------------------------------------------------------------------------------

    def _advance(self, record: RunRecord) -> float | None:
        """Moves a run one step toward its goal; returns when to look again without an event (None: on events)."""
        before = record.model_dump(exclude={"updated_at"})
        if record.cancel_requested:
            self.executor.stop_pods(record.run_id)
            self._finish(record, RunState.CANCELLED, record.message or "cancelled")
            return None
        if record.state == RunState.SUBMITTING:
            delay = self._prepare(record)
            if record.state == RunState.SUBMITTING or record.state.final:
                self._save_if_changed(record, before)
                return delay
        run = self.runs.layout.run(record.run_id)
        pods_by_task: dict[str, list[PodStatus]] = {}
        for pod in self.executor.pods(record.run_id):
            pods_by_task.setdefault(pod.spec.task_id, []).append(pod)
        if not pods_by_task and self.executor.ordering == TaskOrdering.ADAPTER:
            self._hand_over_again(record)
        delay = None
        failure: str | None = None
        for task in record.tasks.values():
            if task.state.final:
                continue
            if task.state == TaskState.PENDING:
                upstream = {record.tasks[ref.split(".")[0]].state for ref in task.inputs.values()}
                if upstream - {TaskState.SUCCEEDED}:
                    continue
                task.state = TaskState.QUEUED
            pods = pods_by_task.get(task.task_id, [])
            if not pods:
                if self.executor.ordering == TaskOrdering.DRIVER:
                    self._start_task_span(record, task)
                    self.executor.start_pods(task_pods(record, task, self._environment_id(record), self.grace_s))
                continue
            self._record_pods(record, task, pods)
            wait = self._follow_task(record, task, pods, run)
            if wait is not None:
                delay = wait if delay is None else min(delay, wait)
            if task.state == TaskState.FAILED:
                failure = f"task {task.task_id} failed: {task.message}"
                break
        if record.state == RunState.QUEUED and any(t.state == TaskState.RUNNING for t in record.tasks.values()):
            record.state = RunState.RUNNING
        if failure is not None:
            self.executor.stop_pods(record.run_id)
            self._finish(record, RunState.FAILED, failure)
            return None
        if all(t.state == TaskState.SUCCEEDED for t in record.tasks.values()):
            self._finish(record, RunState.SUCCEEDED, "")
            return None
        self._save_if_changed(record, before)
        return delay

    def _prepare(self, record: RunRecord) -> float | None:
        """A submitting run: wait for its environment, plan it if it was not planned, queue it."""
        environment = self.environments.get(self._environment_id(record))
        if environment.state == EnvironmentState.BUILDING:
            record.message = f"building environment {environment.environment_id}" + (
                f": {environment.message}" if environment.message else ""
            )
            return BUILD_POLL_S
        if environment.state == EnvironmentState.FAILED:
            self._finish(
                record,
                RunState.FAILED,
                f"environment {environment.environment_id} failed: {environment.message or 'no reason given'}",
            )
            return None
        self.environments.write_run_lock(record.run_id, environment.environment_id)
        self._record_span(record, f"environment {environment.environment_id}", record.created_at, datetime.now(UTC))
        if any(task.plan is None for task in record.tasks.values()):
            with self.turns.outside():  # the model's describer runs its code
                self.planner(record)
        record.state = RunState.QUEUED
        record.message = ""
        if self.executor.ordering == TaskOrdering.ADAPTER:
            self.executor.start_run(run_spec(record, environment.environment_id, self.grace_s, environment.image))
        return None

    def _hand_over_again(self, record: RunRecord) -> None:
        """A planned run the adapter does not know (a restart before its Workflow was made): handed over again.

        Only the environment knows the run's image; `start_run` leaves a run it knows as it is and adopts a
        Workflow that exists already, so nothing runs twice.
        """
        if all(task.state.final for task in record.tasks.values()):
            return
        environment = self.environments.get(self._environment_id(record))
        self.executor.start_run(run_spec(record, environment.environment_id, self.grace_s, environment.image))

    @staticmethod
    def _environment_id(record: RunRecord) -> str:
        assert record.environment, f"run {record.run_id} has no environment"
        return record.environment

    def _record_pods(self, record: RunRecord, task: TaskRecord, pods: list[PodStatus]) -> None:
        """Keeps in the record what a restarted tracker must re-apply (attempts, SIGKILLs and memory kills per
        worker), the memory the executor measured in each worker's pods, which bounds what its reports claim, and
        the node its latest attempt was placed on and the memory it runs at (kept once the pod has left it)."""
        for pod in pods:
            if pod.node and task.nodes.get(pod.spec.worker) != pod.node:
                task.nodes[pod.spec.worker] = pod.node
            if pod.attempts and pod.memory_gb and task.memory_gb.get(pod.spec.worker) != pod.memory_gb:
                task.memory_gb[pod.spec.worker] = pod.memory_gb
            if pod.attempts and task.attempts.get(pod.spec.worker, 0) != pod.attempts:
                task.attempts[pod.spec.worker] = pod.attempts
            if pod.sigkills and task.sigkills.get(pod.spec.worker, 0) != pod.sigkills:
                task.sigkills[pod.spec.worker] = pod.sigkills
            measured = pod.peak_memory_gb
            if measured is not None and measured > task.measured_memory_gb.get(pod.spec.worker, -1.0):
                task.measured_memory_gb[pod.spec.worker] = round(measured, 6)
            known = [k for k in record.oom_kills if k.task_id == task.task_id and k.worker == pod.spec.worker]
            for kill in pod.memory_kills[len(known) :]:
                record.oom_kills.append(
                    OomKill(
                        task_id=task.task_id,
                        worker=pod.spec.worker,
                        memory_gb=kill.memory_gb,
                        per_worker_gb=kill.per_worker_gb,
                    )
                )

    def _follow_task(self, record: RunRecord, task: TaskRecord, pods: list[PodStatus], run: RunLayout) -> float | None:
        """Updates a task from its pods: running, done (split: merged), or failed (by its coordinator)."""
        coordinator = next((p for p in pods if p.spec.worker == COORDINATOR), None)
        if coordinator is None:
            return None
        if any(p.phase == PodPhase.RUNNING for p in pods) and task.state == TaskState.QUEUED:
            task.state = TaskState.RUNNING
            task.started_at = datetime.now(UTC)
        if coordinator.phase == PodPhase.RUNNING and task.state == TaskState.RUNNING:
            return self._check_running_output(record, task, run)
        if coordinator.phase == PodPhase.SUCCEEDED:
            if not task.split:
                self._end_succeeded(record, task, run)
            elif run.task(task.task_id).merge_marker.exists():
                self.executor.stop_pods(record.run_id, task.task_id)
                self._end_succeeded(record, task, run)
            elif not coordinator_merges(task):
                self._follow_merge_pod(record, task, pods)
            else:
                seen = self._merge_seen.setdefault((record.run_id, task.task_id), time.monotonic())
                if time.monotonic() - seen > self.merge_wait_s:
                    self._end_task(
                        record,
                        task,
                        TaskState.FAILED,
                        f"the coordinator succeeded but no merge marker appeared within {self.merge_wait_s:g} s",
                    )
                else:
                    return MERGE_POLL_S
        elif coordinator.phase == PodPhase.FAILED:
            self._end_task(record, task, TaskState.FAILED, self._failure_message(run, task, coordinator))
        return None

    def _check_running_output(self, record: RunRecord, task: TaskRecord, run: RunLayout) -> float:
        """Measures a running task's folder against its output bound every `output_check_s` (and at least 20 times
        what the last measurement took, so a task of many files costs the driver at most a twentieth of its time):
        a task past it has its pods stopped and fails, so no task fills the disk before it ends. Returns the seconds
        until the next measurement."""
        key = (record.run_id, task.task_id)
        now = time.monotonic()
        due = self._output_due.setdefault(key, now + self.config.output_check_s)
        if now < due:
            return due - now
        with self.turns.outside():  # as long as the task's outputs are many
            too_large = self.output_check(run.task(task.task_id))
        took = time.monotonic() - now
        if too_large:
            self.executor.stop_pods(record.run_id, task.task_id)
            self._end_task(record, task, TaskState.FAILED, too_large)
            return 0.0
        wait = max(self.config.output_check_s, 20 * took)
        self._output_due[key] = time.monotonic() + wait
        return wait

    def _end_succeeded(self, record: RunRecord, task: TaskRecord, run: RunLayout) -> None:
        """A task whose pods succeeded: done, unless it wrote more than its output bound."""
        with self.turns.outside():  # as long as the task's outputs are many
            too_large = self.output_check(run.task(task.task_id))
        self._end_task(record, task, TaskState.FAILED if too_large else TaskState.SUCCEEDED, too_large or "")

    @staticmethod
    def _failure_message(run: RunLayout, task: TaskRecord, pod: PodStatus) -> str:
        """The runtime's own account of a failure (the unit, the exception, the worker), else the executor's.

        `failure.json` is in the task's folder, which its pods write: it is read without following links.
        """
        layout = run.task(task.task_id)
        try:
            data = json.loads(read_beneath(layout.root, layout.failure.name, limit=64 * 1024))
            message = str(data.get("message", "")).strip() if isinstance(data, dict) else ""
        except (OSError, ValueError):
            message = ""
        if message:
            return printable(message, FAILURE_MESSAGE_CHARS)
        return pod.message or f"exit code {pod.exit_code}"

    def _follow_merge_pod(self, record: RunRecord, task: TaskRecord, pods: list[PodStatus]) -> None:
        """A plan recorded before the coordinator merged: the merge pod runs once the coordinator succeeded."""
        merge = next((p for p in pods if p.spec.worker == MERGE_WORKER), None)
        if merge is None:
            if self.executor.ordering == TaskOrdering.DRIVER:
                self.executor.start_pods([merge_pod(record, task, self._environment_id(record), self.grace_s)])
        elif merge.phase == PodPhase.FAILED:
            self._end_task(record, task, TaskState.FAILED, f"the merge failed: {merge.message}")
        elif merge.phase == PodPhase.SUCCEEDED:
            self._end_task(record, task, TaskState.FAILED, "the merge pod succeeded but wrote no merge marker")

    def _end_task(self, record: RunRecord, task: TaskRecord, state: TaskState, message: str) -> None:
        task.state = state
        task.message = message
        task.ended_at = datetime.now(UTC)
        self._merge_seen.pop((record.run_id, task.task_id), None)
        self._output_due.pop((record.run_id, task.task_id), None)
        self._end_task_span(record, task)
        try:
            self.learner.record_reports(record, task.task_id, state == TaskState.SUCCEEDED)
        except Exception:
            # Observations are worth keeping, not worth failing a run over: the learner may be down.
            log.exception("recording observations of %s/%s failed", record.run_id, task.task_id)
        if self.keys is not None:
            self.keys.update(record)

    # --- spans -----------------------------------------------------------------------------------------------

    def _record_span(
        self, record: RunRecord, name: str, start: datetime, end: datetime | None, **attributes: Any
    ) -> None:
        if self.telemetry.recording and record.traceparent:
            self.telemetry.record_span(
                name,
                parent=record.traceparent,
                start=start,
                end=end,
                attributes={"simrun.run_id": record.run_id, **attributes},
            )

    def _start_task_span(self, record: RunRecord, task: TaskRecord) -> None:
        """The task's span, started with its pods; its context is the pods' TRACEPARENT."""
        if not (self.telemetry.recording and record.traceparent):
            return
        span = self.telemetry.tracer().start_span(
            f"task {task.task_id}",
            context=context_from_traceparent(record.traceparent),
            attributes={"simrun.run_id": record.run_id, "simrun.task_id": task.task_id, "simrun.type": task.type},
        )
        self._task_spans[(record.run_id, task.task_id)] = span
        task.traceparent = traceparent_of(span)

    def _end_task_span(self, record: RunRecord, task: TaskRecord) -> None:
        """Each pod attempt becomes a span from its worker report, under the task's span, which then ends (one
        recorded afresh from the record's times when this driver did not start it, e.g. after a restart)."""
        span = self._task_spans.pop((record.run_id, task.task_id), None)
        if not (self.telemetry.recording and record.traceparent):
            return
        try:
            reports = load_reports(self.runs.layout.run(record.run_id).task(task.task_id))
        except (OSError, ValueError):
            log.exception("reading the worker reports of %s/%s failed", record.run_id, task.task_id)
            reports = []
        parent = task.traceparent or record.traceparent
        for report in reports:
            # A report still `running` after its task ended is a pod killed without a word (SIGKILL).
            failed = report.ended in (WorkerEnd.FAILED, WorkerEnd.RUNNING)
            self.telemetry.record_span(
                f"pod {report.worker}",
                parent=within_trace(report.traceparent, parent) or parent,
                start=report.started_at,
                end=report.ended_at or task.ended_at,
                attributes={
                    "simrun.run_id": record.run_id,
                    "simrun.task_id": task.task_id,
                    "simrun.worker": report.worker,
                    "simrun.role": report.role,
                    "simrun.units": report.unit_seconds.count if report.unit_seconds else len(report.units),
                    "simrun.peak_memory_gb": report.peak_memory_gb,
                    "simrun.exit_code": report.exit_code if report.exit_code is not None else -1,
                    "simrun.ended": report.ended.value,
                },
                error=f"{report.ended.value}: exit code {report.exit_code}" if failed else None,
            )
        attributes = {"simrun.state": task.state.value}
        if span is not None:
            span.set_attributes(attributes)
            span.end()
        else:
            self._record_span(
                record,
                f"task {task.task_id}",
                task.started_at or task.ended_at or datetime.now(UTC),
                task.ended_at,
                **attributes,
            )

    def _finish(self, record: RunRecord, state: RunState, message: str) -> None:
        for task in record.tasks.values():
            if not task.state.final:
                task.state = TaskState.CANCELLED
                task.ended_at = datetime.now(UTC)
                self._end_task_span(record, task)
        if self.keys is not None:
            self.keys.update(record)
        record.state = state
        record.message = message
        record.ended_at = datetime.now(UTC)
        if record.reservation:
            self.executor.release(record.run_id)
        for seen in (self._merge_seen, self._output_due):
            for key in [k for k in seen if k[0] == record.run_id]:
                del seen[key]
        with self.turns.outside():  # a final state is fsynced
            self.runs.save(record)
        try:
            self.executor.forget(record.run_id)
        except Exception:
            log.exception("the executor could not forget ended run %s", record.run_id)

    def _save_if_changed(self, record: RunRecord, before: dict[str, object]) -> None:
        if record.model_dump(exclude={"updated_at"}) != before:
            # Outside the turn: writing the record is mostly the kernel's work (a new file renamed over the old;
            # a final state is fsynced too), which then overlaps a submission's turn on the other core.
            with self.turns.outside():
                self.runs.save(record)
