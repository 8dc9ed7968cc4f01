"""The run store layout of the concepts page: every path of the store is named here and nowhere else."""

from __future__ import annotations

import errno
import os
import re
import stat
import time
from dataclasses import dataclass, field
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
RUN_ID = re.compile(r"[0-9]{8}-[0-9]{6}-[0-9a-f]{6}")
TASK_ID = re.compile(r"[a-z0-9]([a-z0-9-]{0,38}[a-z0-9])?")
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


class UnsafePath(ValueError):
    """A name from a request that is not a store path component of its kind (`..`, `*`, `/`, too long)."""


def checked(kind: str, value: str, pattern: re.Pattern[str]) -> str:
    """`value` when it is a whole match of `pattern`, else `UnsafePath` naming what it must look like.

    Every path the services build from a request goes through this, so a name never
    becomes `..`, a glob, an absolute path or a component longer than the file system takes.
    """
    if not isinstance(value, str) or pattern.fullmatch(value) is None:
        raise UnsafePath(f"{kind} {value!r} is not valid: it must match {pattern.pattern}")
    return value


def checked_worker(name: str) -> str:
    """A worker name from a request, refused (`UnsafePath`, a `ValueError`) unless it is one the ledger uses: never
    a path or glob."""
    if not isinstance(name, str) or not WORKER_NAME.fullmatch(name):
        raise UnsafePath(f"no worker {name!r}: a worker is w0, w1, …, exec or merge")
    return name


def open_beneath(root: Path, *parts: str, flags: int = os.O_RDONLY, mode: int = 0o600) -> int:
    """Opens `root/parts…` walking each component with O_NOFOLLOW, so no symbolic link a task left in its own
    folder (a `logs` or `out` made a link to another run, the home, /etc) leads a service out of `root`.

    Raises:
        UnsafePath: a component is a symbolic link or not a folder, or the file is not a regular file.
        FileNotFoundError: a component is missing (and `flags` does not create the file).
    """
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in parts[:-1]:
            try:
                child = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise UnsafePath(f"{root.joinpath(*parts)}: {part} is not a folder") from None
                raise
            os.close(fd)
            fd = child
        try:
            leaf = os.open(parts[-1], flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, mode, dir_fd=fd)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise UnsafePath(f"{root.joinpath(*parts)} is a symbolic link") from None
            raise
    finally:
        os.close(fd)
    if not stat.S_ISREG(os.fstat(leaf).st_mode):
        os.close(leaf)
        raise UnsafePath(f"{root.joinpath(*parts)} is not a regular file")
    return leaf


def read_beneath(root: Path, *parts: str, limit: int | None = None) -> bytes:
    """The bytes (at most `limit`) of `root/parts…`, opened by `open_beneath`."""
    with os.fdopen(open_beneath(root, *parts), "rb") as f:
        return f.read() if limit is None else f.read(limit)


def open_log(task: TaskLayout, worker: str) -> int:
    """Opens (creating) `logs/<worker>.log` of a task for appending, as the executor writes a pod's log.

    The task's folder is the pod's to write, so its `logs` may have become a link or a file, and a log a link:
    whatever is not a real folder or file is put aside (`.logs.replaced-<n>`), never followed.
    """
    name = f"{checked('worker', worker, WORKER_NAME)}.log"
    for _ in range(3):
        for path, kind_ok in ((task.logs, Path.is_dir), (task.logs / name, Path.is_file)):
            if path.is_symlink() or (path.exists() and not kind_ok(path)):
                os.rename(path, task.root / f".logs.replaced-{os.getpid()}-{time.monotonic_ns()}")
            if path == task.logs:
                path.mkdir(parents=True, exist_ok=True)
        try:
            return open_beneath(task.root, "logs", name, flags=os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        except UnsafePath:
            continue  # replaced again between the check and the open
    raise UnsafePath(f"cannot open the log {task.logs / name}: it keeps being replaced")


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

    def log(self, worker: str) -> Path:
        """The log of one pod, `logs/<worker>.log`; `UnsafePath` for a worker name no pod has."""
        return self.logs / f"{checked('worker', worker, WORKER_NAME)}.log"

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

    def unit_keys(self, task_id: str) -> Path:
        """A split task's unit keys, one SHA-256 hex a line in unit order (only of a type that gives unit keys):
        what lets a later run with other settings reuse its units."""
        return self.root / "unit-keys" / f"{task_id}.txt"

    @property
    def store(self) -> StoreLayout:
        """The store this run lives in (`runs/<id>` is two levels below its root)."""
        return StoreLayout(self.root.parent.parent)


RESOLVED_KEPT = 4096
"""Resolved folders a store layout remembers (`StoreLayout.resolved`); past it, it starts again."""


@dataclass(frozen=True)
class StoreLayout:
    """The run store: `runs/` and `snapshots/` under one root."""

    root: Path
    _resolved: dict[str, Path] = field(default_factory=dict, init=False, repr=False, compare=False)

    def resolved(self, path: str) -> Path:
        """`root/path` with its links resolved (`Path.resolve`), remembered once it is a folder: a snapshot's
        folder never moves, and resolving makes a system call per component, three times per submission."""
        known = self._resolved.get(path)
        if known is not None:
            return known
        resolved = (self.root / path).resolve()
        if resolved.is_dir():
            if len(self._resolved) >= RESOLVED_KEPT:
                self._resolved.clear()
            self._resolved[path] = resolved
        return resolved

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

    def snapshot_readers(self, name: str, snapshot_id: str) -> Path:
        """Who has made or asked for a snapshot by its id, beside it: the read policy's owners of the snapshot."""
        return self.snapshots / name / f"{snapshot_id}.readers.json"

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
