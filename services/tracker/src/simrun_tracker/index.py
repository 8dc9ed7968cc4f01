"""The SQLite index of runs: a cache of the records for listing, rebuilt from them at start.

A cache needs no durability, and the store may be NFS, where SQLite's WAL does not work: the index uses a rollback
journal without fsync (`as_cache`), beside the store by default or on local disk where the config says.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from simrun_core.key_index import as_cache, start_writer
from simrun_runtime.layout import SUMMARY, StoreLayout, read_beneath
from simrun_runtime.record import RunRecord
from sqlalchemy import Engine, Index, event, inspect, tuple_
from sqlmodel import Field, Session, SQLModel, col, create_engine, select

log = logging.getLogger(__name__)


class RunRow(SQLModel, table=True):
    """One run as the concepts page lists it: id, owner, agent, group, workflow, state, times, pending release
    and cancellation, snapshots and summary."""

    __tablename__ = "runs"
    # Keyset paging walks these, newest first: a page reads its own rows, however deep (or filtered by state).
    __table_args__ = (
        Index("ix_runs_listing", "created_at", "run_id"),
        Index("ix_runs_state_listing", "state", "created_at", "run_id"),
    )
    run_id: str = Field(primary_key=True)
    owner: str = Field(index=True, description="The person: the submitter, or the person an agent acts for.")
    agent: str | None = Field(default=None, index=True, description="The agent that submitted it, if one did.")
    group: str = Field(index=True)
    workflow: str = Field(description="The workflow's name.")
    state: str = Field(index=True)
    created_at: datetime = Field(index=True)
    updated_at: datetime
    ended_at: datetime | None = None
    pending_release: bool = Field(default=False, description="A reservation it holds, released when it ends.")
    cancel_requested: bool = False
    snapshots: str = Field(default="[]", description="JSON list of `<name>/<snapshot_id>`.")
    summary: str = Field(default="{}", description="JSON: task id -> its summary.json, once merged.")
    request_id: str = Field(default="", index=True, description="The submitter's request id, if it gave one.")


@dataclass(frozen=True)
class Visibility:
    """Whose runs a listing shows: a person's (their own and their agents'), an agent's own, or both."""

    person: str | None = None
    agent: str | None = None


IndexRow = dict[str, Any]
"""A run's row as its column values: what `put` queues and the writer inserts (no ORM object is made per save)."""


def row_from_record(record: RunRecord, summary: dict[str, object]) -> IndexRow:
    identity = record.identity
    is_agent = identity.kind == "agent"
    return dict(
        run_id=record.run_id,
        owner=(identity.on_behalf_of or identity.name) if is_agent else identity.name,
        agent=identity.name if is_agent else None,
        group=record.group,
        workflow=str(record.workflow.get("name", "workflow")),
        state=record.state.value,
        created_at=record.created_at,
        updated_at=record.updated_at,
        ended_at=record.ended_at,
        pending_release=bool(record.reservation) and not record.state.final,
        cancel_requested=record.cancel_requested,
        snapshots=json.dumps([f"{s.name}/{s.snapshot_id}" for s in record.snapshots]),
        summary=json.dumps(summary, sort_keys=True),
        request_id=record.request_id,
    )


SUMMARY_BYTES = 1 << 20
"""The most of a task's summary.json the index and compare read."""


def task_summaries(store: StoreLayout, record: RunRecord) -> dict[str, object]:
    """The summary.json of each merged task of a run.

    Read without following links (`read_beneath`): the task's pods write its folder, and a summary made a link
    to another run's or to the home would show that to whoever reads this run. At most 1 MiB of each.
    """
    run = store.run(record.run_id)
    summaries: dict[str, object] = {}
    for task_id in record.tasks:
        task = run.task(task_id)
        try:
            summaries[task_id] = json.loads(read_beneath(task.root, "out", SUMMARY, limit=SUMMARY_BYTES))
        except (OSError, ValueError):
            continue
    return summaries


def _filtered(query: Any, group: str, state: str, owner: str, visible: Visibility | None = None) -> Any:
    """A query of runs with the filters of a listing, newest first; `visible` is the read policy's filter."""
    if visible is not None:
        query = query.where((RunRow.owner == (visible.person or "")) | (RunRow.agent == (visible.agent or "")))
    if group:
        query = query.where(RunRow.group == group)
    if state:
        query = query.where(RunRow.state == state)
    if owner:
        query = query.where((RunRow.owner == owner) | (RunRow.agent == owner))
    return query.order_by(col(RunRow.created_at).desc(), col(RunRow.run_id).desc())


COLUMNS = tuple(RunRow.model_fields)
INSERT = "INSERT OR REPLACE INTO {} ({}) VALUES ({})".format(
    RunRow.__tablename__, ", ".join(f'"{c}"' for c in COLUMNS), ", ".join("?" for _ in COLUMNS)
)
"""The writer's statement, run by the database's own driver: SQLAlchemy's insert cost 10 times the row's own
write, and the writer takes the interpreter's lock from every submission and driver step."""


def _values(row: IndexRow) -> tuple[object, ...]:
    return tuple(_column_value(row[column]) for column in COLUMNS)


def _column_value(value: object) -> object:
    """A row's value as SQLAlchemy's SQLite dialect stores it, so its reads and keyset paging see the same text: a
    time as `YYYY-MM-DD HH:MM:SS.ffffff` (its zone dropped), a flag as 0 or 1."""
    if isinstance(value, datetime):
        return (
            f"{value.year:04d}-{value.month:02d}-{value.day:02d} "
            f"{value.hour:02d}:{value.minute:02d}:{value.second:02d}.{value.microsecond:06d}"
        )
    if isinstance(value, bool):
        return int(value)
    return value


class RunIndex:
    """Lists and filters runs without reading every record; the records stay the source of truth.

    Rows are written in batches by a writer thread: `put` only queues the row, so a submission or a driver step
    never waits on SQLite (or on another writer's transaction), and a read first writes what is queued, so it sees
    every row put before it. Rows queued when the process dies are lost with it, which a cache can afford:
    `rebuild` fills the index from the records at the next start.
    """

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        # One transaction at a time from this process: SQLite's own locking makes a blocked writer sleep and retry
        # (1 ms, then 2, 5, 10... up to 100 ms), which concurrent submissions turned into tail latency.
        self._lock = threading.Lock()
        self._queued: dict[str, IndexRow] = {}
        self._queue_changed = threading.Condition()
        self._closed = False
        self._engine: Engine = create_engine(f"sqlite:///{path}", connect_args={"check_same_thread": False})

        @event.listens_for(self._engine, "connect")
        def _pragmas(dbapi_connection, _record) -> None:  # type: ignore[no-untyped-def]
            as_cache(dbapi_connection)

        # A cache: an index written by another version of simrun is dropped whole, and `rebuild` fills it again.
        tables = inspect(self._engine)
        if tables.has_table(RunRow.__tablename__):
            have = {c["name"] for c in tables.get_columns(RunRow.__tablename__)}
            if have != set(RunRow.model_fields):
                SQLModel.metadata.drop_all(self._engine, tables=[SQLModel.metadata.tables[RunRow.__tablename__]])
        table = SQLModel.metadata.tables[RunRow.__tablename__]
        SQLModel.metadata.create_all(self._engine, tables=[table])
        for index in table.indexes:  # an index of this version on a table an earlier one made
            index.create(self._engine, checkfirst=True)
        self._writes = sqlite3.connect(path, check_same_thread=False)
        as_cache(self._writes)
        self._writer = start_writer(
            "run-index-writer", self._queue_changed, lambda: bool(self._queued), lambda: self._closed, self.flush
        )

    def rebuild(self, store: StoreLayout) -> list[RunRecord]:
        """Empties the index and fills it from every `runs/<id>/run.json`; returns the records read."""
        records: list[RunRecord] = []
        if store.runs.is_dir():
            for run_dir in sorted(store.runs.iterdir()):
                layout = store.run(run_dir.name)
                # `.staging-<id>/` is a run whose submission never finished: it has no place in the store.
                if run_dir.name.startswith(".") or not layout.record.is_file():
                    continue
                records.append(RunRecord.load(layout))
        rows = [row_from_record(record, task_summaries(store, record)) for record in records]
        with self._lock, self._writes:
            self._writes.execute(f"DELETE FROM {RunRow.__tablename__}")
            self._writes.executemany(INSERT, [_values(row) for row in rows])
        return records

    def put(self, row: IndexRow) -> None:
        """Queues a run's row to be inserted or replaced (a later row of the same run replaces a queued one)."""
        with self._queue_changed:
            if not self._queued:  # the writer waits for the first row only; later ones join its window
                self._queue_changed.notify()
            self._queued[row["run_id"]] = row

    def flush(self) -> None:
        """Writes the queued rows now, in one transaction (one by one if a row is refused)."""
        with self._lock:
            with self._queue_changed:
                rows, self._queued = list(self._queued.values()), {}
            if not rows:
                return
            try:
                self._write(rows)
            except (sqlite3.IntegrityError, sqlite3.DataError):
                # A row's own fault: the others go in one by one, and a bad one is left out (logged), so it cannot
                # keep every later row out of the index.
                for index, row in enumerate(rows):
                    try:
                        self._write([row])
                    except (sqlite3.IntegrityError, sqlite3.DataError) as exc:
                        log.error("run %s left out of the index: %s", row["run_id"], str(exc).splitlines()[0])
                    except BaseException:
                        self._queue_again(rows[index:])
                        raise
            except BaseException:
                self._queue_again(rows)  # the database's fault (a full disk, an I/O error): tried again later
                raise

    def _write(self, rows: list[IndexRow]) -> None:
        with self._writes:  # one transaction: committed, or rolled back on an error
            self._writes.executemany(INSERT, [_values(row) for row in rows])

    def _queue_again(self, rows: list[IndexRow]) -> None:
        """Queues rows again, behind any newer row of the same run."""
        with self._queue_changed:
            self._queued = {**{row["run_id"]: row for row in rows}, **self._queued}

    def rows(
        self, group: str = "", state: str = "", owner: str = "", visible: Visibility | None = None
    ) -> list[RunRow]:
        """Runs newest first, filtered; `owner` matches the person or the agent; `visible` is the read policy's
        filter (`Guard.visibility`), None for every run."""
        self.flush()
        with self._lock, Session(self._engine) as session:
            return list(session.exec(_filtered(select(RunRow), group, state, owner, visible)))

    def page(
        self,
        group: str,
        state: str,
        owner: str,
        after: tuple[datetime, str] | None,
        limit: int,
        visible: Visibility | None = None,
    ) -> list[tuple[str, datetime]]:
        """(run id, created) of at most `limit` runs newest first, after the (created, run id) of a page's last row:
        keyset paging reads the rows of its page only."""
        query = _filtered(select(RunRow.run_id, RunRow.created_at), group, state, owner, visible)
        if after is not None:
            created, run_id = after
            # A row value, which SQLite walks on the listing index (an OR of the two sorted every earlier row).
            query = query.where(tuple_(col(RunRow.created_at), col(RunRow.run_id)) < tuple_(created, run_id))
        self.flush()
        with self._lock, Session(self._engine) as session:
            return [(run_id, created) for run_id, created in session.exec(query.limit(limit))]

    def find_request(self, submitter: str, request_id: str) -> str | None:
        """The run an identity submitted with a request id, if any: a retried submission returns it."""
        query = select(RunRow).where(RunRow.request_id == request_id)
        self.flush()
        with self._lock, Session(self._engine) as session:
            for row in session.exec(query):
                if (row.agent or row.owner) == submitter:
                    return row.run_id
        return None

    def close(self) -> None:
        """Writes what is queued, stops the writer and closes the database."""
        with self._queue_changed:
            self._closed = True
            self._queue_changed.notify()
        self._writer.join(timeout=10)
        self.flush()
        self._writes.close()
        self._engine.dispose()
