"""The run tracker: records runs in the store, drives their tasks' pods through the executor, answers queries."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import secrets
import shutil
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from simrun_core.errors import FailedPrecondition, InvalidArgument, NotFound, PermissionDenied
from simrun_core.identity import Identity
from simrun_core.resources import SplitMode
from simrun_core.workflow import Workflow, parse_workflow
from simrun_planner import Node
from simrun_runtime.files import write_json_atomic
from simrun_runtime.layout import RunLayout, StoreLayout
from simrun_runtime.record import (
    Identity as RecordIdentity,
)
from simrun_runtime.record import (
    OomKill,
    RunRecord,
    RunState,
    SnapshotRef,
    TaskRecord,
    TaskState,
)
from simrun_runtime.reports import ProgressReader

from simrun_tracker.describer import TypeDescriber
from simrun_tracker.executor import Executor, PodPhase, PodStatus
from simrun_tracker.index import RunIndex, row_from_record, task_summaries
from simrun_tracker.pods import MERGE_WORKER, coordinator_merges, merge_pod, task_pods
from simrun_tracker.ports import EnvironmentPort, LearnerPort
from simrun_tracker.submission import PlannedTask, check_snapshots, describe_tasks, plan_tasks, reserving

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Submission:
    """A workflow to run, with its snapshots and the submission's options."""

    workflow: str
    snapshots: list[SnapshotRef]
    group: str = ""
    mode: SplitMode | None = None
    reserve: str = ""


@dataclass(frozen=True)
class TaskProgress:
    """How far a task is: units done of its ledger, and its state."""

    task_id: str
    units: int | None
    units_done: int
    state: TaskState


@dataclass(frozen=True)
class TaskEstimate:
    """A task's plan and resources, and its seconds once its units' seconds are learned."""

    planned: PlannedTask
    seconds: float | None


@dataclass(frozen=True)
class Comparison:
    """Summary values of runs side by side: one row per task and (dotted) summary key."""

    run_ids: list[str]
    rows: list[tuple[str, str, list[str]]]


def new_run_id() -> str:
    """A sortable, DNS-safe run id: UTC time and six random hex digits."""
    return f"{datetime.now(UTC):%Y%m%d-%H%M%S}-{secrets.token_hex(3)}"


class RunTracker:
    """Everything about runs: submission, the background driver, cancellation, watching, logs, comparison."""

    def __init__(
        self,
        store: StoreLayout,
        executor: Executor,
        learner: LearnerPort,
        describer: TypeDescriber,
        environments: EnvironmentPort,
        *,
        grace_s: float = 10.0,
        merge_wait_s: float = 120.0,
        tick_s: float = 0.2,
    ) -> None:
        self.store = store
        self.executor = executor
        self.learner = learner
        self.describer = describer
        self.environments = environments
        self.grace_s = grace_s
        self.merge_wait_s = merge_wait_s
        self.tick_s = tick_s
        store.runs.mkdir(parents=True, exist_ok=True)
        self.index = RunIndex(store.index)
        self._lock = threading.RLock()
        self._active: dict[str, RunRecord] = {}
        self._merge_seen: dict[tuple[str, str], float] = {}
        self._progress: dict[tuple[str, str], ProgressReader] = {}
        self._progress_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        for record in self.index.rebuild(store):
            if not record.state.final:
                self._active[record.run_id] = record

    # --- lifecycle -------------------------------------------------------------------------------------------

    def start(self) -> RunTracker:
        """Starts the driver, which continues the runs the records say are not final."""
        self._thread = threading.Thread(target=self._drive, name="simrun-run-driver", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        """Stops the driver and the executor (its pods stop; a restarted tracker starts them again)."""
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=10)
        self.executor.close()
        self.describer.close()
        self.learner.close()
        self.index.close()

    # --- submission ------------------------------------------------------------------------------------------

    def _plan(
        self,
        workflow: Workflow,
        snapshots: list[SnapshotRef],
        identity: Identity,
        mode: SplitMode | None,
        run_id: str,
        reserve: str | None,
    ) -> list[PlannedTask]:
        model_root = check_snapshots(self.store, snapshots)
        probe = RunRecord(run_id=run_id, identity=_record_identity(identity), snapshots=snapshots)
        interpreter = self.environments.interpreter(probe)
        descriptions = describe_tasks(self.describer, interpreter, model_root, workflow)
        nodes = reserving(self.executor.nodes(), run_id, reserve)
        return plan_tasks(
            workflow, descriptions, self.learner, nodes, snapshots[0].name, identity.priority, mode, run_id
        )

    def submit(self, submission: Submission, identity: Identity) -> RunRecord:
        """Validates, resolves and plans a workflow, records the run as `submitting` and returns at once.

        Raises:
            InvalidArgument: a bad workflow (unknown type, misspelled setting, unknown port, a cycle).
            NotFound: a snapshot not in the store, or an unknown node to reserve.
            FailedPrecondition: a task that fits no node, or a node reserved by another run.
        """
        run_id = new_run_id()
        workflow = parse_workflow(submission.workflow)
        reserve = submission.reserve or workflow.spec.reserve
        planned = self._plan(workflow, submission.snapshots, identity, submission.mode, run_id, reserve)
        tasks: dict[str, TaskRecord] = {}
        for task in planned:
            tasks[task.task_id] = TaskRecord(
                task_id=task.task_id,
                type=task.description.type,
                inputs=dict(workflow.spec.tasks[task.task_id].inputs),
                split=task.description.split,
                mode=workflow.mode_of(task.task_id, submission.mode).value,
                units=task.plan.units,
                cost_value=task.description.cost_value,
                plan=dataclasses.asdict(task.plan),
                resources=dataclasses.asdict(task.resources),
            )
        record = RunRecord(
            run_id=run_id,
            group=submission.group or workflow.spec.group or "default",
            workflow={"name": workflow.spec.name, "text": submission.workflow},
            identity=_record_identity(identity),
            tasks=tasks,
            snapshots=submission.snapshots,
            reservation=reserve,
        )
        if reserve:
            self.executor.reserve(reserve, run_id)
        # Under the lock: once `runs/<id>/` is in place, `get` and `cancel` must find the run active.
        with self._lock:
            try:
                self._write_new_run(record, workflow, planned)
            except BaseException:
                if reserve:
                    self.executor.release(run_id)
                raise
            self._active[run_id] = record
            self.index.put(row_from_record(record, {}))
            return record.model_copy(deep=True)

    def _write_new_run(self, record: RunRecord, workflow: Workflow, planned: list[PlannedTask]) -> None:
        """Writes `runs/<id>/` aside and renames it into place, so a run appears whole or not at all."""
        final = self.store.run(record.run_id)
        staging = self.store.run_staging(record.run_id)
        provenance = {
            "run_id": record.run_id,
            "snapshots": [s.model_dump(mode="json") for s in record.snapshots],
        }
        try:
            for task in planned:
                layout = staging.task(task.task_id)
                layout.root.mkdir(parents=True)
                write_json_atomic(layout.settings, workflow.spec.tasks[task.task_id].settings)
                write_json_atomic(layout.provenance, provenance)
            record.save(staging)
            os.rename(staging.root, final.root)
        except BaseException:
            shutil.rmtree(staging.root, ignore_errors=True)
            raise

    def estimate(
        self, workflow_text: str, snapshots: list[SnapshotRef], identity: Identity, mode: SplitMode | None
    ) -> list[TaskEstimate]:
        """Plans a workflow without running it and estimates each split task's seconds."""
        workflow = parse_workflow(workflow_text)
        planned = self._plan(workflow, snapshots, identity, mode, "estimate", workflow.spec.reserve)
        estimates = []
        for task in planned:
            seconds = None
            if task.description.split and task.plan.units:
                seconds = self.learner.estimate(task.key, task.plan.units, task.plan.pods, task.plan.shape.processes)
            estimates.append(TaskEstimate(task, seconds))
        return estimates

    # --- queries ---------------------------------------------------------------------------------------------

    def get(self, run_id: str) -> RunRecord:
        with self._lock:
            if run_id in self._active:
                return self._active[run_id].model_copy(deep=True)
        layout = self.store.run(run_id)
        if not _valid_run_id(run_id) or not layout.record.is_file():
            raise NotFound(f"no run {run_id!r}: `simrun list` shows the runs")
        return RunRecord.load(layout)

    def list(self, group: str = "", state: str = "", owner: str = "") -> list[str]:
        """Run ids newest first, filtered by group, state and owner (person or agent)."""
        if state and state not in {s.value for s in RunState}:
            raise InvalidArgument(f"unknown state {state!r}: one of {', '.join(s.value for s in RunState)}")
        return [row.run_id for row in self.index.list(group, state, owner)]

    def progress(self, record: RunRecord) -> list[TaskProgress]:
        """Units done per task, from each task's `progress.jsonl` (read on from where the last call stopped)."""
        run = self.store.run(record.run_id)
        result = []
        for task in record.tasks.values():
            done = 0
            if task.split:
                key = (record.run_id, task.task_id)
                with self._progress_lock:
                    reader = self._progress.get(key)
                    if reader is None:
                        reader = self._progress[key] = ProgressReader(run.task(task.task_id).progress)
                    done = reader.units_done()
                    if record.state.final:
                        del self._progress[key]
            elif task.state == TaskState.SUCCEEDED:
                done = 1
            result.append(TaskProgress(task.task_id, task.units, done, task.state))
        return result

    def watch(self, run_id: str, poll_s: float = 0.25) -> Iterator[tuple[RunRecord, list[TaskProgress]]]:
        """Yields the run and its progress whenever either changes, the last time once it has ended."""
        last: tuple[Any, ...] | None = None
        while True:
            record = self.get(run_id)
            progress = self.progress(record)
            marker = (record.updated_at, tuple(progress))
            if marker != last:
                last = marker
                yield record, progress
            if record.state.final:
                return
            time.sleep(poll_s)

    def logs(
        self, run_id: str, task_id: str, worker: str = "", follow: bool = False, poll_s: float = 0.25
    ) -> Iterator[tuple[str, str]]:
        """Yields (pod log name, new lines) of a task's pods; with `follow`, until the task ends."""
        record = self.get(run_id)
        if task_id not in record.tasks:
            raise NotFound(f"run {run_id} has no task {task_id!r} (its tasks: {', '.join(record.tasks)})")
        logs_dir = self.store.run(run_id).task(task_id).logs
        offsets: dict[str, int] = {}
        while True:
            paths = sorted(logs_dir.glob(f"{worker or '*'}.log")) if logs_dir.is_dir() else []
            for path in paths:
                with open(path, "rb") as f:
                    f.seek(offsets.get(path.name, 0))
                    data = f.read()
                cut = data.rfind(b"\n") + 1
                if cut:
                    offsets[path.name] = offsets.get(path.name, 0) + cut
                    yield path.name, data[:cut].decode(errors="replace")
            if not follow or self.get(run_id).tasks[task_id].state.final:
                if follow:
                    follow = False
                    continue  # one more pass for the lines written before it ended
                return
            time.sleep(poll_s)

    def compare(self, run_ids: list[str], group: str = "") -> Comparison:
        """Puts the summary values of runs (or of a group's runs, oldest first) side by side."""
        if not run_ids:
            if not group:
                raise InvalidArgument("compare needs run ids or a group")
            run_ids = list(reversed(self.list(group=group)))
            if not run_ids:
                raise NotFound(f"no runs in group {group!r}")
        flat: list[dict[tuple[str, str], str]] = []
        keys: list[tuple[str, str]] = []
        for run_id in run_ids:
            record = self.get(run_id)
            values: dict[tuple[str, str], str] = {}
            for task_id, summary in task_summaries(self.store, record).items():
                for key, value in _flatten(summary):
                    values[(task_id, key)] = json.dumps(value, sort_keys=True)
            for k in values:
                if k not in keys:
                    keys.append(k)
            flat.append(values)
        rows = [(task_id, key, [values.get((task_id, key), "") for values in flat]) for task_id, key in keys]
        return Comparison(run_ids, rows)

    def nodes(self) -> list[Node]:
        return self.executor.nodes()

    # --- cancellation ----------------------------------------------------------------------------------------

    def cancel(self, run_id: str, identity: Identity) -> RunRecord:
        """Cancels a run and stops its pods.

        Raises:
            NotFound: no such run.
            PermissionDenied: another's run, unless the caller is the cluster's owner or the person the
                submitting agent acts for.
            FailedPrecondition: the run has ended already.
        """
        with self._lock:
            record = self.get(run_id)
            submitter = record.identity
            allowed = identity.is_owner or identity.name in (submitter.name, submitter.on_behalf_of)
            if not allowed:
                raise PermissionDenied(
                    f"run {run_id} belongs to {submitter.name}; only they or the owner may cancel it"
                )
            if record.state.final:
                raise FailedPrecondition(f"run {run_id} has ended already ({record.state.value})")
            record = self._active[run_id]
            record.cancel_requested = True
            self.executor.stop_pods(run_id)
            self._finish(record, RunState.CANCELLED, f"cancelled by {identity.name}")
            return record.model_copy(deep=True)

    # --- the driver ------------------------------------------------------------------------------------------

    def _drive(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                run_ids = list(self._active)
            for run_id in run_ids:
                with self._lock:
                    record = self._active.get(run_id)
                    if record is None:
                        continue
                    try:
                        self._advance(record)
                    except Exception:
                        log.exception("driving run %s failed; it is tried again on the next tick", run_id)
                        # What the step changed before it failed is kept, so run.json does not lag behind.
                        self._save_quietly(record)
            self._stop.wait(self.tick_s)

    def _save_quietly(self, record: RunRecord) -> None:
        try:
            self._save(record)
        except Exception:
            log.exception("saving run %s failed", record.run_id)

    def _advance(self, record: RunRecord) -> None:
        """One step of a run: start the tasks whose inputs are done, follow their pods, end the run."""
        run = self.store.run(record.run_id)
        changed = False
        if record.state == RunState.SUBMITTING:
            record.environment = self.environments.interpreter(record)
            record.state = RunState.QUEUED
            changed = True
        interpreter = record.environment or self.environments.interpreter(record)
        failure: str | None = None
        for task in record.tasks.values():
            if task.state.final:
                continue
            upstream = {record.tasks[ref.split(".")[0]].state for ref in task.inputs.values()}
            if task.state == TaskState.PENDING:
                if upstream - {TaskState.SUCCEEDED}:
                    continue
                task.state = TaskState.QUEUED
                changed = True
            pods = [p for p in self.executor.pods(record.run_id) if p.spec.task_id == task.task_id]
            if not pods:
                self.executor.start_pods(task_pods(run, record, task, interpreter, self.grace_s))
                continue
            changed |= self._record_memory_kills(record, task, pods)
            changed |= self._follow_task(record, task, pods, run)
            if task.state == TaskState.FAILED:
                failure = f"task {task.task_id} failed: {task.message}"
                break
        if any(t.state == TaskState.RUNNING for t in record.tasks.values()) and record.state == RunState.QUEUED:
            record.state = RunState.RUNNING
            changed = True
        if failure is not None:
            self.executor.stop_pods(record.run_id)
            self._finish(record, RunState.FAILED, failure)
        elif all(t.state == TaskState.SUCCEEDED for t in record.tasks.values()):
            self._finish(record, RunState.SUCCEEDED, "")
        elif changed:
            self._save(record)

    def _follow_task(self, record: RunRecord, task: TaskRecord, pods: list[PodStatus], run: RunLayout) -> bool:
        """Updates a task from its pods: running, done (split: merged), or failed (by its first pod)."""
        before = (task.state, task.message)
        first = next(p for p in pods if p.spec.worker == "w0")
        if any(p.phase == PodPhase.RUNNING for p in pods) and task.state == TaskState.QUEUED:
            task.state = TaskState.RUNNING
            task.started_at = datetime.now(UTC)
        if first.phase == PodPhase.SUCCEEDED:
            if not task.split:
                self._end_task(record, task, TaskState.SUCCEEDED, "")
            elif run.task(task.task_id).merge_marker.exists():
                self.executor.stop_pods(record.run_id, task.task_id)
                self._end_task(record, task, TaskState.SUCCEEDED, "")
            elif not coordinator_merges(task):
                self._follow_merge_pod(record, task, pods, run)
            else:
                seen = self._merge_seen.setdefault((record.run_id, task.task_id), time.monotonic())
                if time.monotonic() - seen > self.merge_wait_s:
                    self._end_task(
                        record,
                        task,
                        TaskState.FAILED,
                        f"the coordinator succeeded but no merge marker appeared within {self.merge_wait_s:.0f} s",
                    )
        elif first.phase == PodPhase.FAILED:
            self._end_task(record, task, TaskState.FAILED, first.message or f"exit code {first.exit_code}")
        return (task.state, task.message) != before

    def _follow_merge_pod(self, record: RunRecord, task: TaskRecord, pods: list[PodStatus], run: RunLayout) -> None:
        """A plan recorded before the coordinator merged: the merge pod runs once the coordinator succeeded."""
        merge = next((p for p in pods if p.spec.worker == MERGE_WORKER), None)
        if merge is None:
            interpreter = record.environment or self.environments.interpreter(record)
            self.executor.start_pods([merge_pod(run, record, task, interpreter, self.grace_s)])
        elif merge.phase == PodPhase.FAILED:
            self._end_task(record, task, TaskState.FAILED, f"the merge failed: {merge.message}")
        elif merge.phase == PodPhase.SUCCEEDED:
            self._end_task(record, task, TaskState.FAILED, "the merge pod succeeded but wrote no merge marker")

    def _record_memory_kills(self, record: RunRecord, task: TaskRecord, pods: list[PodStatus]) -> bool:
        changed = False
        for pod in pods:
            known = sum(1 for k in record.oom_kills if k.task_id == task.task_id and k.worker == pod.spec.worker)
            for kill in pod.memory_kills[known:]:
                record.oom_kills.append(
                    OomKill(
                        task_id=task.task_id,
                        worker=pod.spec.worker,
                        memory_gb=kill.memory_gb,
                        per_worker_gb=kill.per_worker_gb,
                    )
                )
                changed = True
        return changed

    def _end_task(self, record: RunRecord, task: TaskRecord, state: TaskState, message: str) -> None:
        task.state = state
        task.message = message
        task.ended_at = datetime.now(UTC)
        self._merge_seen.pop((record.run_id, task.task_id), None)
        try:
            self.learner.record_reports(record, task.task_id, state == TaskState.SUCCEEDED)
        except Exception:
            log.exception("recording observations of %s/%s failed", record.run_id, task.task_id)

    def _finish(self, record: RunRecord, state: RunState, message: str) -> None:
        for task in record.tasks.values():
            if not task.state.final:
                task.state = TaskState.CANCELLED
                task.ended_at = datetime.now(UTC)
        record.state = state
        record.message = message
        record.ended_at = datetime.now(UTC)
        if record.reservation:
            self.executor.release(record.run_id)
        self._save(record)
        self._active.pop(record.run_id, None)

    def _save(self, record: RunRecord) -> None:
        record.save(self.store.run(record.run_id))
        summaries = task_summaries(self.store, record) if record.state.final else {}
        self.index.put(row_from_record(record, summaries))


def _record_identity(identity: Identity) -> RecordIdentity:
    return RecordIdentity(
        name=identity.name,
        kind=identity.kind.value,
        on_behalf_of=identity.on_behalf_of,
        priority=identity.priority.value,
    )


def _valid_run_id(run_id: str) -> bool:
    return bool(run_id) and "/" not in run_id and not run_id.startswith(".")


def _flatten(value: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(value, dict):
        for key in value:
            yield from _flatten(value[key], f"{prefix}.{key}" if prefix else str(key))
    else:
        yield prefix or "(value)", value
