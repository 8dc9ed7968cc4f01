"""The record of a run (`runs/<id>/run.json`): what a pod reads to find its task, and what the tracker keeps."""

from __future__ import annotations

from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from simrun_runtime.files import json_bytes, read_json, write_bytes_atomic, write_bytes_new
from simrun_runtime.layout import PROVENANCE, SETTINGS, RunLayout, StoreLayout, read_beneath


def utcnow() -> datetime:
    return datetime.now(UTC)


class RunState(StrEnum):
    """The lifecycle of a run."""

    SUBMITTING = "submitting"
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def final(self) -> bool:
        return self in (RunState.SUCCEEDED, RunState.FAILED, RunState.CANCELLED)


class TaskState(StrEnum):
    """The lifecycle of a task of a run."""

    PENDING = "pending"
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def final(self) -> bool:
        return self in (TaskState.SUCCEEDED, TaskState.FAILED, TaskState.CANCELLED)


class Provenance(BaseModel):
    """Where the sources of a snapshot came from."""

    branch: str | None = None
    commit: str | None = None
    changed_files: list[str] = Field(default_factory=list)
    dirty: bool = False


class SnapshotRef(BaseModel):
    """A snapshot a run uses; the first of a run is its model."""

    name: str
    snapshot_id: str
    path: str = Field(description="The snapshot's folder, relative to the store root, or absolute.")
    provenance: Provenance = Field(default_factory=Provenance)

    def resolve(self, store: StoreLayout) -> Path:
        return store.resolved(self.path)

    def not_in_store(self, service: str) -> str:
        """What a `service` that does not find the snapshot in its store tells its caller: a snapshot never taken,
        or one taken by a snapshot service apart that keeps another store."""
        return (
            f"snapshot {self.name}/{self.snapshot_id} is not in the {service}'s store: take it first (`simrun submit`"
            " does); services run apart must share one store"
        )


class Identity(BaseModel):
    """Who submitted a run: a person (the cluster's owner or another) or an agent acting for one."""

    name: str
    kind: str = Field(description="owner, person or agent")
    on_behalf_of: str | None = None
    priority: str = Field(description="owner, standard or agent")


class OomKill(BaseModel):
    """A pod killed for memory."""

    task_id: str
    worker: str
    memory_gb: float
    per_worker_gb: float
    at: datetime = Field(default_factory=utcnow)


class ReusedFrom(BaseModel):
    """The earlier task whose outputs a reused task hard-links, or whose done units seeded its ledger."""

    run_id: str
    task_id: str
    units: int | None = Field(default=None, description="Done units seeded into the ledger; None: the whole output.")


class TaskRecord(BaseModel):
    """A task of the run as recorded: its type, inputs, plan and state."""

    task_id: str
    type: str = Field(description="`module:Class` or the name of a `simrun.task_types` entry point.")
    inputs: dict[str, str] = Field(default_factory=dict, description="input port -> `<task>.<port>`")
    split: bool = False
    mode: str = "fastest"
    units: int | None = None
    cost_value: str | None = None
    plan: dict[str, Any] | None = Field(default=None, description="The planner's TaskPlan, as a mapping.")
    resources: dict[str, Any] | None = Field(default=None, description="The resolved resources it was planned with.")
    unit_timeout_s: float | None = Field(default=None, description="The workflow's time limit per unit, seconds.")
    settings: dict[str, Any] | None = Field(
        default=None,
        description="The settings as submitted, from which the task's pods write its `settings.json` (None in a "
        "record written before they were kept here: its submission wrote the file).",
    )
    attempts: dict[str, int] = Field(default_factory=dict, description="worker -> attempts its pod was started")
    sigkills: dict[str, int] = Field(
        default_factory=dict,
        description="worker -> exits by SIGKILL without evidence of the OOM killer (one is retried, a second fails)",
    )
    measured_memory_gb: dict[str, float] = Field(
        default_factory=dict,
        description="worker -> the most anonymous memory the executor measured in its pods, GiB (where it measures)",
    )
    nodes: dict[str, str] = Field(
        default_factory=dict,
        description="worker -> the node its latest attempt was placed on, as the executor names it (`simrun nodes`)",
    )
    memory_gb: dict[str, float] = Field(
        default_factory=dict,
        description="worker -> the memory its latest attempt runs at, GiB: the plan's, or its retry memory once "
        "killed (its limit, and what it asks its node for)",
    )
    state: TaskState = TaskState.PENDING
    message: str = ""
    started_at: datetime | None = None
    ended_at: datetime | None = None
    key: str | None = Field(default=None, description="The task key (sha256 hex): equal keys give equal results.")
    unit_scope: str | None = Field(
        default=None,
        description="A split task's unit-key scope (sha256 hex), when its type gives unit keys (`unit-keys/`).",
    )
    reused_from: ReusedFrom | None = None
    traceparent: str | None = Field(default=None, description="The task's span, its pods' TRACEPARENT.")


class RunRecord(BaseModel):
    """The source of truth of a run; the SQLite index is rebuilt from these."""

    # A task's settings as submitted may hold NaN or an infinity (YAML's `.nan`, `.inf`), written as `json.dumps`
    # writes them, not as null: its pods write `settings.json` from them.
    model_config = ConfigDict(ser_json_inf_nan="constants")

    run_id: str
    group: str = "default"
    workflow: dict[str, Any] = Field(default_factory=dict, description="The workflow as submitted.")
    identity: Identity
    state: RunState = RunState.SUBMITTING
    tasks: dict[str, TaskRecord] = Field(default_factory=dict, description="In the order they run.")
    snapshots: list[SnapshotRef] = Field(default_factory=list)
    environment: str | None = Field(default=None, description="The id of the run's environment, once resolved.")
    request_id: str = Field(default="", description="The submitter's request id: a retried submission's key.")
    reservation: str | None = Field(default=None, description="The node the run reserves.")
    oom_kills: list[OomKill] = Field(default_factory=list)
    cancel_requested: bool = False
    traceparent: str | None = Field(default=None, description="The submission's W3C trace context.")
    reuse: str = Field(default="any", description="never, same-run or any: where earlier results may come from.")
    resume_from: str | None = Field(default=None, description="The run this one resumes: reuse is tried there first.")
    rerun: list[str] = Field(default_factory=list, description="Tasks computed again even if their key is known.")
    message: str = ""
    created_at: datetime = Field(default_factory=utcnow)
    updated_at: datetime = Field(default_factory=utcnow)
    ended_at: datetime | None = None

    @property
    def priority(self) -> str:
        return self.identity.priority

    def model_root(self, store: StoreLayout) -> Path | None:
        """The root of the model's snapshot, first on `sys.path` of every task."""
        return self.snapshots[0].resolve(store) if self.snapshots else None

    def library_roots(self, store: StoreLayout) -> list[Path]:
        """The roots of the model's library snapshots: those that are not packages follow it on `sys.path`."""
        return [ref.resolve(store) for ref in self.snapshots[1:]]

    def task_files(self, task_id: str) -> dict[str, bytes] | None:
        """The files of a task that follow from the record, by name: `settings.json` and `provenance.json` (None for
        a task recorded without its settings)."""
        settings = self.tasks[task_id].settings
        if settings is None:
            return None
        return {SETTINGS: json_bytes(settings), PROVENANCE: self.provenance_bytes()}

    def provenance_bytes(self) -> bytes:
        """The `provenance.json` of each of the run's tasks: the run and the provenance of its sources."""
        return json_bytes({"run_id": self.run_id, "snapshots": [s.model_dump(mode="json") for s in self.snapshots]})

    def write_task_files(self, run: RunLayout, task_id: str, *, writer: str = "") -> list[str]:
        """Writes the files of a task that follow from the record where they are missing or differ, and returns
        their names: what a pod of the task does as it starts. The folder is its pods' to write: what is there is
        read without following a link, and replaced, not written through. No fsync: the record has them, and every
        pod of the task writes them again."""
        files = self.task_files(task_id)
        if files is None:
            return []
        folder = run.task(task_id).root
        written = []
        for name, data in files.items():
            try:
                if read_beneath(folder, name, limit=len(data) + 1) == data:
                    continue
            except (OSError, ValueError):  # missing, a link, not a regular file (UnsafePath is a ValueError)
                pass
            write_bytes_atomic(folder / name, data, durable=False, writer=writer)
            written.append(name)
        return written

    def save(self, run: RunLayout, *, durable: bool = True) -> None:
        """Writes `run.json` atomically; `durable=False` skips its fsync (see `write_bytes_atomic`)."""
        self.updated_at = utcnow()
        write_bytes_atomic(run.record, self._dump(), durable=durable)

    def save_new(self, run: RunLayout) -> None:
        """Writes `run.json` into a run's folder written aside, which nobody reads until it is renamed into place
        (`write_bytes_new`: no temporary file, no fsync; the caller fsyncs it before the rename)."""
        self.updated_at = utcnow()
        write_bytes_new(run.record, self._dump())

    def _dump(self) -> bytes:
        # Unsorted: the order of `tasks` is the order they run. Dumped by pydantic-core, not `json.dumps`, whose
        # indented output is made in Python (five times the cost, paid at every save of every run).
        return (self.model_dump_json(indent=2) + "\n").encode()

    @classmethod
    def load(cls, run: RunLayout) -> RunRecord:
        return cls.model_validate(read_json(run.record))
