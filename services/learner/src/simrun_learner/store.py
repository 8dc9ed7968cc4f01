"""The learner's persistence: observations in SQLite through sqlmodel, one row per pod of a finished task."""

from __future__ import annotations

import json
import sqlite3
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import Index, Row, Select, bindparam, or_, tuple_
from sqlalchemy.exc import IntegrityError
from sqlmodel import Field, Session, SQLModel, create_engine, select

from simrun_learner.rules import WINDOW, Observation, ObservationKey

CACHED_KEYS = 1024
"""How many reads of keys' observations the store keeps in memory (the least recently read go first)."""


class ObservationRow(SQLModel, table=True):
    """An observation as stored; times in UTC, unit seconds a JSON list."""

    __tablename__ = "observations"
    __table_args__ = (Index("ix_observations_key", "task_type", "model", "cost_value", "observed_at", "id"),)

    id: int | None = Field(default=None, primary_key=True)
    task_type: str
    model: str
    cost_value: str = ""
    per_worker_gb: float | None = None
    oom_killed: bool = False
    oom_per_worker_gb: float | None = None
    succeeded: bool = False
    unit_seconds: str = "[]"
    run_id: str = ""
    source: str = ""
    observed_at: datetime


_SOURCE_INDEX = "CREATE UNIQUE INDEX IF NOT EXISTS ix_observations_source ON observations (source) WHERE source != ''"


class ObservationStore:
    """The observations of every key in one SQLite file (`StoreLayout.observations`)."""

    def __init__(self, path: Path | str) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        # The gRPC server calls from a pool of threads; each call opens its own session. The store may sit on
        # NFS, where SQLite's WAL does not work, so the default rollback journal stays with a busy timeout.
        self._engine = create_engine(f"sqlite:///{path}", connect_args={"check_same_thread": False, "timeout": 30})
        SQLModel.metadata.create_all(self._engine, tables=[SQLModel.metadata.tables[ObservationRow.__tablename__]])
        with self._engine.begin() as connection:  # a store of an older learner gains the column
            columns = {row[1] for row in connection.exec_driver_sql("PRAGMA table_info(observations)")}
            if "source" not in columns:
                connection.exec_driver_sql("ALTER TABLE observations ADD COLUMN source VARCHAR NOT NULL DEFAULT ''")
            connection.exec_driver_sql(_SOURCE_INDEX)
        # Every submission reads its keys' observations, which change only when a task ends: they are kept here,
        # valid while SQLite's data_version of one watching connection is unchanged (it changes with every commit
        # of any other connection, this process's or another's).
        self._watch = sqlite3.connect(path, check_same_thread=False, timeout=30)
        self._watch_lock = threading.Lock()
        self._queries = _KeyQueries.build()
        self._cache: OrderedDict[tuple[str, ObservationKey], tuple[int, tuple[Observation, ...]]] = OrderedDict()

    def add(self, observation: Observation) -> Observation:
        """Stores an observation; returns it with its id and time (now, unless it has one). An observation of a
        source already stored is not stored again: the stored one is returned (a unique index decides)."""
        if observation.source:
            existing = self._of_source(observation.source)
            if existing is not None:
                return existing
        observed_at = observation.observed_at or datetime.now(UTC)
        row = ObservationRow(
            task_type=observation.key.task_type,
            model=observation.key.model,
            cost_value=observation.key.cost_value,
            per_worker_gb=observation.per_worker_gb,
            oom_killed=observation.oom_killed,
            oom_per_worker_gb=observation.oom_per_worker_gb,
            succeeded=observation.succeeded,
            unit_seconds=json.dumps(list(observation.unit_seconds)),
            run_id=observation.run_id,
            source=observation.source,
            observed_at=observed_at.astimezone(UTC),
        )
        with Session(self._engine) as session:
            session.add(row)
            try:
                session.commit()
            except IntegrityError:  # stored by another process since the look above
                existing = self._of_source(observation.source)
                if existing is None:
                    raise
                return existing
            session.refresh(row)
            return _observation(row)

    def _of_source(self, source: str) -> Observation | None:
        with Session(self._engine) as session:
            row = session.exec(select(ObservationRow).where(ObservationRow.source == source)).first()
            return None if row is None else _observation(row)

    def of_key(self, key: ObservationKey) -> list[Observation]:
        """Every observation of a key, oldest first (by time, then by the order they were stored)."""
        return self._cached(("all", key), lambda: self._read_key(key))

    def _cached(self, name: tuple[str, ObservationKey], read: Callable[[], list[Observation]]) -> list[Observation]:
        """What `read` gives, kept while no connection has committed since (SQLite's data_version)."""
        with self._watch_lock:
            version = self._watch.execute("PRAGMA data_version").fetchone()[0]
            cached = self._cache.get(name)
            if cached is not None and cached[0] == version:
                self._cache.move_to_end(name)
                return list(cached[1])
        observations = read()
        with self._watch_lock:
            self._cache[name] = (version, tuple(observations))
            self._cache.move_to_end(name)
            while len(self._cache) > CACHED_KEYS:
                self._cache.popitem(last=False)
        return observations

    def rule_inputs(self, key: ObservationKey) -> list[Observation]:
        """The observations of a key that the learner's rules read, oldest first: the last `WINDOW`, and the kills
        and successes since the latest success of a run other than the latest successful one, or since that one
        if it names no run (`rules.oom_floor` lifts every kill before it: of two later successes of different runs,
        one is of another run). The rules answer over these as over every observation, at a cost that does not
        grow with the key's history."""
        return self._cached(("rules", key), lambda: self._read_rule_inputs(key))

    def _read_rule_inputs(self, key: ObservationKey) -> list[Observation]:
        queries, of_key = self._queries, _key_values(key)
        with self._engine.connect() as connection:
            rows = {row.id: row for row in connection.execute(queries.window, of_key)}
            deciding, since = queries.deciding, {}
            latest = connection.execute(queries.latest_success, of_key).first()
            # A success of no named run lifts every kill before it; else the latest success of another run does.
            lifting = latest
            if latest is not None and latest.run_id:
                place = {"run_id": latest.run_id, "at": latest.observed_at, "id": latest.id}
                lifting = connection.execute(queries.other_success, {**of_key, **place}).first()
            if lifting is not None:
                deciding, since = queries.deciding_since, {"at": lifting.observed_at, "id": lifting.id}
            rows.update((row.id, row) for row in connection.execute(deciding, {**of_key, **since}))
        return [_observation(row) for row in sorted(rows.values(), key=lambda row: (row.observed_at, row.id))]

    def page_of_key(
        self, key: ObservationKey, size: int, after: tuple[datetime, int] | None
    ) -> tuple[list[Observation], bool]:
        """Up to `size` observations of a key, oldest first, after the one stored at `after` (its time and id),
        and whether more follow: keyset paging through the key's index, so a page costs its rows only."""
        queries, values = self._queries, _key_values(key)
        statement = queries.page
        if after is not None:
            statement, values = queries.page_after, {**values, "at": after[0], "id": after[1]}
        with self._engine.connect() as connection:
            rows = list(connection.execute(statement.limit(size + 1), values))
        return [_observation(row) for row in rows[:size]], len(rows) > size

    def _read_key(self, key: ObservationKey) -> list[Observation]:
        with self._engine.connect() as connection:
            return [_observation(row) for row in connection.execute(self._queries.page, _key_values(key))]

    def delete_key(self, key: ObservationKey) -> int:
        """Deletes every observation of a key; how many there were."""
        with Session(self._engine) as session:
            rows = list(
                session.exec(
                    select(ObservationRow).where(
                        ObservationRow.task_type == key.task_type,
                        ObservationRow.model == key.model,
                        ObservationRow.cost_value == key.cost_value,
                    )
                )
            )
            for row in rows:
                session.delete(row)
            session.commit()
            return len(rows)

    def close(self) -> None:
        """Closes the connections of the store."""
        self._engine.dispose()
        with self._watch_lock:
            self._watch.close()


def _key_values(key: ObservationKey) -> dict[str, Any]:
    """The bound values that name a key in the statements of `_KeyQueries`."""
    return {"task_type": key.task_type, "model": key.model, "cost": key.cost_value}


@dataclass(frozen=True)
class _KeyQueries:
    """The statements that read one key's observations (all, a page, what the rules read), built once (building
    one costs more than running it); each takes the key as `task_type`, `model` and `cost` (`_key_values`), and a
    row's place as `at` and `id`."""

    window: Select[Any]
    latest_success: Select[Any]
    other_success: Select[Any]
    deciding: Select[Any]
    deciding_since: Select[Any]
    page: Select[Any]
    page_after: Select[Any]

    @classmethod
    def build(cls) -> _KeyQueries:
        table = SQLModel.metadata.tables[ObservationRow.__tablename__]
        c = table.c
        of_key = table.select().where(
            c.task_type == bindparam("task_type"), c.model == bindparam("model"), c.cost_value == bindparam("cost")
        )
        newest_first = (c.observed_at.desc(), c.id.desc())
        at = bindparam("at", type_=c.observed_at.type)
        place = tuple_(at, bindparam("id"))
        before = tuple_(c.observed_at, c.id) < place  # a row value: SQLite walks the key's index from the place
        deciding = of_key.where(or_(c.oom_killed, c.succeeded))
        return cls(
            window=of_key.order_by(*newest_first).limit(WINDOW),
            latest_success=of_key.where(c.succeeded).order_by(*newest_first).limit(1),
            other_success=of_key.where(c.succeeded, c.run_id != bindparam("run_id"), before)
            .order_by(*newest_first)
            .limit(1),
            deciding=deciding,
            deciding_since=deciding.where(tuple_(c.observed_at, c.id) >= place),
            page=of_key.order_by(c.observed_at, c.id),
            page_after=of_key.where(tuple_(c.observed_at, c.id) > place).order_by(c.observed_at, c.id),
        )


def _observation(row: ObservationRow | Row[Any]) -> Observation:
    return Observation(
        key=ObservationKey(row.task_type, row.model, row.cost_value),
        per_worker_gb=row.per_worker_gb,
        oom_killed=row.oom_killed,
        oom_per_worker_gb=row.oom_per_worker_gb,
        succeeded=row.succeeded,
        unit_seconds=tuple(json.loads(row.unit_seconds)),
        run_id=row.run_id,
        source=row.source,
        observed_at=row.observed_at.astimezone(UTC) if row.observed_at.tzinfo else row.observed_at.replace(tzinfo=UTC),
        observation_id=str(row.id),
    )
