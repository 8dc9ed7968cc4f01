"""The tracker's use of earlier results: task keys at submission, and reused tasks put in place before pods start.

The decisions are made when a run is planned (at submission, or once its environment is ready), so every key is
known before any pod starts and an adapter that renders a whole run never sees a reused task.
"""

from __future__ import annotations

import json
import secrets
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from simrun_core.config import ReadPolicy
from simrun_core.errors import FailedPrecondition, InvalidArgument, NotFound
from simrun_core.identity import Identity, IdentityKind, Priority
from simrun_core.key_index import KeyIndex, ReuseSource
from simrun_core.reuse import (
    KeyInputs,
    ReusePolicy,
    SnapshotContent,
    UnitDescription,
    UnitKeys,
    link_outputs,
    may_reuse,
    reuse_message,
    seed_ledger,
    snapshot_key,
    task_keys,
    unit_keys,
    workflow_files,
)
from simrun_runtime.layout import NAME, RunLayout, StoreLayout
from simrun_runtime.record import Identity as RecordIdentity
from simrun_runtime.record import ReusedFrom, RunRecord, TaskRecord, TaskState

from simrun_tracker.submission import PlannedTask


@dataclass(frozen=True)
class ReuseRequest:
    """What a submission asks of reuse: where from, a run it resumes, and tasks to compute again."""

    policy: ReusePolicy = ReusePolicy.ANY
    resume_from: str = ""
    rerun: tuple[str, ...] = ()


def caller_identity(identity: Identity | RecordIdentity) -> Identity:
    """The submitter as an `Identity`, also for a run planned later from its record."""
    if isinstance(identity, Identity):
        return identity
    return Identity(identity.name, IdentityKind(identity.kind), Priority(identity.priority), identity.on_behalf_of)


def check_request(
    request: ReuseRequest,
    task_ids: list[str],
    caller: Identity,
    load: Callable[[str], RunRecord],
    read_policy: ReadPolicy | None = None,
) -> None:
    """Refuses a request naming an unknown task to rerun or a run to resume the caller may not read.

    Raises:
        InvalidArgument: `--rerun` names a task the workflow does not have, `same-run` without a run to resume,
            or `never` with one.
        NotFound: no run `resume_from`, or one the read policy hides from the caller (worded the same, so a
            hidden run's existence and owner are not told).
        FailedPrecondition: the run to resume has not ended.
    """
    unknown = sorted(set(request.rerun) - set(task_ids))
    if unknown:
        raise InvalidArgument(f"cannot rerun {', '.join(unknown)}: no such task (tasks: {', '.join(task_ids)})")
    if request.policy is ReusePolicy.SAME_RUN and not request.resume_from:
        raise InvalidArgument("reuse same-run needs the run to resume: give --resume-from RUN")
    if request.policy is ReusePolicy.NEVER and request.resume_from:
        raise InvalidArgument(
            "reuse never takes nothing from --resume-from RUN: drop --reuse never to resume, or --resume-from"
        )
    if request.resume_from:
        source: RunRecord = load(request.resume_from)  # NotFound for an unknown run
        if not may_reuse(caller, source.identity, read_policy):
            raise NotFound(f"no run {request.resume_from!r}: `simrun list` shows the runs")
        if not source.state.final:
            # Only ended tasks can be reused: resuming now would compute again what the run is computing.
            raise FailedPrecondition(
                f"run {request.resume_from} is {source.state.value}: resume it once it has ended "
                f"(`simrun cancel {request.resume_from}` ends it now)"
            )


SNAPSHOTS_KEPT = 256
"""Snapshots whose content for task keys a tracker keeps in memory, at most."""
SNAPSHOT_FILES_KEPT = 4_000_000
"""Files of those snapshots kept in all, at most (8 bytes each: 32 MB); a larger snapshot is read every time."""


class SnapshotKeys:
    """The content of each snapshot as task keys see it (without its workflow files), its listing and workflow
    files read once per snapshot: a snapshot never changes, and a sweep's submissions use the same few. Safe
    across threads."""

    def __init__(self, store: StoreLayout, kept: int = SNAPSHOTS_KEPT, files_kept: int = SNAPSHOT_FILES_KEPT) -> None:
        self.store = store
        self._kept = kept
        self._files_kept = files_kept
        self._files = 0
        self._lock = threading.Lock()
        self._contents: OrderedDict[tuple[str, str], SnapshotContent] = OrderedDict()

    def of(self, record: RunRecord) -> list[str]:
        """One key per snapshot of `record`; a snapshot whose listing cannot be read counts by its id."""
        workflow_text = str(record.workflow.get("text", "")) or None
        keys = []
        for snapshot in record.snapshots:
            name = (snapshot.name, snapshot.snapshot_id)
            with self._lock:
                content = self._contents.get(name)
                if content is not None:
                    self._contents.move_to_end(name)
            key = content.key(workflow_text) if content is not None else None
            if key is None:
                key = self._read(name, workflow_text)
            keys.append(key)
        return keys

    def _read(self, name: tuple[str, str], workflow_text: str | None) -> str:
        """The key from the listing on disk, whose content is kept for the next submission."""
        try:
            listing = json.loads(self.store.snapshot_files(*name).read_text())
            workflows = workflow_files(listing, self.store.snapshot(*name))
            content = SnapshotContent.of(listing, workflows)
        except (OSError, ValueError, TypeError, AttributeError):
            return name[1]  # not kept: a listing unreadable now may be readable later
        if content.files <= self._files_kept:
            with self._lock:
                if name not in self._contents:
                    self._contents[name] = content
                    self._files += content.files
                self._contents.move_to_end(name)
                while len(self._contents) > self._kept or self._files > self._files_kept:
                    self._files -= self._contents.popitem(last=False)[1].files
        return content.key(workflow_text) or snapshot_key(listing, workflow_text, workflows)


def keys_of(snapshots: SnapshotKeys, record: RunRecord, planned: list[PlannedTask]) -> dict[str, str | None]:
    """Every task's key (None for a task whose type is not cacheable: a nonce stands in for its key downstream,
    so nothing that reads it is reused either)."""
    inputs: dict[str, KeyInputs] = {}
    for task in planned:
        description = task.description
        inputs[task.task_id] = KeyInputs(
            type=description.type,
            settings=description.settings or {},
            inputs=dict(record.tasks[task.task_id].inputs) if task.task_id in record.tasks else {},
            split=description.split,
        )
    order = [task.task_id for task in planned]
    snapshot_ids = snapshots.of(record)
    keys: dict[str, str | None] = {}
    computed = task_keys(order, _with_nonces(inputs, planned), snapshot_ids, record.environment)
    for task in planned:
        keys[task.task_id] = computed[task.task_id] if task.description.cacheable else None
    return keys


def unit_keys_of(snapshots: SnapshotKeys, record: RunRecord, planned: list[PlannedTask]) -> dict[str, UnitKeys]:
    """The unit keys of the run's split tasks whose types give them (the task keys already set on `record`)."""
    described = {
        task.task_id: UnitDescription(task.description.unit_keys, task.description.unit_inputs)
        for task in planned
        if task.description.unit_keys is not None and task.task_id in record.tasks
    }
    if not described:
        return {}
    inputs = {
        task.task_id: KeyInputs(
            type=task.description.type,
            settings={},
            inputs=dict(record.tasks[task.task_id].inputs) if task.task_id in record.tasks else {},
            split=task.description.split,
        )
        for task in planned
    }
    keys = {task_id: task.key for task_id, task in record.tasks.items()}
    order = [task.task_id for task in planned]
    return unit_keys(order, inputs, described, snapshots.of(record), record.environment, keys)


def write_unit_keys(record: RunRecord, run: RunLayout, units: dict[str, UnitKeys]) -> None:
    """Records each task's unit scope and writes its unit keys into the run (`unit-keys/<task>.txt`)."""
    for task_id, task_units in units.items():
        record.tasks[task_id].unit_scope = task_units.scope
        path = run.unit_keys(task_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(key + "\n" for key in task_units.keys))


def read_unit_keys(run: RunLayout, task_id: str) -> list[str]:
    """A task's unit keys as its run wrote them ([] when it has none)."""
    try:
        return run.unit_keys(task_id).read_text().split()
    except OSError:
        return []


def _with_nonces(inputs: dict[str, KeyInputs], planned: list[PlannedTask]) -> dict[str, KeyInputs]:
    uncacheable = {task.task_id for task in planned if not task.description.cacheable}
    if not uncacheable:
        return inputs
    return {
        task_id: KeyInputs(
            spec.type,
            {**spec.settings, "__nonce__": secrets.token_hex(16)} if task_id in uncacheable else spec.settings,
            spec.inputs,
            spec.split,
        )
        for task_id, spec in inputs.items()
    }


def find_sources(
    record: RunRecord,
    index: KeyIndex,
    request: ReuseRequest,
    caller: Identity,
    read_policy: ReadPolicy | None = None,
    load: Callable[[str], RunRecord | None] | None = None,
) -> dict[str, ReuseSource]:
    """The earlier task each of the run's tasks would reuse, from runs `caller` may read (tasks without one are
    left out); `load` gives an earlier run's record (None: none), by default from its file."""
    sources = {}
    for task in record.tasks.values():
        if not task.key or task.task_id in request.rerun:
            continue
        source = index.find(
            task.key,
            caller,
            request.policy,
            resume_from=request.resume_from or None,
            exclude_run=record.run_id,
            load=load,
            read_policy=read_policy,
        )
        if source is None and task.unit_scope and task.split:
            source = index.find_units(
                task.unit_scope,
                caller,
                request.policy,
                resume_from=request.resume_from or None,
                exclude_run=record.run_id,
                load=load,
                read_policy=read_policy,
            )
        if source is not None and (not source.partial or task.split):
            sources[task.task_id] = source
    return sources


def apply_reuse(record: RunRecord, run: RunLayout, store: StoreLayout, sources: dict[str, ReuseSource]) -> list[str]:
    """Puts the earlier results in `run` (the staging folder of a new run, or its folder) and records where they
    came from: a whole output is hard-linked and its task SUCCEEDED; done units seed a split task's ledger.
    A source that has gone since it was found is a miss. Returns the tasks reused whole."""
    reused = []
    now = datetime.now(UTC)
    for task_id, source in sources.items():
        task = record.tasks[task_id]
        earlier = store.run(source.run_id).task(source.task_id)
        if not source.partial:
            if link_outputs(earlier, run.task(task_id)):
                _reused_whole(task, source, now)
                reused.append(task_id)
        elif task.units:
            indices = unit_indices(store, source, read_unit_keys(run, task_id)) if source.by_unit_keys else None
            seeded = seed_ledger(earlier, run.task(task_id), task.units, indices)
            if seeded:
                task.reused_from = ReusedFrom(run_id=source.run_id, task_id=source.task_id, units=seeded)
    return reused


def unit_indices(store: StoreLayout, source: ReuseSource, keys: list[str]) -> dict[int, int]:
    """New unit index -> the earlier task's index of the unit of equal key, for the new task's unit `keys`."""
    earlier = {key: i for i, key in enumerate(read_unit_keys(store.run(source.run_id), task_id=source.task_id))}
    return {new: earlier[key] for new, key in enumerate(keys) if key in earlier}


def units_reused(store: StoreLayout, source: ReuseSource, keys: list[str] | None = None) -> int:
    """How many units of a split task `source` would seed: its done units, or those whose unit key is one of
    `keys` (the new task's) when it was found by unit keys."""
    done = set(source.units or ())
    if not source.by_unit_keys:
        return len(done)
    return sum(1 for earlier in unit_indices(store, source, keys or []).values() if earlier in done)


def _reused_whole(task: TaskRecord, source: ReuseSource, now: datetime) -> None:
    task.state = TaskState.SUCCEEDED
    task.message = reuse_message(source.run_id, source.task_id)
    task.reused_from = ReusedFrom(run_id=source.run_id, task_id=source.task_id)
    task.started_at = task.ended_at = now


def load_record(store: StoreLayout, run_id: str) -> RunRecord:
    """A run's record from the store; `NotFound` when there is none."""
    run = store.run(run_id)
    if NAME.fullmatch(run_id) is None or not run.record.is_file():
        raise NotFound(f"no run {run_id!r}: `simrun list` shows the runs")
    return RunRecord.load(run)
