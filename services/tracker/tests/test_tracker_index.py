"""The SQLite index of runs: rebuilt from the run records, filtered, newest first."""

from __future__ import annotations

import json
import shutil
import sqlite3
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from simrun_core.errors import NotFound
from simrun_runtime.layout import StoreLayout
from simrun_runtime.record import Identity, OomKill, RunRecord, RunState, TaskRecord
from simrun_tracker.index import RunIndex, row_from_record
from simrun_tracker.runstore import RunStore
from sqlalchemy.dialects import sqlite
from sqlalchemy.dialects.sqlite.base import DATETIME

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
ALICE = Identity(name="alice", kind="owner", priority="owner")
BOB = Identity(name="bob", kind="person", priority="standard")
BOB_AGENT = Identity(name="bob-agent", kind="agent", on_behalf_of="bob", priority="agent")


@pytest.fixture
def store(tmp_path: Path) -> StoreLayout:
    return StoreLayout(tmp_path / "store")


@pytest.fixture
def index(tmp_path: Path) -> Iterator[RunIndex]:
    index = RunIndex(tmp_path / "index" / "runs.sqlite")
    yield index
    index.close()


def save(
    store: StoreLayout,
    run_id: str,
    identity: Identity,
    minutes: int,
    *,
    group: str = "default",
    state: RunState = RunState.RUNNING,
    reservation: str | None = None,
) -> RunRecord:
    record = RunRecord(
        run_id=run_id,
        group=group,
        workflow={"name": f"wf-{run_id}", "tasks": {"scan": {"type": "m:Scan"}}},
        identity=identity,
        state=state,
        tasks={"scan": TaskRecord(task_id="scan", type="m:Scan")},
        reservation=reservation,
        created_at=T0 + timedelta(minutes=minutes),
    )
    record.save(store.run(run_id))
    return record


def index_file(index: RunIndex) -> str:
    return str(index._engine.url.database)


def ids(rows: list) -> list[str]:
    return [row.run_id for row in rows]


def test_rebuild_reads_every_record_into_rows(store: StoreLayout, index: RunIndex) -> None:
    save(store, "r1", ALICE, 1, group="paper", state=RunState.SUCCEEDED, reservation="big")
    save(store, "r2", BOB_AGENT, 2, reservation="big")
    (store.runs / "not-a-run").mkdir()  # no run.json: skipped
    summary = store.run("r1").task("scan").summary
    summary.parent.mkdir(parents=True)
    summary.write_text(json.dumps({"points": 8}))

    records = index.rebuild(store)

    assert sorted(r.run_id for r in records) == ["r1", "r2"]
    r2, r1 = index.rows()
    assert (r1.owner, r1.agent, r1.group, r1.workflow, r1.state) == ("alice", None, "paper", "wf-r1", "succeeded")
    assert (r2.owner, r2.agent, r2.group) == ("bob", "bob-agent", "default")
    assert json.loads(r1.summary) == {"scan": {"points": 8}}
    assert json.loads(r2.summary) == {}
    # A reservation is pending release until its run ends.
    assert (r1.pending_release, r2.pending_release) == (False, True)


def test_an_empty_store_gives_an_empty_index(store: StoreLayout, index: RunIndex) -> None:
    assert index.rebuild(store) == []
    assert index.rows() == []


def test_list_is_newest_first(store: StoreLayout, index: RunIndex) -> None:
    save(store, "b", ALICE, 2)
    save(store, "a", ALICE, 3)
    save(store, "c", ALICE, 1)
    index.rebuild(store)
    assert ids(index.rows()) == ["a", "b", "c"]


def test_filters(store: StoreLayout, index: RunIndex) -> None:
    save(store, "r1", ALICE, 1, group="paper", state=RunState.SUCCEEDED)
    save(store, "r2", BOB, 2, group="paper")
    save(store, "r3", BOB_AGENT, 3, group="scratch")
    save(store, "r4", BOB_AGENT, 4, group="paper", state=RunState.FAILED)
    index.rebuild(store)
    assert ids(index.rows(group="paper")) == ["r4", "r2", "r1"]
    assert ids(index.rows(state="running")) == ["r3", "r2"]
    assert ids(index.rows(owner="alice")) == ["r1"]
    # The person matches the runs of their agent; the agent only its own.
    assert ids(index.rows(owner="bob")) == ["r4", "r3", "r2"]
    assert ids(index.rows(owner="bob-agent")) == ["r4", "r3"]
    assert ids(index.rows(group="paper", state="running", owner="bob")) == ["r2"]
    assert index.rows(group="nope") == []


def test_rebuild_replaces_the_old_rows(store: StoreLayout, index: RunIndex) -> None:
    save(store, "r1", ALICE, 1)
    save(store, "r2", BOB, 2)
    index.rebuild(store)
    shutil.rmtree(store.run("r1").root)
    save(store, "r2", BOB, 2, state=RunState.CANCELLED)
    save(store, "r3", BOB, 3)
    index.rebuild(store)
    assert [(row.run_id, row.state) for row in index.rows()] == [("r3", "running"), ("r2", "cancelled")]


def test_put_adds_or_replaces_a_row(store: StoreLayout, index: RunIndex) -> None:
    record = save(store, "r1", ALICE, 1)
    index.put(row_from_record(record, {}))
    record.state = RunState.SUCCEEDED
    index.put(row_from_record(record, {"scan": {"points": 1}}))
    (row,) = index.rows()
    assert (row.run_id, row.state, json.loads(row.summary)) == ("r1", "succeeded", {"scan": {"points": 1}})


def test_the_index_survives_a_reopen(tmp_path: Path, store: StoreLayout) -> None:
    path = tmp_path / "runs.sqlite"
    first = RunIndex(path)
    save(store, "r1", ALICE, 1)
    first.rebuild(store)
    first.close()
    second = RunIndex(path)
    try:
        assert ids(second.rows()) == ["r1"]
    finally:
        second.close()


def test_rebuild_skips_a_run_left_in_staging(store: StoreLayout, index: RunIndex) -> None:
    save(store, "r1", ALICE, 0)
    save(store, "r2", ALICE, 1)
    store.run("r2").root.rename(store.run_staging("r2").root)  # a submission that stopped before its rename
    assert [r.run_id for r in index.rebuild(store)] == ["r1"]
    assert ids(index.rows()) == ["r1"]


def test_pages_follow_the_last_row_of_the_one_before_ties_included(store: StoreLayout, tmp_path: Path) -> None:
    from simrun_core.errors import InvalidArgument
    from simrun_tracker.executor import TaskOrdering
    from simrun_tracker.reads import RunReader
    from simrun_tracker.runstore import RunStore

    for index in range(23):
        # Three runs share each minute: the run id breaks the tie.
        save(store, f"r{index:02d}", BOB if index % 2 else ALICE, index // 3, state=RunState.SUCCEEDED)
    runs = RunStore(store, tmp_path / "paging.sqlite")
    runs.load()
    reader = RunReader(runs, executor=type("NoExecutor", (), {"ordering": TaskOrdering.DRIVER})())  # type: ignore[arg-type]
    try:
        seen, token, pages = [], "", 0
        while True:
            records, token = reader.page("", "", "", 7, token)
            seen += [r.run_id for r in records]
            pages += 1
            if not token:
                break
        assert pages == 4 and seen == ids(runs.index.rows()) and len(set(seen)) == 23
        bobs, _ = reader.page("", "", "bob", 100, "")
        assert {r.identity.name for r in bobs} == {"bob"} and len(bobs) == 11
        _, bob_token = reader.page("", "", "bob", 2, "")
        with pytest.raises(InvalidArgument, match="another listing"):
            reader.page("", "", "alice", 2, bob_token)
        with pytest.raises(InvalidArgument, match="bad page_token"):
            reader.page("", "", "", 2, "not-a-token")
    finally:
        runs.close()


def test_rows_put_from_many_threads_are_read_at_once_and_kept_across_a_close(
    tmp_path: Path, store: StoreLayout
) -> None:
    path = tmp_path / "runs.sqlite"
    first = RunIndex(path)
    records = [save(store, f"r{i:03d}", ALICE, i) for i in range(200)]
    with ThreadPoolExecutor(max_workers=10) as pool:
        list(pool.map(lambda record: first.put(row_from_record(record, {})), records))
    assert len(first.rows()) == 200  # a read sees every row put before it, written or still queued
    records[0].state = RunState.SUCCEEDED
    first.put(row_from_record(records[0], {}))
    assert first.page("", "succeeded", "", None, 10)[0][0] == "r000"
    records[1].state = RunState.FAILED
    first.put(row_from_record(records[1], {}))
    first.close()  # what was queued is written before the database closes
    second = RunIndex(path)
    try:
        assert ids(second.rows(state="failed")) == ["r001"]
    finally:
        second.close()


def test_a_row_the_database_refuses_is_left_out_and_the_others_are_written(
    store: StoreLayout, index: RunIndex, caplog: pytest.LogCaptureFixture
) -> None:
    good = [save(store, f"r{i}", ALICE, i) for i in range(3)]
    bad = row_from_record(save(store, "bad", ALICE, 9), {})
    bad["workflow"] = None  # NOT NULL in the table: as a row the database refuses
    with index._lock:  # the writer waits: the bad row is in the same batch as the good ones
        for record in good[:2]:
            index.put(row_from_record(record, {}))
        index.put(bad)
        index.put(row_from_record(good[2], {}))
    assert ids(index.rows()) == ["r2", "r1", "r0"]
    assert "run bad left out of the index" in caplog.text
    index.put(row_from_record(save(store, "r3", ALICE, 3), {}))
    assert ids(index.rows())[0] == "r3"  # nothing of the bad row stays queued in the way


def test_the_run_store_hands_out_copies_that_share_nothing_with_what_it_keeps(tmp_path: Path) -> None:
    runs = RunStore(StoreLayout(tmp_path / "store"), tmp_path / "index.sqlite")
    record = RunRecord(
        run_id="r1",
        workflow={"name": "wf", "tasks": {"scan": {"type": "m:Scan", "settings": {"grid": [1, 2, {"x": None}]}}}},
        identity=BOB_AGENT,
        state=RunState.RUNNING,
        tasks={
            "scan": TaskRecord(
                task_id="scan", type="m:Scan", plan={"pods": [{"workers": 2}]}, attempts={"w0": 1}, inputs={}
            )
        },
        oom_kills=[OomKill(task_id="scan", worker="w1", memory_gb=1.0, per_worker_gb=0.5)],
        created_at=T0,
    )
    created = runs.create(record, lambda staging: None)
    try:
        assert created is record  # the caller's own: the store keeps a copy of its own
        created.tasks["scan"].attempts["w0"] = 3
        assert runs.get("r1").tasks["scan"].attempts["w0"] == 1, "the caller's record reached what the store keeps"
        created.tasks["scan"].attempts["w0"] = 1
        copy = runs.get("r1")
        assert copy == record
        copy.workflow["tasks"]["scan"]["settings"]["grid"][2]["x"] = "changed"
        assert copy.tasks["scan"].plan is not None
        copy.tasks["scan"].plan["pods"][0]["workers"] = 9
        copy.tasks["scan"].attempts["w0"] = 5
        copy.oom_kills[0].memory_gb = 7.0
        copy.identity.name = "mallory"
        again = runs.get("r1")
        assert again == record, "a change to a copy reached the record the store keeps"
        # To read only (an earlier run to reuse), the store's own record, without a copy: active or final.
        assert runs.read("r1") is runs.read("r1") == record
        final = again.model_copy(update={"state": RunState.SUCCEEDED})
        runs.save(final)
        assert runs.read("r1") is runs.read("r1") is runs.get("r1")
        with pytest.raises(NotFound):
            runs.read("r2")
    finally:
        runs.index.close()


def test_a_placed_run_s_record_is_the_store_s_own(tmp_path: Path) -> None:
    """A submission's record is placed without a copy (the submission only reads it then): readers that only
    read share it, and `get` still hands out copies of it."""
    runs = RunStore(StoreLayout(tmp_path / "store"), tmp_path / "index.sqlite")
    record = RunRecord(run_id="r1", identity=BOB_AGENT, created_at=T0)
    try:
        placed = runs.place(record, runs.stage(record, lambda staging: None))
        assert placed is record is runs.read("r1")
        copy = runs.get("r1")
        assert copy == record and copy is not record
    finally:
        runs.index.close()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    created=st.datetimes(timezones=st.just(UTC)),
    ended=st.none() | st.datetimes(),
    flags=st.tuples(st.booleans(), st.booleans()),
)
def test_the_writer_stores_each_value_as_sqlalchemy_reads_it(
    index: RunIndex, created: datetime, ended: datetime | None, flags: tuple[bool, bool]
) -> None:
    """The writer goes around SQLAlchemy: what it stores is the text the dialect stores, so reads, filters and
    keyset paging see the same times and flags as for a row SQLAlchemy wrote."""
    row = {
        "run_id": "r",
        "owner": "alice",
        "agent": None,
        "group": "default",
        "workflow": "wf",
        "state": "running",
        "created_at": created,
        "updated_at": created,
        "ended_at": ended,
        "pending_release": flags[0],
        "cancel_requested": flags[1],
        "snapshots": "[]",
        "summary": "{}",
        "request_id": "",
    }
    index.put(row)
    [read] = index.rows()
    dialect = sqlite.dialect()
    stored = DATETIME().bind_processor(dialect)
    assert read.created_at.replace(tzinfo=None) == created.replace(tzinfo=None)
    assert (read.ended_at and read.ended_at.replace(tzinfo=None)) == ended
    assert (read.pending_release, read.cancel_requested) == flags
    with sqlite3.connect(index_file(index)) as db:
        text = db.execute("SELECT created_at, ended_at, pending_release FROM runs").fetchone()
    assert text == (stored(created), stored(ended) if ended else None, int(flags[0]))
    assert index.page("", "", "", (created + timedelta(microseconds=1), "r"), 10) == [("r", read.created_at)]
    assert index.page("", "", "", (created, "r"), 10) == []
