"""The outputs of a run's tasks: listing and reading a port's files, and nothing outside the task's out/."""

from __future__ import annotations

from pathlib import Path

import pytest
from simrun_core.errors import FailedPrecondition, InvalidArgument, NotFound
from simrun_runtime.layout import StoreLayout
from simrun_runtime.record import Identity, RunRecord, TaskRecord, TaskState
from simrun_tracker.outputs import OutputStore


@pytest.fixture
def store(tmp_path: Path) -> StoreLayout:
    return StoreLayout(tmp_path / "store")


def _run(store: StoreLayout, state: TaskState = TaskState.SUCCEEDED) -> RunRecord:
    record = RunRecord(
        run_id="r1",
        identity=Identity(name="me", kind="owner", priority="owner"),
        tasks={
            "sim": TaskRecord(task_id="sim", type="m:Sim", state=state),
            "report": TaskRecord(task_id="report", type="m:R"),
        },
    )
    out = store.run("r1").task("sim").out
    (out / "table" / "deep").mkdir(parents=True)
    (out / "table" / "a.csv").write_text("x\n1\n")
    (out / "table" / "deep" / "b.bin").write_bytes(b"\0" * 2500)
    (out / "table" / "empty").write_bytes(b"")
    (out / "summary.json").write_text("{}")
    (out / "plots").mkdir()
    return record


def test_lists_each_port_s_files_with_store_paths_and_sizes(store: StoreLayout) -> None:
    record = _run(store)
    files = OutputStore(store).list_files(record)
    assert [(f.task_id, f.port, f.path, f.size_bytes) for f in files] == [
        ("sim", "table", "a.csv", 4),
        ("sim", "table", "empty", 0),
        ("sim", "table", "deep/b.bin", 2500),
    ]
    assert files[0].store_path == "runs/r1/tasks/sim/out/table/a.csv"
    assert (store.root / files[2].store_path).stat().st_size == 2500
    assert OutputStore(store).list_files(record, "sim", "plots") == []


def test_fetch_yields_every_file_in_chunks(store: StoreLayout) -> None:
    record = _run(store)
    chunks = list(OutputStore(store).fetch(record, "sim", "table", chunk_bytes=1000))
    assert [(c.path, c.offset, len(c.data)) for c in chunks] == [
        ("a.csv", 0, 4),
        ("empty", 0, 0),
        ("deep/b.bin", 0, 1000),
        ("deep/b.bin", 1000, 1000),
        ("deep/b.bin", 2000, 500),
    ]


def test_links_that_lead_out_of_the_outputs_are_left_out(store: StoreLayout, tmp_path: Path) -> None:
    record = _run(store)
    secret = tmp_path / "secret"
    secret.write_text("not yours")
    table = store.run("r1").task("sim").out / "table"
    (table / "leak").symlink_to(secret)
    (table / "record").symlink_to(store.run("r1").record)
    (table / "linked-dir").symlink_to(tmp_path, target_is_directory=True)
    (table / "inside").symlink_to(table / "a.csv")
    (store.run("r1").task("sim").out / "escape").symlink_to(tmp_path, target_is_directory=True)
    outputs = OutputStore(store)
    assert [f.path for f in outputs.list_files(record, "sim")] == ["a.csv", "empty", "inside", "deep/b.bin"]
    assert b"not yours" not in b"".join(c.data for c in outputs.fetch(record, "sim", "table"))
    with pytest.raises(NotFound, match="no output 'escape'"):
        outputs.list_files(record, "sim", "escape")


@pytest.mark.parametrize("port", ["../sim", "..", "table/../../x", "/etc", ""])
def test_a_port_name_that_is_a_path_is_refused(store: StoreLayout, port: str) -> None:
    record = _run(store)
    with pytest.raises(InvalidArgument):
        list(OutputStore(store).fetch(record, "sim", port))


def test_unknown_task_or_port_and_unfinished_tasks(store: StoreLayout) -> None:
    outputs = OutputStore(store)
    record = _run(store, TaskState.RUNNING)
    with pytest.raises(NotFound, match="no task 'nope'; its tasks: sim, report"):
        outputs.list_files(record, "nope")
    with pytest.raises(NotFound, match="its outputs: plots, table"):
        outputs.list_files(record, "sim", "tabel")
    with pytest.raises(InvalidArgument, match="give the task of the port"):
        outputs.list_files(record, "", "table")
    with pytest.raises(FailedPrecondition, match="is running"):
        list(outputs.fetch(record, "sim", "table"))
    assert outputs.list_files(record, "report") == []
