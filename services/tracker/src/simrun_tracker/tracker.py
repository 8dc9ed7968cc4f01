"""The run tracker: submission and cancellation over the run store, the driver, and the read side.

The concepts are apart: `runstore` keeps records and their versions, `driver` reconciles active runs with the
executor, `reads` answers queries, and this module validates and records submissions and requests
cancellations, which the driver carries out.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from simrun_core.access import check_labels
from simrun_core.config import DriverConfig
from simrun_core.errors import FailedPrecondition, InvalidArgument, NotFound, PermissionDenied
from simrun_core.identity import Identity, Priority
from simrun_core.key_index import KeyIndex
from simrun_core.resources import SplitMode
from simrun_core.reuse import ReusePolicy
from simrun_core.telemetry import Telemetry, current_traceparent, process_telemetry
from simrun_core.workflow import Workflow, WorkflowCache, parse_workflow
from simrun_planner import Node
from simrun_runtime.files import json_bytes, write_bytes_atomic, write_bytes_new
from simrun_runtime.layout import PROVENANCE, SETTINGS, RunLayout, StoreLayout, read_beneath
from simrun_runtime.record import Identity as RecordIdentity
from simrun_runtime.record import ReusedFrom, RunRecord, SnapshotRef, TaskRecord, TaskState

from simrun_tracker.describer import TypeDescriber
from simrun_tracker.driver import CANCELLED_BY, Driver
from simrun_tracker.executor import Executor
from simrun_tracker.guard import Guard
from simrun_tracker.ports import Environment, EnvironmentPort, EnvironmentState, LearnerPort, LocalInterpreters
from simrun_tracker.reads import Comparison, Hangup, RunReader, TaskProgress
from simrun_tracker.reuse import (
    ReuseRequest,
    SnapshotKeys,
    apply_reuse,
    caller_identity,
    check_request,
    find_sources,
    keys_of,
    load_record,
    unit_keys_of,
    units_reused,
    write_unit_keys,
)
from simrun_tracker.runstore import RunStore
from simrun_tracker.submission import PlannedTask, check_snapshots, describe_tasks, plan_tasks, reserving
from simrun_tracker.turns import Turns

__all__ = [
    "Comparison",
    "ReuseRequest",
    "RunTracker",
    "Submission",
    "TaskEstimate",
    "TaskProgress",
    "new_run_id",
]

log = logging.getLogger(__name__)

CANCEL_WAIT_S = 10.0
"""Seconds `cancel` waits for the driver to carry the cancellation out before it answers."""
MAX_REQUEST_ID_CHARS = 200
"""The longest request id a submission may carry (a UUID is 36): it is kept in the run's record and the index."""
REQUEST_LOCKS = 64
"""Locks that serialize submissions with the same request id, shared by hash (a lock per id would never go)."""


@dataclass(frozen=True)
class Submission:
    """A workflow to run, with its snapshots and the submission's options."""

    workflow: str
    snapshots: list[SnapshotRef]
    group: str = ""
    mode: SplitMode | None = None
    reserve: str = ""
    request_id: str = ""
    """The submitter's key for this submission: a retry with the same key returns the first run."""
    reuse: ReusePolicy = ReusePolicy.ANY
    resume_from: str = ""
    """A run to resume: its results are reused first."""
    rerun: tuple[str, ...] = ()
    """Tasks computed again even where an earlier result has their key."""

    @property
    def reuse_request(self) -> ReuseRequest:
        return ReuseRequest(self.reuse, self.resume_from, self.rerun)


@dataclass(frozen=True)
class TaskEstimate:
    """A task's plan and resources, its seconds once its units' seconds are learned, and what it would reuse."""

    planned: PlannedTask
    seconds: float | None
    reused_from: ReusedFrom | None = None


TASK_FILE_BYTES = 64 << 20
"""The most of a task's `settings.json` a starting server reads to see whether it is whole."""


def _whole_json(folder: Path, name: str) -> bool:
    """Whether a file of a task's folder is there, a regular file and whole (parses as JSON). The folder is its
    pods' to write: read without following links (a link or a FIFO is not whole), at most `TASK_FILE_BYTES`."""
    try:
        json.loads(read_beneath(folder, name, limit=TASK_FILE_BYTES))
    except (OSError, ValueError):  # UnsafePath is a ValueError
        return False
    return True


def new_run_id() -> str:
    """A sortable, DNS-safe run id: UTC time and six random hex digits."""
    return f"{datetime.now(UTC):%Y%m%d-%H%M%S}-{secrets.token_hex(3)}"


class RunTracker:
    """Runs: submission, cancellation, and (through the driver and the read side) their progress and queries."""

    def __init__(
        self,
        store: StoreLayout,
        executor: Executor,
        learner: LearnerPort,
        describer: TypeDescriber,
        environments: EnvironmentPort,
        interpreters: LocalInterpreters,
        *,
        grace_s: float = 10.0,
        merge_wait_s: float = 120.0,
        driver: DriverConfig | None = None,
        index_path: Path | None = None,
        guard: Guard | None = None,
        telemetry: Telemetry | None = None,
    ) -> None:
        self.store = store
        self.telemetry = telemetry or process_telemetry("simrun-tracker")
        self.executor = executor
        self.learner = learner
        self.describer = describer
        self.environments = environments
        self.interpreters = interpreters
        self.guard = guard or Guard()
        """The read policy and the bounds (`Guard`): submission, reads and the driver check requests with it."""
        self.runs = RunStore(store, index_path)
        # Beside the run index (a cache, rebuilt from the records at start).
        self.keys = KeyIndex(store, (index_path or store.index).with_name("task-keys.sqlite"))
        self.snapshot_keys = SnapshotKeys(store)
        self.workflows = WorkflowCache()
        """The workflows of the texts submitted lately, parsed once."""
        self.reader = RunReader(self.runs, executor)
        self.turns = Turns()
        """Turns for the server's own work (`simrun_tracker.turns`): submissions in the order they came, the
        driver's steps ahead of them; each steps out to wait on something else."""
        self.driver = Driver(
            self.runs,
            executor,
            learner,
            environments,
            self._plan_recorded,
            grace_s=grace_s,
            merge_wait_s=merge_wait_s,
            config=driver,
            output_check=self.guard.output_failure,
            telemetry=self.telemetry,
            keys=self.keys,
            turns=self.turns,
        )
        self._request_locks = [threading.Lock() for _ in range(REQUEST_LOCKS)]
        self._ids_lock = threading.Lock()
        self._ids_in_flight: set[str] = set()
        active = self.runs.load(self.keys.rebuild)
        for record in active:
            self._restore_task_files(record)
        self.driver.recover(active)

    # --- lifecycle -------------------------------------------------------------------------------------------

    def start(self) -> RunTracker:
        """Starts the driver, which continues the runs the records say are not final."""
        self.driver.start()
        return self

    def close(self) -> None:
        """Stops the driver and the read side, then releases the ports (what the executor does to pods is its own)."""
        self.driver.stop()
        self.reader.close()
        self.executor.close()
        self.describer.close()
        self.learner.close()
        self.environments.close()
        self.runs.close()
        self.keys.close()

    # --- submission ------------------------------------------------------------------------------------------

    def submit(self, submission: Submission, identity: Identity) -> RunRecord:
        """Validates, resolves and plans a workflow, records the run as `submitting` and returns at once.

        While the run's environment builds, the workflow is checked for its shape only; the driver describes and
        plans its tasks once the environment is ready, and fails the run with the reason if they are invalid.

        Raises:
            InvalidArgument: a bad workflow (unknown type, misspelled setting, unknown port, a cycle), or a model
                whose dependencies cannot be locked.
            NotFound: a snapshot not in the store, or an unknown node to reserve.
            FailedPrecondition: a task that fits no node, a node reserved by another run, a failed environment.
        """
        check_labels(request_id=submission.request_id)
        if not submission.request_id:
            return self._submit(submission, identity)
        if len(submission.request_id) > MAX_REQUEST_ID_CHARS:
            raise InvalidArgument(
                f"the request id is {len(submission.request_id)} characters, more than {MAX_REQUEST_ID_CHARS}: "
                "pick a shorter one (a UUID is 36)"
            )
        with self._request_lock(identity.name, submission.request_id):
            earlier = self.runs.index.find_request(identity.name, submission.request_id)
            if earlier is not None:
                return self.runs.get(earlier)
            return self._submit(submission, identity)

    def _request_lock(self, name: str, request_id: str) -> threading.Lock:
        return self._request_locks[hash((name, request_id)) % REQUEST_LOCKS]

    def _submit(self, submission: Submission, identity: Identity) -> RunRecord:
        """Prepares the run in the submission's turn, then writes it aside and makes it durable and visible after
        it: making files is mostly the kernel's work, which then overlaps the next submission's turn."""
        record: RunRecord | None = None
        run_id = self._new_run_id()
        try:
            with self.turns.turn():
                record, planned = self._prepare(submission, identity, run_id)

            def write_tasks(staging: RunLayout) -> None:
                assert record is not None
                if planned is not None:
                    self._reuse(record, staging, identity, planned)
                    self._write_reused_task_files(staging, record, aside=True)

            staging = self.runs.stage(record, write_tasks)
            created = self.runs.place(record, staging)
        except BaseException:
            if record is not None and record.reservation:  # `_prepare` reserves last: its record means reserved
                self.executor.release(record.run_id)
            raise
        finally:
            with self._ids_lock:
                self._ids_in_flight.discard(run_id)
        self.keys.update(created)
        return created

    def _new_run_id(self) -> str:
        """A run id that no run of the store has and no other submission holds: ids of the same second differ
        only by six random hex digits, which a few hundred submissions a second share now and then."""
        with self._ids_lock:
            while True:
                run_id = new_run_id()
                if run_id not in self._ids_in_flight and not os.path.lexists(self.store.run(run_id).root):
                    self._ids_in_flight.add(run_id)
                    return run_id

    def _prepare(
        self, submission: Submission, identity: Identity, run_id: str
    ) -> tuple[RunRecord, list[PlannedTask] | None]:
        """A submission checked, resolved and planned into the record of `run_id` it will write: the record and its
        planned tasks (None while its environment builds); the node it names is reserved last."""
        self.guard.check_submission(identity, submission.workflow, 0, 0)  # the text's size, before it is parsed
        workflow = self.workflows.parse(submission.workflow)
        self.guard.check_submission(
            identity, submission.workflow, len(workflow.spec.tasks), self.runs.active_count(identity.name)
        )
        check_labels(
            group=submission.group or workflow.spec.group or "",
            workflow_name=workflow.spec.name,
        )
        reserve = submission.reserve or workflow.spec.reserve
        if reserve:
            self.guard.check_reservation(identity, reserve)
        reuse = submission.reuse_request
        check_request(reuse, list(workflow.order), identity, self._load_record, self.guard.policy)
        check_snapshots(self.store, submission.snapshots)
        with self.turns.outside():  # resolving may lock the model's dependencies
            environment = self.environments.resolve(submission.snapshots)
        if environment.state == EnvironmentState.FAILED:
            raise FailedPrecondition(f"environment {environment.environment_id} failed: {environment.message}")
        planned: list[PlannedTask] | None = None
        if environment.state == EnvironmentState.READY:
            with self.turns.outside():  # the model's describer runs its code, and the learner may be a service
                planned = self._plan(
                    workflow, submission.snapshots, identity, submission.mode, run_id, reserve, environment
                )
        elif reserve:
            reserving(self.executor.nodes(), run_id, reserve)
        record = RunRecord(
            run_id=run_id,
            group=submission.group or workflow.spec.group or "default",
            workflow={
                "name": workflow.spec.name,
                "text": submission.workflow,
                **({"mode": submission.mode.value} if submission.mode else {}),
            },
            identity=record_identity(identity),
            tasks=task_records(workflow, planned, submission.mode),
            snapshots=submission.snapshots,
            environment=environment.environment_id,
            reservation=reserve,
            request_id=submission.request_id,
            message=""
            if planned is not None
            else f"building environment {environment.environment_id}"
            + (f": {environment.note}" if environment.note else ""),
            # The SubmitRun span (or the caller's context): the driver's steps and the pods continue its trace.
            traceparent=current_traceparent(),
            reuse=reuse.policy.value,
            resume_from=reuse.resume_from or None,
            rerun=list(reuse.rerun),
        )
        if planned is not None:
            self._set_keys(record, planned)
        if reserve:
            with self.turns.outside():
                self.executor.reserve(reserve, run_id)
        return record, planned

    def _load_record(self, run_id: str) -> RunRecord:
        return load_record(self.store, run_id)

    def _earlier_record(self, run_id: str) -> RunRecord | None:
        """An earlier run's record for reuse, as the run store keeps it (a final one is read from its file once),
        or None where it has none that loads (read only: the store's own, shared)."""
        try:
            return self.runs.read(run_id)
        except (NotFound, OSError, ValueError):
            return None

    def _set_keys(self, record: RunRecord, planned: list[PlannedTask]) -> None:
        for task_id, key in keys_of(self.snapshot_keys, record, planned).items():
            record.tasks[task_id].key = key

    def _reuse(
        self, record: RunRecord, run: RunLayout, identity: Identity | RecordIdentity, planned: list[PlannedTask]
    ) -> None:
        """Writes the run's unit keys and puts in `run` the earlier results its tasks' keys (and unit keys) find (a
        reused task is SUCCEEDED before it starts)."""
        write_unit_keys(record, run, unit_keys_of(self.snapshot_keys, record, planned))
        request = ReuseRequest(ReusePolicy(record.reuse), record.resume_from or "", tuple(record.rerun))
        sources = find_sources(
            record, self.keys, request, caller_identity(identity), self.guard.policy, self._earlier_record
        )
        if not sources:
            return
        apply_reuse(record, run, self.store, sources)
        if self.telemetry.recording and record.traceparent:
            for task in record.tasks.values():
                if task.reused_from is not None and task.started_at is not None:
                    self.telemetry.record_span(
                        f"task {task.task_id}",
                        parent=record.traceparent,
                        start=task.started_at,
                        end=task.ended_at,
                        attributes={
                            "simrun.run_id": record.run_id,
                            "simrun.task_id": task.task_id,
                            "simrun.reused_from.run_id": task.reused_from.run_id,
                            "simrun.reused_from.task_id": task.reused_from.task_id,
                        },
                    )

    @staticmethod
    def _write_reused_task_files(run: RunLayout, record: RunRecord, *, aside: bool) -> None:
        """Writes the task files of the tasks a run reuses whole, which no pod lays out (the pods of every other
        task write theirs from the record as they start: a queued run costs its submission no task folder), all
        without fsync; in a run's folder written `aside` as new files (it is renamed into place once whole)."""
        for task_id, task in record.tasks.items():
            files = record.task_files(task_id)
            if task.state != TaskState.SUCCEEDED or task.reused_from is None or files is None:
                continue
            if not aside:
                record.write_task_files(run, task_id)
                continue
            for name, data in files.items():
                write_bytes_new(run.task(task_id).root / name, data)

    def _write_task_files_from_workflow(
        self, run: RunLayout, record: RunRecord, workflow: Workflow, tasks: list[str]
    ) -> None:
        """Writes again, atomically and durably, the `settings.json` and `provenance.json` of `tasks` of a run
        recorded before a task's record kept its settings (its submission wrote them)."""
        provenance = record.provenance_bytes()
        for task_id in tasks:
            layout = run.task(task_id)
            layout.root.mkdir(parents=True, exist_ok=True)
            write_bytes_atomic(layout.settings, json_bytes(workflow.spec.tasks[task_id].settings))
            write_bytes_atomic(layout.provenance, provenance)

    def _restore_task_files(self, record: RunRecord) -> None:
        """Writes again, durably, the task files of an active run recorded before a task's record kept its
        settings, which a power cut took after its submission answered (empty or missing: they were not fsynced).
        A task recorded with its settings needs none: its pods write its files as they start."""
        text = record.workflow.get("text")
        if not isinstance(text, str):
            return
        run = self.store.run(record.run_id)
        lost = [
            task_id
            for task_id, task in record.tasks.items()
            if not task.state.final
            and task.settings is None
            and not (_whole_json(run.task(task_id).root, SETTINGS) and _whole_json(run.task(task_id).root, PROVENANCE))
        ]
        if lost:
            log.warning("run %s: writing the files of tasks %s again from its record", record.run_id, ", ".join(lost))
            self._write_task_files_from_workflow(run, record, parse_workflow(text), lost)

    def _plan(
        self,
        workflow: Workflow,
        snapshots: list[SnapshotRef],
        identity: Identity | RecordIdentity,
        mode: SplitMode | None,
        run_id: str,
        reserve: str | None,
        environment: Environment,
        traceparent: str | None = None,
    ) -> list[PlannedTask]:
        with self.telemetry.span("planning", parent=traceparent, attributes={"simrun.run_id": run_id}):
            model_root = check_snapshots(self.store, snapshots)
            interpreter = self.interpreters.interpreter(environment.environment_id, snapshots=snapshots)
            libraries = tuple(s.resolve(self.store) for s in snapshots[1:])
            descriptions = describe_tasks(self.describer, interpreter, model_root, workflow, libraries)
            for task_id, description in descriptions.items():
                if description.split:
                    self.guard.check_units(task_id, description.units)
            nodes = reserving(self.executor.nodes(), run_id, reserve)
            priority = identity.priority if isinstance(identity, Identity) else Priority(identity.priority)
            return plan_tasks(workflow, descriptions, self.learner, nodes, snapshots[0].name, priority, mode, run_id)

    def _plan_recorded(self, record: RunRecord) -> None:
        """Describes and plans the tasks of a run recorded while its environment was building (the driver's call)."""
        workflow = self.workflows.parse(str(record.workflow.get("text", "")))
        mode = _recorded_mode(record)
        environment = self.environments.get(record.environment or "")
        planned = self._plan(
            workflow, record.snapshots, record.identity, mode, record.run_id, None, environment, record.traceparent
        )
        record.tasks = task_records(workflow, planned, mode, record.tasks)
        self._set_keys(record, planned)
        run = self.store.run(record.run_id)
        self._reuse(record, run, record.identity, planned)
        self._write_reused_task_files(run, record, aside=False)
        self.keys.update(record)

    def estimate(
        self,
        workflow_text: str,
        snapshots: list[SnapshotRef],
        identity: Identity,
        mode: SplitMode | None,
        reuse: ReuseRequest | None = None,
    ) -> list[TaskEstimate]:
        """Plans a workflow without running it, estimates each split task's seconds and says which tasks would
        be reused from where.

        Raises:
            FailedPrecondition: the model's environment is still building (estimate again once it is ready).
        """
        workflow = self.workflows.parse(workflow_text)
        check_snapshots(self.store, snapshots)
        environment = self.environments.resolve(snapshots)
        if environment.state != EnvironmentState.READY:
            raise FailedPrecondition(
                f"environment {environment.environment_id} is {environment.state.value}: estimate once it is ready"
            )
        reuse = reuse or ReuseRequest()
        check_request(reuse, list(workflow.order), identity, self._load_record, self.guard.policy)
        planned = self._plan(workflow, snapshots, identity, mode, "estimate", workflow.spec.reserve, environment)
        # The record the run would have, for its keys and the earlier results they find.
        record = RunRecord(
            run_id="estimate",
            workflow={"text": workflow_text},
            identity=record_identity(identity),
            tasks=task_records(workflow, planned, mode),
            snapshots=snapshots,
            environment=environment.environment_id,
        )
        self._set_keys(record, planned)
        unit_keys = unit_keys_of(self.snapshot_keys, record, planned)
        for task_id, task_units in unit_keys.items():
            record.tasks[task_id].unit_scope = task_units.scope
        sources = find_sources(record, self.keys, reuse, identity, self.guard.policy, self._earlier_record)
        estimates = []
        for task in planned:
            source = sources.get(task.task_id)
            reused = None
            seeded = 0
            if source is not None and source.partial:
                keys = unit_keys[task.task_id].keys if task.task_id in unit_keys else None
                seeded = units_reused(self.store, source, keys)
                if seeded:
                    reused = ReusedFrom(run_id=source.run_id, task_id=source.task_id, units=seeded)
            elif source is not None:
                reused = ReusedFrom(run_id=source.run_id, task_id=source.task_id)
            seconds = None
            if source is not None and not source.partial:
                # Reused whole: nothing of it is computed.
                seconds = 0.0
            elif task.description.split and task.plan.units:
                units = task.plan.units - seeded
                processes = task.plan.shape.processes
                seconds = self.learner.estimate(task.key, units, task.plan.pods, processes) if units > 0 else 0.0
            elif not task.description.split:
                # An unsplit task is one unit: its learned seconds are those of its whole run.
                seconds = self.learner.estimate(task.key, 1, 1, 1)
            estimates.append(TaskEstimate(task, seconds, reused))
        return estimates

    # --- cancellation ----------------------------------------------------------------------------------------

    def cancel(self, run_id: str, identity: Identity) -> RunRecord:
        """Requests a run's cancellation, which the driver carries out; answers once it has (or after a bound).

        Raises:
            NotFound: no such run.
            PermissionDenied: another's run, unless the caller is the cluster's owner or the person the
                submitting agent acts for.
            FailedPrecondition: the run has ended already.
        """
        with self.runs.run_lock(run_id):
            record = self.get(run_id, identity)
            submitter = record.identity
            allowed = identity.is_owner or identity.name in (submitter.name, submitter.on_behalf_of)
            if not allowed:
                raise PermissionDenied(
                    f"run {run_id} belongs to {submitter.name}; only they or the owner may cancel it"
                )
            if record.state.final:
                raise FailedPrecondition(f"run {run_id} has ended already ({record.state.value})")
            record.cancel_requested = True
            record.message = f"{CANCELLED_BY}{identity.name}"
            self.runs.save(record, durable=True)
            version = self.runs.version(run_id)
        deadline = time.monotonic() + CANCEL_WAIT_S
        while not self.runs.get(run_id).state.final and time.monotonic() < deadline:
            version = self.runs.wait(run_id, version, deadline - time.monotonic())
        return self.runs.get(run_id)

    # --- queries: with an identity, each follows the read policy (a hidden run is NOT_FOUND) ------------------

    def get(self, run_id: str, identity: Identity | None = None) -> RunRecord:
        record = self.reader.get(run_id)
        if identity is not None:
            self.guard.check_read(identity, record)
        return record

    def list_runs(
        self, group: str = "", state: str = "", owner: str = "", identity: Identity | None = None
    ) -> list[str]:
        visible = self.guard.visibility(identity) if identity is not None else None
        return self.reader.list_runs(group, state, owner, visible)

    def page(
        self,
        group: str,
        state: str,
        owner: str,
        page_size: int,
        page_token: str,
        identity: Identity | None = None,
    ) -> tuple[list[RunRecord], str]:
        visible = self.guard.visibility(identity) if identity is not None else None
        return self.reader.page(group, state, owner, page_size, page_token, visible)

    def progress(self, record: RunRecord) -> list[TaskProgress]:
        return self.reader.progress(record)

    def watch(
        self,
        run_id: str,
        alive: Callable[[], bool] = lambda: True,
        identity: Identity | None = None,
        hangup: Hangup | None = None,
    ) -> Iterator[tuple[RunRecord, list[TaskProgress]]]:
        self.get(run_id, identity)
        return self.reader.watch(run_id, alive, hangup)

    def watch_runs(
        self,
        group: str = "",
        state: str = "",
        owner: str = "",
        since: datetime | None = None,
        identity: Identity | None = None,
        alive: Callable[[], bool] = lambda: True,
        hangup: Hangup | None = None,
    ) -> Iterator[tuple[RunRecord, list[TaskProgress]]]:
        """The runs submitted after `since` that a listing with these filters shows `identity` (`reads.watch_runs`)."""
        visible = self.guard.visibility(identity) if identity is not None else None

        def may_see(record: RunRecord) -> bool:
            if identity is None:
                return True
            try:
                self.guard.check_read(identity, record)
            except NotFound:
                return False
            return True

        return self.reader.watch_runs(group, state, owner, since, may_see, visible, alive, hangup)

    def logs(
        self,
        run_id: str,
        task_id: str,
        worker: str = "",
        follow: bool = False,
        identity: Identity | None = None,
        alive: Callable[[], bool] = lambda: True,
    ) -> Iterator[tuple[str, str]]:
        self.get(run_id, identity)
        return self.reader.logs(run_id, task_id, worker, follow, alive)

    def compare(self, run_ids: list[str], group: str = "", identity: Identity | None = None) -> Comparison:
        if identity is not None:
            if run_ids:
                for run_id in run_ids:
                    self.get(run_id, identity)
            else:
                run_ids = list(reversed(self.list_runs(group=group, identity=identity)))
                if group and not run_ids:
                    raise NotFound(f"no runs in group {group!r}")
        return self.reader.compare(run_ids, group)

    def nodes(self) -> list[Node]:
        return self.executor.nodes()


def record_identity(identity: Identity) -> RecordIdentity:
    """An identity as a run's record keeps it."""
    return RecordIdentity(
        name=identity.name,
        kind=identity.kind.value,
        on_behalf_of=identity.on_behalf_of,
        priority=identity.priority.value,
    )


def _recorded_mode(record: RunRecord) -> SplitMode | None:
    """The split mode the submission asked for, kept with the workflow for a run planned later."""
    mode = record.workflow.get("mode")
    return SplitMode(mode) if mode else None


def task_records(
    workflow: Workflow,
    planned: list[PlannedTask] | None,
    mode: SplitMode | None,
    unplanned: dict[str, TaskRecord] | None = None,
) -> dict[str, TaskRecord]:
    """The tasks of a run in the order they run: with their plans, or (while the environment builds) without."""
    tasks: dict[str, TaskRecord] = {}
    if planned is None:
        for task_id in workflow.order:
            spec = workflow.spec.tasks[task_id]
            tasks[task_id] = TaskRecord(
                task_id=task_id,
                type=spec.type,
                inputs=dict(spec.inputs),
                mode=workflow.mode_of(task_id, mode).value,
                unit_timeout_s=spec.unit_timeout_s,
                settings=spec.settings,
            )
        return tasks
    for task in planned:
        earlier = (unplanned or {}).get(task.task_id)
        tasks[task.task_id] = TaskRecord(
            task_id=task.task_id,
            type=task.description.type,
            inputs=dict(workflow.spec.tasks[task.task_id].inputs),
            split=task.description.split,
            mode=workflow.mode_of(task.task_id, mode).value,
            units=task.plan.units,
            cost_value=task.description.cost_value,
            plan=dataclasses.asdict(task.plan),
            resources=dataclasses.asdict(task.resources),
            attempts=dict(earlier.attempts) if earlier else {},
            unit_timeout_s=workflow.spec.tasks[task.task_id].unit_timeout_s,
            settings=workflow.spec.tasks[task.task_id].settings,
        )
    return tasks
