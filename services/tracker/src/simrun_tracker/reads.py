"""The read side of the tracker: a run, a listing, progress, watching by notification, logs, comparison.

Nothing here waits for the driver: a run's record is the copy the run store last published, and watchers wait on
its version (which every save bumps, and which one progress feed bumps when units are done). The watchers of one
run share one reading of it per change (`_SharedWatch`) and sleep until it changes or their caller hangs up
(`Hangup`), so a watcher of a run that does not change costs nothing.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
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
"""Seconds a watcher waits before it checks that its caller is still there, when nobody tells it (no `Hangup`)."""

WATCH_SAFETY_S = 60.0
"""Seconds a watcher told of its caller's end by a `Hangup` still waits before it asks `alive` (a lost call)."""

LIST_PAGE_SIZE = 50
"""Runs on a page of ListRuns when the caller asks for no size."""

NEW_RUNS_FOLLOWED = 50
"""Runs a WatchRuns stream follows at once: the newest, a first page of a listing's worth."""

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


class Hangup:
    """A stream's caller going away, told from any thread (an RPC's end callback): its waiting watcher wakes at once
    instead of asking every second whether the caller is still there."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._gone = False
        self._wakers: list[Callable[[], None]] = []

    def __call__(self) -> None:
        """The caller went away: wakes whoever waits for it (once; later calls do nothing)."""
        with self._lock:
            self._gone = True
            wakers, self._wakers = self._wakers, []
        for wake in wakers:
            wake()

    @property
    def gone(self) -> bool:
        with self._lock:
            return self._gone

    def wakes(self, wake: Callable[[], None]) -> None:
        """Calls `wake` when the caller goes away (at once if it went already)."""
        with self._lock:
            if not self._gone:
                self._wakers.append(wake)
                return
        wake()

    def forget(self, wake: Callable[[], None]) -> None:
        with self._lock:
            if wake in self._wakers:
                self._wakers.remove(wake)


class _SharedWatch:
    """The watchers of one run: they sleep on one condition, which the run's changes (a save, its progress moving)
    and their callers' hang-ups wake, and the first of them awake reads the run once for all of them."""

    def __init__(self) -> None:
        self.changed = threading.Condition(threading.Lock())
        self.watchers = 0
        self.version = -1
        """The store's version of the run that `update` was read at."""
        self.reading = False
        self.marker: tuple[Any, ...] | None = None
        self.update: tuple[RunRecord, list[TaskProgress]] | None = None
        self.serial = 0
        """Bumped with every `update` that differs from the one before: each watcher yields each serial once."""

    def wake(self) -> None:
        with self.changed:
            self.changed.notify_all()


class _RunsListener:
    """The run ids changed since a WatchRuns stream last looked, in the order they changed."""

    def __init__(self) -> None:
        self.changed = threading.Condition(threading.Lock())
        self.pending: dict[str, None] = {}

    def __call__(self, run_id: str) -> None:
        with self.changed:
            self.pending[run_id] = None
            self.changed.notify_all()

    def wake(self) -> None:
        with self.changed:
            self.changed.notify_all()


def matches(record: RunRecord, group: str, state: str, owner: str) -> bool:
    """Whether a run is one a listing with these filters shows (`index._filtered`: the owner is the person or the
    agent)."""
    identity = record.identity
    person = (identity.on_behalf_of or identity.name) if identity.kind == "agent" else identity.name
    return (
        (not group or record.group == group)
        and (not state or record.state.value == state)
        and (not owner or owner in (person, identity.name))
    )


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
        self._shared: dict[str, _SharedWatch] = {}
        self._runs_listeners: list[_RunsListener] = []
        self.watch_reads = 0
        """Readings of a watched run (one per change however many watch it; for tests and benchmarks)."""
        runs.on_change(self._run_changed)

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
        self, run_id: str, alive: Callable[[], bool] = lambda: True, hangup: Hangup | None = None
    ) -> Iterator[tuple[RunRecord, list[TaskProgress]]]:
        """Yields the run and its progress whenever either changes, the last time once it has ended.

        It sleeps until the run's version moves, not on a clock, and shares each reading of the run with the other
        watchers of the run. `hangup` wakes it when its caller goes away (it then asks `alive` only as a safety net,
        every `WATCH_SAFETY_S`); without one it asks `alive` every `WATCH_CHECK_S`. The records yielded are shared
        by the run's watchers: read them only.
        """
        self._watch_start(run_id)
        with self._lock:
            shared = self._shared.setdefault(run_id, _SharedWatch())
            shared.watchers += 1
        if hangup is not None:
            hangup.wakes(shared.wake)
        seen = 0
        try:
            while True:
                step = self._next_update(run_id, shared, seen, alive, hangup)
                if step is None:
                    return
                seen, (record, progress) = step
                yield record, progress
                if record.state.final:
                    return
        finally:
            if hangup is not None:
                hangup.forget(shared.wake)
            with self._lock:
                shared.watchers -= 1
                if not shared.watchers and self._shared.get(run_id) is shared:
                    del self._shared[run_id]
            self._watch_end(run_id)

    def _next_update(
        self,
        run_id: str,
        shared: _SharedWatch,
        seen: int,
        alive: Callable[[], bool],
        hangup: Hangup | None,
    ) -> tuple[int, tuple[RunRecord, list[TaskProgress]]] | None:
        """The run's update after the `seen` one: read by this watcher if the run moved and nobody reads it yet,
        else waited for; None when the caller went away."""
        patience = WATCH_SAFETY_S if hangup is not None else WATCH_CHECK_S
        with shared.changed:
            while True:
                if hangup is not None and hangup.gone:
                    return None
                # Read under the condition: a change published after this read notifies only once this waits.
                version = self.runs.version(run_id)
                if version != shared.version and not shared.reading:
                    shared.reading = True
                    shared.changed.release()
                    try:
                        record = self.get(run_id)
                        progress = self.progress(record)
                    finally:
                        shared.changed.acquire()
                        shared.reading = False
                        shared.changed.notify_all()  # the others read again if this one failed
                    self.watch_reads += 1
                    with self._lock:  # what the progress feed compares with: a unit done since is a change
                        self._last_done[run_id] = tuple(p.units_done for p in progress)
                    shared.version = version
                    marker = (record.updated_at, record.state, tuple(progress))
                    if marker != shared.marker:
                        shared.marker, shared.update = marker, (record, progress)
                        shared.serial += 1
                    continue
                if shared.serial > seen and shared.update is not None and not shared.reading:
                    return shared.serial, shared.update
                if not shared.changed.wait(patience) and not alive():
                    return None

    def watching(self) -> int:
        """Watchers open now, in all."""
        with self._lock:
            return sum(shared.watchers for shared in self._shared.values())

    def _run_changed(self, run_id: str) -> None:
        """Wakes the watchers of a run that was saved or whose progress moved, and tells the WatchRuns streams."""
        with self._lock:
            shared = self._shared.get(run_id)
            listeners = list(self._runs_listeners)
        if shared is not None:
            shared.wake()
        for listener in listeners:
            listener(run_id)

    def watch_runs(
        self,
        group: str,
        state: str,
        owner: str,
        since: datetime | None,
        may_see: Callable[[RunRecord], bool],
        visible: Visibility | None = None,
        alive: Callable[[], bool] = lambda: True,
        hangup: Hangup | None = None,
    ) -> Iterator[tuple[RunRecord, list[TaskProgress]]]:
        """Yields each run submitted after `since` (None: from now) that a listing with these filters shows and
        `may_see` lets the caller read, with its progress: those submitted already first, oldest first, then each as
        it is submitted (with a state asked for: once seen in it) and whenever it or its progress changes, until the
        caller goes away. It follows the `NEW_RUNS_FOLLOWED` newest: an older one drops out, and so do the runs
        submitted before it. It sleeps until a run changes, as `watch` does; the records are the store's: read only.

        Raises:
            InvalidArgument: an unknown state.
        """
        if state and state not in {s.value for s in RunState}:
            raise InvalidArgument(f"unknown state {state!r}: one of {', '.join(s.value for s in RunState)}")
        floor = since if since is not None else datetime.now(UTC)
        listener = _RunsListener()
        with self._lock:
            self._runs_listeners.append(listener)
        if hangup is not None:
            hangup.wakes(listener.wake)
        followed: OrderedDict[str, tuple[Any, ...] | None] = OrderedDict()
        patience = WATCH_SAFETY_S if hangup is not None else WATCH_CHECK_S
        try:
            # Those submitted since `floor` before this call: the listing's newest, oldest first.
            for run_id, _ in reversed(self.runs.index.page(group, state, owner, None, NEW_RUNS_FOLLOWED, visible)):
                listener(run_id)
            while True:
                with listener.changed:
                    while not listener.pending:
                        if hangup is not None and hangup.gone:
                            return
                        if not listener.changed.wait(patience) and not alive():
                            return
                    if hangup is not None and hangup.gone:
                        return
                    changed = list(listener.pending)
                    listener.pending.clear()
                for run_id in changed:
                    try:
                        record = self.runs.read(run_id)
                    except NotFound:
                        continue
                    if run_id not in followed:
                        if record.created_at <= floor or not matches(record, group, state, owner):
                            continue
                        if not may_see(record):
                            continue
                        followed[run_id] = None
                        self._watch_start(run_id)  # its progress is read as a watched run's is
                        while len(followed) > NEW_RUNS_FOLLOWED:
                            dropped, _ = followed.popitem(last=False)
                            self._watch_end(dropped)
                            with contextlib.suppress(NotFound):  # a run gone from the store since
                                floor = max(floor, self.runs.read(dropped).created_at)
                    progress = self.progress(record)
                    marker = (record.updated_at, record.state, tuple(progress))
                    if followed[run_id] != marker:
                        followed[run_id] = marker
                        yield record, progress
        finally:
            if hangup is not None:
                hangup.forget(listener.wake)
            with self._lock:
                self._runs_listeners.remove(listener)
            for run_id in followed:
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
                    record = self.runs.read(run_id)  # read only: no copy of the record a tick
                except NotFound:
                    continue
                if record.state.final:
                    continue  # its watchers read it once more as it ended; its progress moves no more
                done = tuple(p.units_done for p in self.progress(record))
                with self._lock:
                    changed = self._last_done.get(run_id) not in (None, done)
                    self._last_done[run_id] = done
                if changed:
                    self.runs.bump(run_id)
                    self._run_changed(run_id)

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
