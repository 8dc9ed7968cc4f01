"""The read side of the tracker: a run, a listing, progress, watching by notification, logs, comparison.

Nothing here waits for the driver: a run's record is the copy the run store last published, and watchers wait on
its version (which every save bumps, and which one progress feed bumps when units are done).
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from simrun_core.errors import InvalidArgument, NotFound
from simrun_core.paging import decode_key_token, encode_key_token, page_size
from simrun_runtime.layout import checked_worker
from simrun_runtime.record import RunRecord, RunState, TaskState
from simrun_runtime.reports import ProgressReader

from simrun_tracker.executor import Executor
from simrun_tracker.index import Visibility, task_summaries
from simrun_tracker.runstore import RunStore

PROGRESS_POLL_S = 0.25
"""Seconds between two reads of the progress of runs someone watches."""

WATCH_CHECK_S = 1.0
"""Seconds a watcher waits before it checks that its caller is still there."""

LIST_PAGE_SIZE = 50
"""Runs on a page of ListRuns when the caller asks for no size."""

FINAL_PROGRESS_KEPT = 4096
"""Final runs whose progress is kept in memory (read once: a final run's progress does not change)."""


@dataclass(frozen=True)
class TaskProgress:
    """How far a task is: units done of its ledger, and its state."""

    task_id: str
    units: int | None
    units_done: int
    state: TaskState


@dataclass(frozen=True)
class Comparison:
    """Summary values of runs side by side: one row per task and (dotted) summary key, after the rows of what
    each run ran on (`SOURCE_KEYS`), so runs of different models or commits do not read as one study."""

    run_ids: list[str]
    rows: list[tuple[str, str, list[str]]]
    sources: list[tuple[str, list[str]]] = field(default_factory=list)


SOURCE_KEYS = ("model", "snapshot", "commit", "dirty")
"""The rows of a comparison's sources: the model's snapshot name and id, its commit, and whether the working tree
had uncommitted changes."""


def _sources(record: RunRecord) -> dict[str, str]:
    if not record.snapshots:
        return {}
    model = record.snapshots[0]
    found = {"model": model.name, "snapshot": model.snapshot_id, "commit": model.provenance.commit}
    values: dict[str, object] = {k: v for k, v in found.items() if v}
    if model.provenance.commit:
        values["dirty"] = model.provenance.dirty
    return {key: json.dumps(value) for key, value in values.items()}


class RunReader:
    """Answers queries about runs from the run store and the executor's logs."""

    def __init__(self, runs: RunStore, executor: Executor) -> None:
        self.runs = runs
        self.executor = executor
        self._readers: dict[tuple[str, str], ProgressReader] = {}
        self._final: OrderedDict[str, list[TaskProgress]] = OrderedDict()
        self._lock = threading.Lock()
        self._watched: dict[str, int] = {}
        self._last_done: dict[str, tuple[int, ...]] = {}
        self._feed: threading.Thread | None = None
        self._stop = threading.Event()

    def close(self) -> None:
        self._stop.set()
        if self._feed is not None:
            self._feed.join(timeout=5)

    def get(self, run_id: str) -> RunRecord:
        return self.runs.get(run_id)

    def list_runs(
        self, group: str = "", state: str = "", owner: str = "", visible: Visibility | None = None
    ) -> list[str]:
        """Run ids newest first, filtered by group, state and owner (person or agent), and by the read policy."""
        if state and state not in {s.value for s in RunState}:
            raise InvalidArgument(f"unknown state {state!r}: one of {', '.join(s.value for s in RunState)}")
        return [row.run_id for row in self.runs.index.rows(group, state, owner, visible)]

    def page(
        self,
        group: str,
        state: str,
        owner: str,
        requested_size: int,
        token: str,
        visible: Visibility | None = None,
    ) -> tuple[list[RunRecord], str]:
        """One page of runs, newest first, and the token of the next (empty at the end): keyset paging, so a page
        reads its own rows only, however deep in the listing it is."""
        if state and state not in {s.value for s in RunState}:
            raise InvalidArgument(f"unknown state {state!r}: one of {', '.join(s.value for s in RunState)}")
        scope = f"{group}|{state}|{owner}"
        size = page_size(requested_size, default=LIST_PAGE_SIZE)
        key = decode_key_token(token, scope)
        after = None
        if key is not None:
            try:
                after = (datetime.fromisoformat(key[0]), key[1])
            except (ValueError, IndexError) as exc:
                raise InvalidArgument("bad page_token: pass the next_page_token of the previous page") from exc
        rows = self.runs.index.page(group, state, owner, after, size + 1, visible)
        records = []
        for run_id, _ in rows[:size]:
            try:
                records.append(self.get(run_id))
            except NotFound:
                continue  # removed from the store since the index was built
        if len(rows) <= size:
            return records, ""
        last_id, last_created = rows[size - 1]
        return records, encode_key_token([last_created.isoformat(), last_id], scope)

    def progress(self, record: RunRecord) -> list[TaskProgress]:
        """Units done per task, from each task's `progress.jsonl`, read on from where the last call stopped (a
        seeded ledger's units have their lines there too); a split task reused whole has all its units done."""
        with self._lock:
            kept = self._final.get(record.run_id)
            if kept is not None:
                self._final.move_to_end(record.run_id)
                return kept
        run = self.runs.layout.run(record.run_id)
        result = []
        for task in record.tasks.values():
            done = 0
            if task.split and task.reused_from is not None and task.reused_from.units is None:
                # Reused whole: its outputs are an earlier run's, every unit done there (no progress line here).
                if task.state == TaskState.SUCCEEDED:
                    done = task.units or 0
            elif task.split and task.state == TaskState.PENDING and task.reused_from is None:
                pass  # no pod started yet (a task leaves PENDING before its pods start) and no ledger seeded
            elif task.split:
                key = (record.run_id, task.task_id)
                with self._lock:
                    reader = self._readers.get(key)
                    if reader is None:
                        reader = self._readers[key] = ProgressReader(run.task(task.task_id).progress)
                    done = reader.units_done()
                    if record.state.final:
                        del self._readers[key]
            elif task.state == TaskState.SUCCEEDED:
                done = 1
            result.append(TaskProgress(task.task_id, task.units, done, task.state))
        if record.state.final:
            with self._lock:
                self._final[record.run_id] = result
                while len(self._final) > FINAL_PROGRESS_KEPT:
                    self._final.popitem(last=False)
        return result

    def watch(
        self, run_id: str, alive: Callable[[], bool] = lambda: True
    ) -> Iterator[tuple[RunRecord, list[TaskProgress]]]:
        """Yields the run and its progress whenever either changes, the last time once it has ended.

        It waits on the run's version, not on a clock; `alive` says whether the caller still listens.
        """
        last: tuple[Any, ...] | None = None
        self._watch_start(run_id)
        try:
            while True:
                version = self.runs.version(run_id)
                record = self.get(run_id)
                progress = self.progress(record)
                marker = (record.updated_at, record.state, tuple(progress))
                if marker != last:
                    last = marker
                    yield record, progress
                if record.state.final:
                    return
                while self.runs.wait(run_id, version, WATCH_CHECK_S) == version:
                    if not alive():
                        return
        finally:
            self._watch_end(run_id)

    def _watch_start(self, run_id: str) -> None:
        with self._lock:
            self._watched[run_id] = self._watched.get(run_id, 0) + 1
            if self._feed is None:
                self._feed = threading.Thread(target=self._progress_feed, name="simrun-progress-feed", daemon=True)
                self._feed.start()

    def _watch_end(self, run_id: str) -> None:
        with self._lock:
            self._watched[run_id] -= 1
            if not self._watched[run_id]:
                del self._watched[run_id]
                self._last_done.pop(run_id, None)

    def _progress_feed(self) -> None:
        """One thread for every watcher: reads the progress of watched runs and wakes their watchers on a change."""
        while not self._stop.wait(PROGRESS_POLL_S):
            with self._lock:
                watched = list(self._watched)
            for run_id in watched:
                try:
                    record = self.get(run_id)
                except NotFound:
                    continue
                done = tuple(p.units_done for p in self.progress(record))
                with self._lock:
                    changed = self._last_done.get(run_id) not in (None, done)
                    self._last_done[run_id] = done
                if changed:
                    self.runs.bump(run_id)

    def logs(
        self,
        run_id: str,
        task_id: str,
        worker: str = "",
        follow: bool = False,
        alive: Callable[[], bool] = lambda: True,
    ) -> Iterator[tuple[str, str]]:
        """Yields (pod log name, new lines) of a task's pods through the executor; with `follow`, until it ends.

        Following a task that has not started (its inputs are not done, its environment builds) waits for it on
        the run's version, then follows its pods; a task that ends without starting ends the stream. `alive` says
        whether the caller still listens while it waits.

        Raises:
            InvalidArgument: a worker that is not one of the ledger's names (never a path or a pattern).
            NotFound: no such run or task.
        """
        if worker:
            try:
                checked_worker(worker)
            except ValueError as exc:
                raise InvalidArgument(str(exc)) from exc
        record = self.get(run_id)
        if task_id not in record.tasks:
            raise NotFound(f"run {run_id} has no task {task_id!r} (its tasks: {', '.join(record.tasks)})")
        if follow:
            started = self._started(run_id, task_id, alive)
            if started is None:
                return
            record = started
        yield from self.executor.logs(run_id, task_id, worker, follow and not record.tasks[task_id].state.final, alive)

    def _started(self, run_id: str, task_id: str, alive: Callable[[], bool]) -> RunRecord | None:
        """The run once the task's pods were started (the driver saves a task QUEUED after starting them) or the
        task ended; None when the caller left first."""
        while True:
            version = self.runs.version(run_id)
            record = self.get(run_id)
            if record.tasks[task_id].state != TaskState.PENDING or record.state.final:
                return record
            while self.runs.wait(run_id, version, WATCH_CHECK_S) == version:
                if not alive():
                    return None

    def compare(self, run_ids: list[str], group: str = "") -> Comparison:
        """Puts the summary values of runs (or of a group's runs, oldest first) side by side."""
        if not run_ids:
            if not group:
                raise InvalidArgument("compare needs run ids or a group")
            run_ids = list(reversed(self.list_runs(group=group)))
            if not run_ids:
                raise NotFound(f"no runs in group {group!r}")
        flat: list[dict[tuple[str, str], str]] = []
        keys: list[tuple[str, str]] = []
        sources: list[dict[str, str]] = []
        for run_id in run_ids:
            record = self.get(run_id)
            sources.append(_sources(record))
            values: dict[tuple[str, str], str] = {}
            for task_id, summary in task_summaries(self.runs.layout, record).items():
                for key, value in flatten(summary):
                    values[(task_id, key)] = json.dumps(value, sort_keys=True)
            for k in values:
                if k not in keys:
                    keys.append(k)
            flat.append(values)
        rows = [(task_id, key, [values.get((task_id, key), "") for values in flat]) for task_id, key in keys]
        shown = [key for key in SOURCE_KEYS if any(key in run for run in sources)]
        return Comparison(run_ids, rows, [(key, [run.get(key, "") for run in sources]) for key in shown])


def flatten(value: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Dotted keys of a nested mapping and their leaf values."""
    if isinstance(value, dict):
        for key in value:
            yield from flatten(value[key], f"{prefix}.{key}" if prefix else str(key))
    else:
        yield prefix or "(value)", value
