"""The index of task keys beside the store: which earlier task of which run had a key, to find results to reuse.

The run records are the source of truth: the index is rebuilt from them at start and told of every task that
ends; what it finds is checked against the store (the record and the outputs) before it is used, so a stale row
is a miss. A SQLite file without WAL (the store may be NFS, where WAL does not work), or in memory.
"""

from __future__ import annotations

import sqlite3
import threading
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
    PRIMARY KEY (run_id, task_id)
);
DROP INDEX IF EXISTS task_keys_by_key;
CREATE INDEX IF NOT EXISTS task_keys_by_key_newest ON task_keys (key, ended_at, run_id, task_id);
"""
_RUN_ROWS = "SELECT key, run_id, task_id, principal, state, split, ended_at FROM task_keys WHERE run_id = ?"
_PUT_ROW = "INSERT OR REPLACE INTO task_keys VALUES (?, ?, ?, ?, ?, ?, ?)"


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


class KeyIndex:
    """Task keys of the store's runs; thread-safe (one connection, one lock)."""

    def __init__(self, store: StoreLayout, path: Path | str = ":memory:") -> None:
        self._store = store
        self._lock = threading.Lock()
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        as_cache(self._db)
        self._db.executescript(_SCHEMA)

    def close(self) -> None:
        self._db.close()

    def rebuild(self, records: Iterable[RunRecord]) -> int:
        """Replaces the index with the keys of `records` (every run of the store); returns the rows."""
        rows = [row for record in records for row in _rows(record)]
        with self._lock:
            self._db.execute("BEGIN")
            self._db.execute("DELETE FROM task_keys")
            self._db.executemany(_PUT_ROW, rows)
            self._db.execute("COMMIT")
        return len(rows)

    def update(self, record: RunRecord, *, new: bool = False) -> None:
        """Records the keys of one run's ended tasks as they are now (a task ended, a run was submitted: `new`,
        a run with no rows yet).

        An ended task stays ended with its key, so a run's rows are only added or changed, never removed: one
        statement (in one transaction where it writes several rows). Each call into SQLite lets the interpreter's
        lock go, and taking it back waits for the threads that run meanwhile, all while this index's lock is held:
        concurrent submissions queue on every call made under it."""
        rows = list(_rows(record))
        if not rows:  # rows are of ended tasks, which stay ended: a run without one has none to replace either
            return
        with self._lock:
            # A run whose tasks all ended at submission (reused) ends with the rows it was submitted with: a read
            # costs a tenth of rewriting them.
            if not new and sorted(self._db.execute(_RUN_ROWS, (record.run_id,)).fetchall()) == sorted(rows):
                return
            if len(rows) == 1:
                self._db.execute(_PUT_ROW, rows[0])
                return
            self._db.execute("BEGIN")
            self._db.executemany(_PUT_ROW, rows)
            self._db.execute("COMMIT")

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
            for run_id, task_id in self._candidates(key, states, split_only, person, resume_from, only, exclude_run):
                record = load(run_id)
                task = record.tasks.get(task_id) if record is not None else None
                if (
                    record is None
                    or task is None
                    or task.key != key
                    or task.state.value not in states
                    or not may_reuse(caller, record.identity, read_policy)
                ):
                    continue
                layout = self._store.run(run_id).task(task_id)
                if not split_only and outputs_complete(layout):
                    return ReuseSource(run_id, task_id)
                if split_only and task.split:
                    units = done_units(layout)
                    if units:
                        return ReuseSource(run_id, task_id, units)
        return None

    def _candidates(
        self,
        key: str,
        states: tuple[str, ...],
        split_only: bool,
        person: str | None,
        resume_from: str | None,
        only: str | None,
        exclude_run: str | None,
    ) -> Iterator[tuple[str, str]]:
        """The (run, task) rows of `key` in `states`, the rows of `resume_from` first, then the others newest
        first; read a page at a time, each under the lock, so a long history is read only as far as it is used.

        A page starts after the last row of the one before (by `ended_at`, run and task: the index's order, so
        no page is sorted), so a row written meanwhile neither shifts nor repeats one."""
        where = f"key = ? AND state IN ({', '.join('?' * len(states))})"
        parameters: tuple[object, ...] = (key, *states)
        if split_only:
            where += " AND split = 1"
        if person is not None:
            where += " AND principal = ?"
            parameters += (person,)
        if exclude_run:
            where += " AND run_id != ?"
            parameters += (exclude_run,)
        columns = "SELECT run_id, task_id, ended_at FROM task_keys WHERE "
        if resume_from:
            with self._lock:
                # `+key`: found by the run (the primary key), not among every row of the key.
                rows = self._db.execute(
                    columns + "+" + where + " AND run_id = ? ORDER BY ended_at DESC, task_id DESC",
                    (*parameters, resume_from),
                ).fetchall()
            yield from ((run_id, task_id) for run_id, task_id, _ in rows)
            if only:
                return
            where += " AND run_id != ?"
            parameters += (resume_from,)
        order = " ORDER BY ended_at DESC, run_id DESC, task_id DESC LIMIT ?"
        after: tuple[str, str, str] | None = None
        while True:
            with self._lock:
                if after is None:
                    rows = self._db.execute(columns + where + order, (*parameters, PAGE_ROWS)).fetchall()
                else:
                    rows = self._db.execute(
                        columns + where + " AND (ended_at, run_id, task_id) < (?, ?, ?)" + order,
                        (*parameters, after[2], after[0], after[1], PAGE_ROWS),
                    ).fetchall()
            yield from ((run_id, task_id) for run_id, task_id, _ in rows)
            if len(rows) < PAGE_ROWS:
                return
            after = rows[-1]

    def _load(self, run_id: str) -> RunRecord | None:
        try:
            return RunRecord.load(self._store.run(run_id))
        except (OSError, ValueError):
            return None


def _rows(record: RunRecord) -> Iterable[tuple[str, str, str, str, str, int, str]]:
    """The rows of a run's keyed tasks that have ended (only those can be reused)."""
    for task in record.tasks.values():
        if task.key and task.state.value in _REUSABLE_STATES:
            yield _row(record, task)


def _row(record: RunRecord, task: TaskRecord) -> tuple[str, str, str, str, str, int, str]:
    ended = (task.ended_at or record.ended_at or record.updated_at).isoformat()
    who = principal(record.identity)
    return (task.key or "", record.run_id, task.task_id, who, task.state.value, int(task.split), ended)
