"""The run store layout of the concepts page: every path of the store is named here and nowhere else."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

RUN_RECORD = "run.json"
ENVIRONMENT_LOCK = "environment.lock"
SETTINGS = "settings.json"
PROVENANCE = "provenance.json"
SUMMARY = "summary.json"
MERGE_MARKER = ".merged"
PROGRESS = "progress.jsonl"
FAILURE = "failure.json"
UNIT_COUNT = "count"
VALUES_SUFFIX = ".jsonl"

WORKER_NAME = re.compile(r"w[0-9]{1,6}|exec|merge")
"""The worker names of a task's pods: `w0` (coordinator or unsplit pod), `w1`… extra workers, `exec`, `merge`."""


def checked_worker(name: str) -> str:
    """A worker name from a request, refused (`ValueError`) unless it is one the ledger uses: never a path or glob."""
    if not WORKER_NAME.fullmatch(name):
        raise ValueError(f"no worker {name!r}: a worker is w0, w1, …, exec or merge")
    return name


@dataclass(frozen=True)
class LedgerLayout:
    """The ledger of a split task: `tasks/<task>/units/`."""

    root: Path

    @property
    def pending(self) -> Path:
        return self.root / "pending"

    @property
    def claimed(self) -> Path:
        return self.root / "claimed"

    @property
    def done(self) -> Path:
        return self.root / "done"

    @property
    def failed(self) -> Path:
        """Units that failed more often than their type retries them (`failed/<i>~<failures>`)."""
        return self.root / "failed"

    @property
    def heartbeats(self) -> Path:
        return self.root / "heartbeats"

    @property
    def results(self) -> Path:
        return self.root / "results"

    @property
    def count_file(self) -> Path:
        """The number of units, written when the ledger is created."""
        return self.root / UNIT_COUNT

    def pending_unit(self, index: int) -> Path:
        return self.pending / str(index)

    def claimed_unit(self, index: int, worker: str) -> Path:
        return self.claimed / f"{index}@{worker}"

    def done_unit(self, index: int) -> Path:
        return self.done / str(index)

    def pending_entry(self, name: str) -> Path:
        """A range of pending units, `<first>[-<last>][~<failures>]` (see `ledger.UnitRange`)."""
        return self.pending / name

    def claimed_entry(self, name: str, worker: str) -> Path:
        return self.claimed / f"{name}@{worker}"

    def done_entry(self, name: str) -> Path:
        return self.done / name

    def failed_entry(self, name: str) -> Path:
        return self.failed / name

    def values_log(self, worker: str, process: str) -> Path:
        """The values the units of one pool process returned, a line per claim (`{"first", "last", "values"}`):
        `results/<worker>.<process>.jsonl`, `process` its pid and a random token (pids repeat across pods)."""
        return self.results / f"{worker}.{process}{VALUES_SUFFIX}"

    def heartbeat(self, worker: str) -> Path:
        return self.heartbeats / worker

    def result(self, index: int) -> Path:
        """The directory of a unit's results, renamed into place once complete."""
        return self.results / str(index)

    @property
    def tmp(self) -> Path:
        """Where unit results are written before they are renamed into `results/`."""
        return self.root / "tmp"

    def result_tmp(self, index: int, worker: str, pid: int) -> Path:
        """The temporary directory a unit's results are written in by one process of one worker."""
        return self.tmp / f"{index}.{worker}.{pid}"


@dataclass(frozen=True)
class TaskLayout:
    """The files of one task of a run: `runs/<id>/tasks/<task>/`."""

    root: Path

    @property
    def task_id(self) -> str:
        return self.root.name

    @property
    def settings(self) -> Path:
        return self.root / SETTINGS

    @property
    def provenance(self) -> Path:
        return self.root / PROVENANCE

    @property
    def out(self) -> Path:
        return self.root / "out"

    def out_port(self, port: str) -> Path:
        return self.out / port

    @property
    def summary(self) -> Path:
        return self.out / SUMMARY

    @property
    def merge_marker(self) -> Path:
        """Written last by the coordinator's merge: the task's output is complete."""
        return self.out / MERGE_MARKER

    @property
    def units(self) -> LedgerLayout:
        return LedgerLayout(self.root / "units")

    def units_building(self, token: str) -> Path:
        """A ledger being built beside `units/`, renamed to it once complete."""
        return self.root / f".units.building-{token}"

    def out_building(self, token: str) -> Path:
        """Outputs being built beside `out/` by a merge or an unsplit task, put in place once complete."""
        return self.root / f".out.building-{token}"

    def out_replaced(self, token: str) -> Path:
        """An earlier, unmarked `out/` moved aside while the new one is put in place."""
        return self.root / f".out.replaced-{token}"

    @property
    def workers(self) -> Path:
        """The reports of the pods."""
        return self.root / "workers"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def failure(self) -> Path:
        """Why the task failed, as the runtime saw it: `{"message", "unit", "worker", "exception", "detail"}`,
        written atomically before the pod exits non-zero; the tracker shows its message as the task's."""
        return self.root / FAILURE

    @property
    def progress(self) -> Path:
        return self.root / PROGRESS


@dataclass(frozen=True)
class RunLayout:
    """The files of one run: `runs/<id>/`."""

    root: Path

    @property
    def run_id(self) -> str:
        return self.root.name

    @property
    def record(self) -> Path:
        return self.root / RUN_RECORD

    @property
    def environment_lock(self) -> Path:
        return self.root / ENVIRONMENT_LOCK

    @property
    def tasks(self) -> Path:
        return self.root / "tasks"

    def task(self, task_id: str) -> TaskLayout:
        return TaskLayout(self.tasks / task_id)

    @property
    def store(self) -> StoreLayout:
        """The store this run lives in (`runs/<id>` is two levels below its root)."""
        return StoreLayout(self.root.parent.parent)


@dataclass(frozen=True)
class StoreLayout:
    """The run store: `runs/` and `snapshots/` under one root."""

    root: Path

    @property
    def runs(self) -> Path:
        return self.root / "runs"

    def run(self, run_id: str) -> RunLayout:
        return RunLayout(self.runs / run_id)

    def run_staging(self, run_id: str) -> RunLayout:
        """A new run written aside in `runs/.staging-<id>/`, renamed to `runs/<id>/` once whole."""
        return RunLayout(self.runs / f".staging-{run_id}")

    @property
    def snapshots(self) -> Path:
        return self.root / "snapshots"

    def snapshot_name(self, name: str) -> Path:
        """All snapshots of one source name: `snapshots/<name>/`."""
        return self.snapshots / name

    def snapshot(self, name: str, snapshot_id: str) -> Path:
        """The files of one snapshot: `snapshots/<name>/<snapshot_id>/`."""
        return self.snapshots / name / snapshot_id

    def snapshot_files(self, name: str, snapshot_id: str) -> Path:
        """The map of a snapshot's paths to their content hashes, beside it."""
        return self.snapshots / name / f"{snapshot_id}.files.json"

    def snapshot_latest(self, name: str) -> Path:
        """The id of the last snapshot made of a name, which the next one hard-links against."""
        return self.snapshots / name / "latest"

    def snapshot_temp(self, name: str, token: str) -> Path:
        """A folder or file written aside in `snapshots/<name>/`, renamed into place once whole (`.tmp-<token>`)."""
        return self.snapshots / name / f".tmp-{token}"

    @property
    def index(self) -> Path:
        """The SQLite index beside the store, a cache rebuilt from the records."""
        return self.root / "index.sqlite"

    @property
    def observations(self) -> Path:
        """The learner's SQLite database of observations."""
        return self.root / "observations.sqlite"
