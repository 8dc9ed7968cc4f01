"""The run store as the tracker keeps it: records under `runs/<id>/`, the index beside them, versions to wait on.

The records are the source of truth. For every active run the store keeps the copy last saved and a version that
every save bumps; readers take that copy under a short lock (never while the driver works on a run), and watchers
wait on the version instead of polling. A run's driver step and its cancellation are serialised by a lock of that
run only.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from pathlib import Path

from simrun_core.errors import NotFound
from simrun_runtime.files import fsync_file
from simrun_runtime.layout import NAME, RunLayout, StoreLayout
from simrun_runtime.record import RunRecord

from simrun_tracker.index import RunIndex, row_from_record, task_summaries

FINAL_RECORDS_KEPT = 8192
"""Final records kept in memory: a final run's record never changes, so listing it again reads no file."""


class RunStore:
    """Records of runs, their index, and the last saved copy and version of each active run."""

    def __init__(self, layout: StoreLayout, index_path: Path | None = None) -> None:
        self.layout = layout
        layout.runs.mkdir(parents=True, exist_ok=True)
        self.index = RunIndex(index_path or layout.index)
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._active: dict[str, RunRecord] = {}
        self._active_by_submitter: Counter[str] = Counter()
        self._versions: dict[str, int] = {}
        self._run_locks: dict[str, threading.Lock] = {}
        self._final: OrderedDict[str, RunRecord] = OrderedDict()
        self._listeners: list[Callable[[str], None]] = []

    def load(self, every: Callable[[list[RunRecord]], object] | None = None) -> list[RunRecord]:
        """Rebuilds the index from every record and returns the active runs (the ones not final); `every` is
        given all the records read (the task key index is rebuilt from them too)."""
        records = self.index.rebuild(self.layout)
        if every is not None:
            every(records)
        active = [r for r in records if not r.state.final]
        with self._lock:
            # The newest final runs are the ones listed first: keep them, read once already.
            for record in sorted((r for r in records if r.state.final), key=lambda r: r.created_at)[
                -FINAL_RECORDS_KEPT:
            ]:
                self._keep_final(record)
            for record in active:
                self._make_active(record)
                self._versions.setdefault(record.run_id, 1)
        return [_copy(r) for r in active]

    def on_change(self, listener: Callable[[str], None]) -> None:
        """Calls `listener(run_id)` after every save (the driver wakes on new submissions and cancellations)."""
        self._listeners.append(listener)

    # --- writing ---------------------------------------------------------------------------------------------

    def create(self, record: RunRecord, write_tasks: Callable[[RunLayout], None]) -> RunRecord:
        """Writes a new run aside (`write_tasks` lays out its tasks), renames it into place and makes it active;
        returns `record`, which stays the caller's (the store keeps a copy of its own).

        A run appears whole or not at all: a failure removes the staging folder and leaves nothing behind.
        """
        staging = self.stage(record, write_tasks)
        self.place(_copy(record), staging)
        return record

    def stage(self, record: RunRecord, write_tasks: Callable[[RunLayout], None]) -> RunLayout:
        """The first half of `create`: writes a new run aside, without fsync, and returns its staging folder,
        which nobody sees until `place` (a failure removes it). `write_tasks` finds the folder made, and writes its
        files as new ones (`write_bytes_new`)."""
        staging = self.layout.run_staging(record.run_id)
        try:
            staging.root.mkdir()
            write_tasks(staging)
            record.save_new(staging)
        except BaseException:
            shutil.rmtree(staging.root, ignore_errors=True)
            raise
        return staging

    def place(self, record: RunRecord, staging: RunLayout) -> RunRecord:
        """The second half of `create`: fsyncs a staged run's record, renames the run into place and makes it
        active (a failure removes the staging folder). `record` becomes the store's, which readers share: the
        caller only reads it from then on (a submission answers with it), so it is not copied."""
        try:
            fsync_file(staging.record)
            os.rename(staging.root, self.layout.run(record.run_id).root)
        except BaseException:
            shutil.rmtree(staging.root, ignore_errors=True)
            raise
        self.index.put(row_from_record(record, {}))
        self._publish(record, owned=True)
        return record

    def save(self, record: RunRecord, *, durable: bool | None = None) -> None:
        """Writes a run's record and its index row, then publishes it to readers and watchers.

        A final state, a new run and a request (cancellation) are written durably; the driver's intermediate
        steps are not fsynced: each step is level-triggered, so one lost to a power cut is taken again from what
        the executor observes.
        """
        record.save(self.layout.run(record.run_id), durable=record.state.final if durable is None else durable)
        summaries = task_summaries(self.layout, record) if record.state.final else {}
        self.index.put(row_from_record(record, summaries))
        self._publish(record)

    def _publish(self, record: RunRecord, *, owned: bool = False) -> None:
        """Makes a saved record the one readers get (`owned`: the store's already, else a copy of it)."""
        copy = record if owned else _copy(record)
        with self._changed:
            if copy.state.final:
                if self._active.pop(copy.run_id, None) is not None:
                    self._active_by_submitter[copy.identity.name] -= 1
                self._keep_final(copy)
            else:
                self._make_active(copy)
            self._versions[copy.run_id] = self._versions.get(copy.run_id, 0) + 1
            self._changed.notify_all()
        for listener in self._listeners:
            listener(copy.run_id)

    # --- reading ---------------------------------------------------------------------------------------------

    def active_ids(self) -> list[str]:
        with self._lock:
            return list(self._active)

    def active_count(self, submitter: str) -> int:
        """Active runs that `submitter` (the identity's own name) submitted, from memory: no index query."""
        with self._lock:
            return self._active_by_submitter[submitter]

    def _make_active(self, record: RunRecord) -> None:
        if record.run_id not in self._active:
            self._active_by_submitter[record.identity.name] += 1
        self._active[record.run_id] = record

    def get(self, run_id: str) -> RunRecord:
        """A run's record: a copy of the active one (the caller may change it), else the final one (shared: read it
        only), else the record on disk.

        Raises:
            NotFound: no such run (or an id that is not one).
        """
        with self._lock:
            record = self._active.get(run_id)
            if record is not None:
                return _copy(record)
            final = self._final.get(run_id)
            if final is not None:
                # A final record never changes again and nobody writes a final run: it is shared, not copied.
                return final
        layout = self.layout.run(run_id)
        if not valid_run_id(run_id) or not layout.record.is_file():
            raise NotFound(f"no run {run_id!r}: `simrun list` shows the runs")
        record = RunRecord.load(layout)
        if record.state.final:
            with self._lock:
                self._keep_final(record)
        return record

    def read(self, run_id: str) -> RunRecord:
        """A run's record to read only, never to change: the store's own (no copy), else the record on disk.

        Raises:
            NotFound: no such run (or an id that is not one).
        """
        with self._lock:
            record = self._active.get(run_id) or self._final.get(run_id)
        return record if record is not None else self.get(run_id)

    def _keep_final(self, record: RunRecord) -> None:
        self._final[record.run_id] = record
        self._final.move_to_end(record.run_id)
        while len(self._final) > FINAL_RECORDS_KEPT:
            self._final.popitem(last=False)

    def version(self, run_id: str) -> int:
        with self._lock:
            return self._versions.get(run_id, 0)

    def wait(self, run_id: str, version: int, timeout_s: float) -> int:
        """Waits until the run's version passes `version` or `timeout_s` passes; returns the version then."""
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while self._versions.get(run_id, 0) <= version:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._changed.wait(remaining)
            return self._versions.get(run_id, 0)

    def bump(self, run_id: str) -> None:
        """Wakes the watchers of a run without a save (its progress moved)."""
        with self._changed:
            self._versions[run_id] = self._versions.get(run_id, 0) + 1
            self._changed.notify_all()

    def run_lock(self, run_id: str) -> threading.Lock:
        """The lock that serialises a run's driver step and its cancellation (one per run, never shared)."""
        with self._lock:
            return self._run_locks.setdefault(run_id, threading.Lock())

    def forget_lock(self, run_id: str) -> None:
        with self._lock:
            self._run_locks.pop(run_id, None)

    def close(self) -> None:
        self.index.close()


def valid_run_id(run_id: str) -> bool:
    """Whether a string can name a run's folder: one path component of the store's names (`layout.NAME`: no
    separator, not hidden, at most 128 characters), so a request's id never reaches the file system as `..` or as
    a name too long for it (an OSError, INTERNAL)."""
    return isinstance(run_id, str) and NAME.fullmatch(run_id) is not None


def _copy(record: RunRecord) -> RunRecord:
    """A deep copy of a record, from its dump: a quarter of `model_copy(deep=True)`'s cost, which the driver and
    every read of an active run pay (a record holds only JSON-like data and has no validators to run again)."""
    return RunRecord.model_validate(record.model_dump())
