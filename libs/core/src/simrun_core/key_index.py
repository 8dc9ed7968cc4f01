"""The index of task keys beside the store: which earlier task of which run had a key, to find results to reuse.

The run records are the source of truth: the index is rebuilt from them at start and told of every task that
ends; what it finds is checked against the store (the record and the outputs) before it is used, so a stale row
is a miss. A SQLite file without WAL (the store may be NFS, where WAL does not work).
"""

from __future__ import annotations

import heapq
import json
import logging
import queue
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from simrun_runtime.layout import StoreLayout
from simrun_runtime.record import RunRecord, TaskRecord, TaskState

from simrun_core.config import ReadPolicy
from simrun_core.identity import Identity
from simrun_core.reuse import ReusePolicy, done_units, may_reuse, outputs_complete, principal, reusable_principal

_SCHEMA = """
CREATE TABLE IF NOT EXISTS task_keys (
    key TEXT NOT NULL,
    run_id TEXT NOT NULL,
    task_id TEXT NOT NULL,
    principal TEXT NOT NULL,
    state TEXT NOT NULL,
    split INTEGER NOT NULL,
    ended_at TEXT NOT NULL DEFAULT '',
    scope TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (run_id, task_id)
);
DROP INDEX IF EXISTS task_keys_by_key;
CREATE INDEX IF NOT EXISTS task_keys_by_key_newest ON task_keys (key, ended_at, run_id, task_id);
CREATE INDEX IF NOT EXISTS task_keys_by_scope_newest ON task_keys (scope, ended_at, run_id, task_id) WHERE scope != '';
"""
_PUT_ROW = "INSERT OR REPLACE INTO task_keys VALUES (?, ?, ?, ?, ?, ?, ?, ?)"


log = logging.getLogger(__name__)

COALESCE_S = 0.05
"""How long a cache's writer thread lets rows gather before it writes them in one transaction."""

PAGE_ROWS = 16
"""Candidates read from the index at a time, newest first: the newest usable one nearly always comes first, so a
key that a thousand earlier runs had costs what a key of one run does."""


_SUCCEEDED = (TaskState.SUCCEEDED.value,)
_PARTIAL = (TaskState.FAILED.value, TaskState.CANCELLED.value)
"""A split task that ended so may give the units it did."""
_REUSABLE_STATES = _SUCCEEDED + _PARTIAL


@dataclass(frozen=True)
class ReuseSource:
    """An earlier task to reuse: its whole outputs (`units` None) or the done units of its ledger."""

    run_id: str
    task_id: str
    units: list[int] | None = None
    by_unit_keys: bool = False
    """Found by unit scope (`find_units`): its units go where the new task's unit keys equal theirs."""

    @property
    def partial(self) -> bool:
        return self.units is not None


def as_cache(connection: sqlite3.Connection) -> None:
    """Sets up a connection to a database that is a cache, rebuilt at start (the run index, the task keys): no
    durability, so no fsync; a rollback journal, as WAL fails on NFS; and the journal truncated after each
    transaction rather than deleted, so a transaction creates and frees no file (ext4 without a journal makes every
    new file skip the ones freed in the last minutes: measured at 28% of the server's CPU under submissions)."""
    connection.execute("PRAGMA journal_mode=TRUNCATE")
    connection.execute("PRAGMA synchronous=OFF")


def start_writer(
    name: str,
    changed: threading.Condition,
    queued: Callable[[], bool],
    closed: Callable[[], bool],
    flush: Callable[[], None],
    window_s: float = COALESCE_S,
) -> threading.Thread:
    """Starts a cache's writer thread (the run index, the task keys): it waits for a first queued row, lets the
    rows of `window_s` join it in one transaction (`flush`), until `closed`; a failed write is logged and tried
    again a second later. Concurrent submissions and the driver's steps each queue rows: a transaction rewrites a
    page of every index of the table, so one per window, not one per row."""

    def write_in_windows() -> None:
        while True:
            with changed:
                while not queued() and not closed():
                    changed.wait()
                if closed():
                    return
                changed.wait(window_s)
                if closed():
                    return
            try:
                flush()
            except Exception:
                log.exception("%s: a write failed; its rows are tried again in a second", name)
                time.sleep(1.0)

    thread = threading.Thread(target=write_in_windows, name=name, daemon=True)
    thread.start()
    return thread


class KeyIndex:
    """Task keys of the store's runs, in a SQLite file; thread-safe, and no thread waits on another's SQLite call.

    `update` only queues a run's rows: a writer thread writes what is queued in one transaction a window at a
    time, and a row stays in memory until it is committed, so `find` sees every row updated before it. Each
    `find` reads on a connection of its own from a pool, under no lock of this process: a lock held across a
    SQLite call is held while the call lets go of the interpreter's lock and waits to take it back, and
    concurrent submissions queued on it (about a fifth of SubmitRun's time at 10 clients reusing results).
    """

    def __init__(self, store: StoreLayout, path: Path | str) -> None:
        self._store = store
        self._path = str(path)
        self._db = self._connect()
        columns = {row[1] for row in self._db.execute("PRAGMA table_info(task_keys)")}
        if columns and "scope" not in columns:
            self._db.execute("DROP TABLE task_keys")  # a cache of an older layout: `rebuild` fills it again
        self._db.executescript(_SCHEMA)
        self._write_lock = threading.Lock()
        """One transaction of this process at a time (the writer thread's, `rebuild`'s): SQLite's own locking
        would make a blocked writer sleep and retry."""
        self._queue = threading.Condition()
        self._queued: dict[tuple[str, str], _Row] = {}
        self._writing: dict[tuple[str, str], _Row] = {}
        """The rows of the transaction under way, which `find` still reads from memory until it is committed."""
        self._closed = False
        self._readers: queue.SimpleQueue[sqlite3.Connection] = queue.SimpleQueue()
        self._writer = start_writer(
            "task-keys-writer", self._queue, lambda: bool(self._queued), lambda: self._closed, self.flush
        )

    def _connect(self) -> sqlite3.Connection:
        connection = sqlite3.connect(self._path, check_same_thread=False, isolation_level=None)
        as_cache(connection)
        return connection

    def close(self) -> None:
        """Writes what is queued, stops the writer and closes the database."""
        with self._queue:
            self._closed = True
            self._queue.notify()
        self._writer.join(timeout=10)
        self.flush()
        self._db.close()
        while not self._readers.empty():
            self._readers.get_nowait().close()

    def rebuild(self, records: Iterable[RunRecord]) -> int:
        """Replaces the index with the keys of `records` (every run of the store); returns the rows."""
        rows = [row for record in records for row in _rows(record)]
        with self._write_lock:
            self._db.execute("BEGIN")
            self._db.execute("DELETE FROM task_keys")
            self._db.executemany(_PUT_ROW, rows)
            self._db.execute("COMMIT")
        return len(rows)

    def update(self, record: RunRecord) -> None:
        """Queues the keys of one run's ended tasks as they are now (a task ended, a run was submitted), which
        `find` sees at once. An ended task stays ended with its key, so a run's rows are only added or changed."""
        rows = list(_rows(record))
        if not rows:
            return
        with self._queue:
            if not self._queued:  # the writer waits for the first row only; later ones join its window
                self._queue.notify()
            for row in rows:
                self._queued[(row[1], row[2])] = row

    def flush(self) -> None:
        """Writes the queued rows now, in one transaction; on an error they are queued again, behind newer ones."""
        with self._write_lock:
            with self._queue:
                if not self._queued:
                    return
                self._writing, self._queued = self._queued, {}
                rows = list(self._writing.values())
            try:
                self._db.execute("BEGIN")
                self._db.executemany(_PUT_ROW, rows)
                self._db.execute("COMMIT")
            except BaseException:
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                with self._queue:
                    self._queued, self._writing = {**self._writing, **self._queued}, {}
                raise
            with self._queue:
                self._writing = {}

    def find(
        self,
        key: str,
        caller: Identity,
        policy: ReusePolicy = ReusePolicy.ANY,
        resume_from: str | None = None,
        exclude_run: str | None = None,
        load: Callable[[str], RunRecord | None] | None = None,
        read_policy: ReadPolicy | None = None,
    ) -> ReuseSource | None:
        """The earlier task to reuse for `key`, or None (a miss).

        The newest succeeded task with complete outputs wins (the run resumed first); without one, a split task
        that failed or was cancelled with done units gives those units. Only runs `caller` may read under
        `read_policy` count (`may_reuse`), and with `SAME_RUN` only `resume_from`. Each candidate is checked
        against its record (`load`, by default read from the store) and its files.
        """
        if policy is ReusePolicy.NEVER or (policy is ReusePolicy.SAME_RUN and not resume_from):
            return None
        person = reusable_principal(caller, read_policy)
        only = resume_from if policy is ReusePolicy.SAME_RUN else None
        load = load or self._load
        # Only ended tasks can be reused: the runs still under way with the same key (often many) are not read.
        # Succeeded tasks first, newest first (the resumed run's before all others): the first whose record and
        # outputs hold wins; only without one does a failed or cancelled split task's done units count.
        for states, split_only in ((_SUCCEEDED, False), (_PARTIAL, True)):
            query = _Query(key, states, split_only, person, exclude_run)
            found = self._checked(query, resume_from, only, load, caller, read_policy, lambda task: task.key == key)
            for run_id, task_id, task in found:
                layout = self._store.run(run_id).task(task_id)
                if not split_only and outputs_complete(layout):
                    return ReuseSource(run_id, task_id)
                if split_only and task.split:
                    units = done_units(layout)
                    if units:
                        return ReuseSource(run_id, task_id, units)
        return None

    def find_units(
        self,
        scope: str,
        caller: Identity,
        policy: ReusePolicy = ReusePolicy.ANY,
        resume_from: str | None = None,
        exclude_run: str | None = None,
        load: Callable[[str], RunRecord | None] | None = None,
        read_policy: ReadPolicy | None = None,
    ) -> ReuseSource | None:
        """The newest ended split task of unit scope `scope` whose done units and unit keys a new task of other
        settings may take (the run resumed first), or None; only runs `caller` may read, checked as `find` does.
        """
        if policy is ReusePolicy.NEVER or (policy is ReusePolicy.SAME_RUN and not resume_from) or not scope:
            return None
        only = resume_from if policy is ReusePolicy.SAME_RUN else None
        load = load or self._load
        query = _Query(
            scope, _REUSABLE_STATES, True, reusable_principal(caller, read_policy), exclude_run, column="scope"
        )
        found = self._checked(
            query, resume_from, only, load, caller, read_policy, lambda task: task.unit_scope == scope
        )
        for run_id, task_id, _ in found:
            if not self._store.run(run_id).unit_keys(task_id).is_file():
                continue
            units = done_units(self._store.run(run_id).task(task_id))
            if units:
                return ReuseSource(run_id, task_id, units, by_unit_keys=True)
        return None

    def _checked(
        self,
        query: _Query,
        resume_from: str | None,
        only: str | None,
        load: Callable[[str], RunRecord | None],
        caller: Identity,
        read_policy: ReadPolicy | None,
        holds: Callable[[TaskRecord], bool],
    ) -> Iterator[tuple[str, str, TaskRecord]]:
        """The candidates of `query` (`_candidates`' order) whose record still says what the row did: the task is
        there, `holds` for it, its state is one the query asks for, and `caller` may reuse its run."""
        for run_id, task_id in self._candidates(query, resume_from, only):
            record = load(run_id)
            task = record.tasks.get(task_id) if record is not None else None
            if (
                record is None
                or task is None
                or not holds(task)
                or task.state.value not in query.states
                or not may_reuse(caller, record.identity, read_policy)
            ):
                continue
            yield run_id, task_id, task

    def _candidates(self, query: _Query, resume_from: str | None, only: str | None) -> Iterator[tuple[str, str]]:
        """The (run, task) rows that `query` matches, the rows of `resume_from` first, then the others newest
        first; read a page at a time, so a long history is read only as far as it is used.

        The rows still in memory (queued or being written) are merged in, in the same order, and stand for their
        task's row in the file. A page starts after the last row of the one before (by `ended_at`, run and task:
        the index's order, so no page is sorted), so a row written meanwhile neither shifts nor repeats one."""
        with self._queue:
            in_memory = {**self._writing, **self._queued}
        matched = sorted(((row[6], row[1], row[2]) for row in in_memory.values() if query.matches(row)), reverse=True)
        where, parameters = query.where()
        if resume_from:
            # `+key`: found by the run (the primary key), not among every row of the key.
            stored = self._read(
                _COLUMNS + "+" + where + " AND run_id = ? ORDER BY ended_at DESC, task_id DESC",
                (*parameters, resume_from),
            )
            resumed = [t for t in matched if t[1] == resume_from]
            resumed += [t for t in stored if (t[1], t[2]) not in in_memory]
            yield from ((run_id, task_id) for _, run_id, task_id in sorted(resumed, reverse=True))
            if only:
                return
            where += " AND run_id != ?"
            parameters += (resume_from,)
            matched = [t for t in matched if t[1] != resume_from]
        stored_rows = (t for t in self._pages(where, parameters) if (t[1], t[2]) not in in_memory)
        for _, run_id, task_id in heapq.merge(matched, stored_rows, reverse=True):
            yield run_id, task_id

    def _pages(self, where: str, parameters: tuple[object, ...]) -> Iterator[tuple[str, str, str]]:
        """The (ended, run, task) rows of the file that `where` matches, newest first, a page at a time."""
        order = " ORDER BY ended_at DESC, run_id DESC, task_id DESC LIMIT ?"
        after: tuple[str, str, str] | None = None
        while True:
            if after is None:
                rows = self._read(_COLUMNS + where + order, (*parameters, PAGE_ROWS))
            else:
                rows = self._read(
                    _COLUMNS + where + " AND (ended_at, run_id, task_id) < (?, ?, ?)" + order,
                    (*parameters, *after, PAGE_ROWS),
                )
            yield from rows
            if len(rows) < PAGE_ROWS:
                return
            after = rows[-1]

    def _read(self, statement: str, parameters: tuple[object, ...]) -> list[tuple[str, str, str]]:
        """The (ended, run, task) rows of a query, newest first, on a reader connection of the pool (a new one
        when every one is in use).

        SQLite hands over the rows as one JSON array: `sqlite3` lets go of the interpreter's lock for every step
        of a statement, and under concurrent submissions each step waits to take it back (a 16-row page took
        about 10 ms so, against 3 ms as one row). They are put in the index's order again here."""
        try:
            connection = self._readers.get_nowait()
        except queue.Empty:
            connection = self._connect()
        try:
            ((rows,),) = connection.execute(
                "SELECT json_group_array(json_array(ended_at, run_id, task_id)) FROM (" + statement + ")", parameters
            ).fetchall()
        finally:
            self._readers.put(connection)
        return sorted(((ended, run, task) for ended, run, task in json.loads(rows)), reverse=True)

    def _load(self, run_id: str) -> RunRecord | None:
        try:
            return RunRecord.load(self._store.run(run_id))
        except (OSError, ValueError):
            return None


_Row = tuple[str, str, str, str, str, int, str, str]
"""A row of `task_keys`: key, run, task, principal, state, split, ended, unit scope."""
_COLUMNS = "SELECT ended_at, run_id, task_id FROM task_keys WHERE "


@dataclass(frozen=True)
class _Query:
    """The rows of a key `find` looks for: in `states`, of split tasks only, of one principal, not of one run."""

    key: str
    states: tuple[str, ...]
    split_only: bool
    person: str | None
    exclude_run: str | None
    column: str = "key"
    """What `key` is matched against: the task key, or a split task's unit scope (`scope`)."""

    def where(self) -> tuple[str, tuple[object, ...]]:
        """The query as SQL and its parameters."""
        where = f"{self.column} = ? AND state IN ({', '.join('?' * len(self.states))})"
        parameters: tuple[object, ...] = (self.key, *self.states)
        if self.split_only:
            where += " AND split = 1"
        if self.person is not None:
            where += " AND principal = ?"
            parameters += (self.person,)
        if self.exclude_run:
            where += " AND run_id != ?"
            parameters += (self.exclude_run,)
        return where, parameters

    def matches(self, row: _Row) -> bool:
        """Whether a row in memory is one the SQL would find."""
        key, run_id, _, principal, state, split, _, scope = row
        return (
            (scope if self.column == "scope" else key) == self.key
            and state in self.states
            and (bool(split) or not self.split_only)
            and (self.person is None or principal == self.person)
            and not (self.exclude_run and run_id == self.exclude_run)
        )


def _rows(record: RunRecord) -> Iterable[_Row]:
    """The rows of a run's keyed tasks that have ended (only those can be reused)."""
    for task in record.tasks.values():
        if task.key and task.state.value in _REUSABLE_STATES:
            yield _row(record, task)


def _row(record: RunRecord, task: TaskRecord) -> _Row:
    ended = (task.ended_at or record.ended_at or record.updated_at).isoformat()
    who = principal(record.identity)
    return (
        task.key or "",
        record.run_id,
        task.task_id,
        who,
        task.state.value,
        int(task.split),
        ended,
        task.unit_scope or "",
    )
