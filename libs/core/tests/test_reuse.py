"""Reuse's pure parts on real files: task keys, who may reuse, hard-linked outputs, seeded ledgers, the key index."""

from __future__ import annotations

import hashlib
import json
import os
import stat
from datetime import UTC, datetime, timedelta

import pytest
from pydantic import BaseModel, ConfigDict
from simrun_core.config import ReadPolicy
from simrun_core.errors import InvalidArgument
from simrun_core.identity import Identity, IdentityKind, Priority
from simrun_core.key_index import KeyIndex, ReuseSource
from simrun_core.reuse import (
    KeyInputs,
    ReusePolicy,
    SnapshotContent,
    UnitDescription,
    link_outputs,
    may_reuse,
    reuse_message,
    seed_ledger,
    snapshot_key,
    task_keys,
    unit_keys,
)
from simrun_runtime.layout import StoreLayout, TaskLayout
from simrun_runtime.ledger import Ledger, UnitRange, create_ledger
from simrun_runtime.record import Identity as RecordIdentity
from simrun_runtime.record import RunRecord, RunState, TaskRecord, TaskState
from simrun_runtime.reports import ProgressReader, read_progress

ALICE = Identity("alice", IdentityKind.OWNER, Priority.OWNER)
BOB = Identity("bob", IdentityKind.PERSON, Priority.STANDARD)
BOB_AGENT = Identity("bob-agent", IdentityKind.AGENT, Priority.AGENT, on_behalf_of="bob")
CAROL_AGENT = Identity("carol-agent", IdentityKind.AGENT, Priority.AGENT, on_behalf_of="carol")


def record_identity(identity: Identity) -> RecordIdentity:
    return RecordIdentity(
        name=identity.name,
        kind=identity.kind.value,
        on_behalf_of=identity.on_behalf_of,
        priority=identity.priority.value,
    )


class ScanSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    units: int = 100
    seed: int = 1


def workflow(scan: dict | None = None, fit: dict | None = None, port: str = "samples") -> dict[str, KeyInputs]:
    return {
        "scan": KeyInputs("m.tasks:Scan", ScanSettings(**(scan or {})).model_dump(mode="json"), {}, True),
        "fit": KeyInputs("m.tasks:Fit", fit or {"order": 2}, {"data": f"scan.{port}"}, False),
    }


def keys(tasks: dict[str, KeyInputs], snapshots: tuple[str, ...] = ("snap-1",), env: str = "env-1") -> dict[str, str]:
    return task_keys(["scan", "fit"], tasks, snapshots, env)


def test_equal_inputs_give_equal_keys_and_defaults_count_as_given():
    first = keys(workflow())
    assert first == keys(workflow({"units": 100}))  # a default given explicitly is the same setting
    assert first == keys(workflow(fit={"order": 2}))
    assert len(first["scan"]) == 64 and first["scan"] != first["fit"]


@pytest.mark.parametrize(
    "change",
    [
        lambda: keys(workflow({"seed": 2})),
        lambda: keys(workflow(), snapshots=("snap-2",)),
        lambda: keys(workflow(), snapshots=("snap-1", "data-1")),
        lambda: keys(workflow(), env="env-2"),
    ],
    ids=["setting", "snapshot", "another snapshot", "environment"],
)
def test_a_change_upstream_gives_both_tasks_new_keys(change):
    before, after = keys(workflow()), change()
    assert before["scan"] != after["scan"]
    assert before["fit"] != after["fit"]  # an upstream key is part of the key


def test_a_downstream_change_keeps_the_upstream_key():
    before, after = keys(workflow()), keys(workflow(fit={"order": 3}))
    assert before["scan"] == after["scan"]
    assert before["fit"] != after["fit"]
    assert keys(workflow(port="other"))["fit"] != before["fit"]  # the port read is part of it too
    split = {**workflow(), "fit": KeyInputs("m.tasks:Fit", {"order": 2}, {"data": "scan.samples"}, True)}
    assert keys(split)["fit"] != before["fit"]


def test_who_may_reuse_whose_runs():
    """Exactly the runs the caller may read: by default a person their own and their agents', an agent its own."""
    assert may_reuse(BOB, record_identity(BOB))
    assert may_reuse(BOB, record_identity(BOB_AGENT))
    assert may_reuse(BOB_AGENT, record_identity(BOB_AGENT))
    assert not may_reuse(BOB_AGENT, record_identity(BOB))  # it may not read its person's runs
    assert may_reuse(ALICE, record_identity(CAROL_AGENT))  # the owner reads every run
    assert not may_reuse(CAROL_AGENT, record_identity(BOB))
    assert not may_reuse(BOB_AGENT, record_identity(ALICE))
    # The server's read policy widens it the same way it widens reads.
    sharing = ReadPolicy(agents_see_their_person=True, people_see_all=True)
    assert may_reuse(BOB_AGENT, record_identity(BOB), sharing)
    assert not may_reuse(BOB_AGENT, record_identity(CAROL_AGENT), sharing)
    assert may_reuse(BOB, record_identity(CAROL_AGENT), sharing)


def test_reuse_policy_parses_the_cli_words():
    assert ReusePolicy.parse(None) is ReusePolicy.ANY
    assert ReusePolicy.parse("same-run") is ReusePolicy.SAME_RUN
    with pytest.raises(InvalidArgument, match="use never, same-run or any"):
        ReusePolicy.parse("sometimes")
    assert reuse_message("r1", "scan") == "reused from run r1 task scan"


def finished_outputs(task: TaskLayout) -> None:
    (task.out_port("samples") / "deep").mkdir(parents=True)
    (task.out_port("samples") / "deep" / "a.bin").write_bytes(b"\x00\x01")
    task.summary.write_text('{"mean": 1.5}')
    task.merge_marker.write_text("")


def test_outputs_are_hard_linked_read_only_and_outlive_their_run(tmp_path):
    store = StoreLayout(tmp_path)
    source, dest = store.run("r1").task("scan"), store.run("r2").task("scan")
    finished_outputs(source)
    (source.out_port("samples") / "latest").symlink_to("deep")  # a link to a folder stays a link
    assert link_outputs(source, dest)
    assert os.readlink(dest.out_port("samples") / "latest") == "deep"
    copied = dest.out_port("samples") / "deep" / "a.bin"
    original = source.out_port("samples") / "deep" / "a.bin"
    assert copied.read_bytes() == b"\x00\x01"
    assert os.stat(copied).st_ino == os.stat(original).st_ino
    assert not os.stat(copied).st_mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH)
    assert dest.merge_marker.is_file() and dest.summary.read_text() == '{"mean": 1.5}'
    assert not link_outputs(source, dest)  # outputs in place already
    for path in sorted(source.root.rglob("*"), reverse=True):
        path.unlink() if path.is_file() or path.is_symlink() else path.rmdir()
    assert copied.read_bytes() == b"\x00\x01"
    assert not list(dest.root.glob(".out.building-*"))


def test_unmerged_or_missing_outputs_are_a_miss(tmp_path):
    store = StoreLayout(tmp_path)
    source, dest = store.run("r1").task("scan"), store.run("r2").task("scan")
    assert not link_outputs(source, dest)
    finished_outputs(source)
    source.merge_marker.unlink()
    assert not link_outputs(source, dest)
    assert not dest.out.exists()


def compute(task: TaskLayout, count: int, units: list[int]) -> None:
    """Units computed as a worker does: claimed, result written and renamed, marked done."""
    create_ledger(task, count)
    ledger = Ledger.of(task)
    for index in units:
        assert ledger.claim(index, "w0")
        ledger.write_result(index, "w0", lambda d, i=index: (d / "value.json").write_text(str(i * i)))
        assert ledger.mark_done(index, "w0")


def test_a_seeded_ledger_leaves_only_the_missing_units_pending(tmp_path):
    store = StoreLayout(tmp_path)
    source, dest = store.run("r1").task("scan"), store.run("r2").task("scan")
    compute(source, 10, [0, 3, 4, 9])
    assert seed_ledger(source, dest, 10) == 4
    ledger = Ledger.of(dest)
    assert ledger.count == 10 and ledger.done_count() == 4
    assert ledger.pending_indices() == [1, 2, 5, 6, 7, 8]
    assert not ledger.has_claims() and ledger.missing() == []
    # The seeded units are in the progress log, so the new run's units done count them (no seconds: not computed).
    assert ProgressReader(dest.progress).units_done() == 4
    assert all(line.seconds is None and line.worker == "seed" for line in read_progress(dest.progress))
    assert (ledger.layout.result(3) / "value.json").read_text() == "9"
    # A copy, not a link: a pod of the new run may write its task's folder, and must not change the earlier run's.
    seeded_file, earlier_file = (
        ledger.layout.result(3) / "value.json",
        Ledger.of(source).layout.result(3) / "value.json",
    )
    assert os.stat(seeded_file).st_ino != os.stat(earlier_file).st_ino
    seeded_file.chmod(0o644)
    seeded_file.write_text("tampered")
    assert earlier_file.read_text() == "9"
    claimer = ledger.claimer("w0")
    claimed = []
    while (unit := claimer.claim()) is not None:
        claimed.extend(unit.indices())
    assert sorted(claimed) == [1, 2, 5, 6, 7, 8]  # a worker computes only what is missing
    assert seed_ledger(source, dest, 10) == 0  # a ledger is there already


def test_a_ledger_of_ranges_is_seeded_with_the_earlier_values(tmp_path):
    """1,000 units start in ranges of 15: seeded runs cut the ranges; the values come over in a log of the new
    ledger, as the merge reads them."""
    store = StoreLayout(tmp_path)
    source, dest = store.run("r1").task("scan"), store.run("r2").task("scan")
    done = [*range(3, 40), *range(500, 517), 999]
    create_ledger(source, 1000, block=1)  # the earlier run's units, one entry each, some done
    ledger = Ledger.of(source)
    log = ledger.layout.values_log("w0", "1-a")
    for index in done:
        assert ledger.claim(index, "w0")
        ledger.append_values(log, UnitRange.one(index), [index * 10])
        assert ledger.mark_done(index, "w0")
    assert seed_ledger(source, dest, 1000) == len(done)
    seeded = Ledger.of(dest)
    assert seeded.done_count() == len(done) == ProgressReader(dest.progress).units_done()
    assert sorted(seeded.pending_indices()) == sorted(set(range(1000)) - set(done))
    values, covered = seeded.values()
    assert all(index in covered and values[index] == index * 10 for index in done)
    assert not seeded.has_claims()


def test_a_source_without_done_units_seeds_nothing(tmp_path):
    store = StoreLayout(tmp_path)
    source, dest = store.run("r1").task("scan"), store.run("r2").task("scan")
    assert seed_ledger(source, dest, 10) == 0
    compute(source, 10, [])
    assert seed_ledger(source, dest, 10) == 0
    assert not Ledger.of(dest).exists()


def save_run(
    store: StoreLayout,
    run_id: str,
    who: Identity,
    task_state: TaskState,
    key: str = "k-scan",
    outputs: bool = True,
    units: list[int] | None = None,
) -> RunRecord:
    record = RunRecord(
        run_id=run_id,
        identity=record_identity(who),
        state=RunState.SUCCEEDED if task_state is TaskState.SUCCEEDED else RunState.FAILED,
        tasks={"scan": TaskRecord(task_id="scan", type="m:Scan", split=True, units=10, state=task_state, key=key)},
    )
    run = store.run(run_id)
    run.root.mkdir(parents=True)
    record.save(run)
    if outputs:
        finished_outputs(run.task("scan"))
    if units is not None:
        compute(run.task("scan"), 10, units)
    return record


def all_records(store: StoreLayout) -> list[RunRecord]:
    return [RunRecord.load(store.run(p.name)) for p in sorted(store.runs.iterdir())]


def test_the_index_finds_the_newest_complete_result_the_caller_may_reuse(tmp_path):
    store = StoreLayout(tmp_path)
    save_run(store, "r1-bob", BOB, TaskState.SUCCEEDED)
    save_run(store, "r2-carol", CAROL_AGENT, TaskState.SUCCEEDED)
    save_run(store, "r3-bob-unmerged", BOB, TaskState.SUCCEEDED, outputs=False)
    index = KeyIndex(store, tmp_path / "keys.sqlite")
    assert index.rebuild(all_records(store)) == 3
    assert index.find("k-scan", BOB) == ReuseSource("r1-bob", "scan")
    assert index.find("k-scan", BOB_AGENT) is None  # it may not read Bob's runs
    sharing = ReadPolicy(agents_see_their_person=True)
    assert index.find("k-scan", BOB_AGENT, read_policy=sharing) == ReuseSource("r1-bob", "scan")
    # A person who may read every run reuses the newest, whoever's it is.
    assert index.find("k-scan", BOB, read_policy=ReadPolicy(people_see_all=True)) == ReuseSource("r2-carol", "scan")
    assert index.find("k-scan", CAROL_AGENT) == ReuseSource("r2-carol", "scan")
    assert index.find("k-scan", BOB, ReusePolicy.NEVER) is None
    assert index.find("k-scan", BOB, ReusePolicy.SAME_RUN) is None  # nothing resumed
    assert index.find("k-scan", BOB, ReusePolicy.SAME_RUN, resume_from="r3-bob-unmerged") is None
    assert index.find("k-scan", BOB, exclude_run="r1-bob") is None
    assert index.find("k-other", ALICE) is None
    assert index.find("k-scan", ALICE, resume_from="r2-carol") == ReuseSource("r2-carol", "scan")
    index.close()


def test_the_index_is_rebuilt_from_the_records_and_stale_rows_are_misses(tmp_path):
    store = StoreLayout(tmp_path)
    save_run(store, "r1", BOB, TaskState.SUCCEEDED)
    index = KeyIndex(store, tmp_path / "keys.sqlite")
    index.rebuild(all_records(store))
    # The record changed behind the index (another key now): the record wins.
    record = RunRecord.load(store.run("r1"))
    record.tasks["scan"].key = "k-new"
    record.save(store.run("r1"))
    assert index.find("k-scan", BOB) is None
    index.update(record)
    assert index.find("k-new", BOB) == ReuseSource("r1", "scan")
    # A deleted run is a miss, never an error.
    for path in sorted(store.run("r1").root.rglob("*"), reverse=True):
        path.unlink() if path.is_file() else path.rmdir()
    assert index.find("k-new", BOB) is None


def test_a_failed_split_task_gives_its_done_units(tmp_path):
    store = StoreLayout(tmp_path)
    save_run(store, "r1", BOB, TaskState.FAILED, outputs=False, units=[1, 2, 7])
    save_run(store, "r2", BOB, TaskState.CANCELLED, outputs=False, units=[])
    index = KeyIndex(store, tmp_path / "keys.sqlite")
    index.rebuild(all_records(store))
    assert index.find("k-scan", BOB) == ReuseSource("r1", "scan", [1, 2, 7])
    assert index.find("k-scan", CAROL_AGENT) is None


def test_keys_do_not_depend_on_mapping_order():
    a = KeyInputs("t", {"x": 1, "y": {"b": 2, "a": 1}}, {}, False)
    b = KeyInputs("t", {"y": {"a": 1, "b": 2}, "x": 1}, {}, False)
    assert task_keys(["t"], {"t": a}, ["s"], None) == task_keys(["t"], {"t": b}, ["s"], None)


def test_the_workflow_file_is_left_out_of_a_snapshots_key():
    import hashlib

    def sha(text: str) -> str:
        return hashlib.sha256(text.encode()).hexdigest()

    listing = {"files": {"model.py": sha("code"), "wf.yaml": sha("tasks: a")}, "executable": [], "symlinks": {}}
    edited = {**listing, "files": {**listing["files"], "wf.yaml": sha("tasks: b")}}
    assert snapshot_key(listing, "tasks: a") == snapshot_key(edited, "tasks: b")
    assert snapshot_key(listing, "tasks: a") != snapshot_key(listing, None)
    code_edited = {**listing, "files": {**listing["files"], "model.py": sha("code 2")}}
    assert snapshot_key(code_edited, "tasks: a") != snapshot_key(listing, "tasks: a")
    made_executable = {**listing, "executable": ["model.py"]}
    assert snapshot_key(made_executable, "tasks: a") != snapshot_key(listing, "tasks: a")


def test_every_workflow_file_of_a_snapshot_is_left_out_of_its_key(tmp_path):
    """A second study's workflow beside the first changes no key; a YAML file that is not a workflow (a CI file,
    one with `tasks:` that simrun would refuse, one too large to be a workflow) counts, as a symlink does."""
    import hashlib

    from simrun_core.reuse import WORKFLOW_BYTES, workflow_files

    files = {
        "model.py": "code",
        "study.yaml": "tasks:\n  scan: {type: m:Scan, settings: {seeds: [1, 2]}}\n",
        "more/study-3.yml": "tasks:\n  scan: {type: m:Scan, settings: {seeds: [1, 2, 3]}}\n",
        "wf.json": '{"tasks": {"a": {"type": "m:A"}}}',
        ".github/ci.yaml": "jobs:\n  test: {runs-on: ubuntu-latest}\n",
        "bad.yaml": "tasks:\n  Not-A-Task-Id: {type: m:A}\n",
        "big.yaml": "tasks:\n  a: {type: m:A}\n#" + "x" * WORKFLOW_BYTES,
        "study.txt": "tasks:\n  a: {type: m:A}\n",
        "binary.yaml": "tasks:\n  a: {type: m:A}\n#\udcff",
    }
    for path, text in files.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_bytes(text.encode(errors="surrogateescape"))
    (tmp_path / "link.yaml").symlink_to("study.yaml")

    def sha(text: str) -> str:
        return hashlib.sha256(text.encode(errors="surrogateescape")).hexdigest()

    listing = {
        "files": {**{path: sha(text) for path, text in files.items()}, "link.yaml": sha("study.yaml")},
        "executable": [],
        "symlinks": {"link.yaml": "study.yaml"},
    }
    found = workflow_files(listing, tmp_path)
    assert found == {"study.yaml", "more/study-3.yml", "wf.json"}
    key = SnapshotContent.of(listing, found).key(files["study.yaml"])
    assert key == snapshot_key(listing, files["study.yaml"], found)
    fewer = {**listing, "files": {k: v for k, v in listing["files"].items() if k not in {"more/study-3.yml"}}}
    assert key == snapshot_key(fewer, None, workflow_files(fewer, tmp_path)), "a second study changes no key"
    edited = {**listing, "files": {**listing["files"], ".github/ci.yaml": sha("jobs: {}")}}
    assert snapshot_key(edited, None, found) != snapshot_key(listing, None, found), "a file that is no workflow counts"
    assert workflow_files({**listing, "files": {"gone.yaml": sha("x")}}, tmp_path) == frozenset()


def test_the_servers_own_python_is_keyed_by_what_is_installed_in_it(monkeypatch):
    """The environment `default` (a model run in the server's Python) has one id whatever is installed: its keys
    take the installed distributions instead, so upgrading a package there reuses nothing computed before."""
    import importlib.metadata

    from simrun_core import reuse

    tasks = workflow()
    reuse.server_environment_digest.cache_clear()
    before = keys(tasks, env="default")
    assert before == keys(tasks, env="default")
    real = list(importlib.metadata.distributions())
    upgraded = [d for d in real if (d.metadata["Name"] or "").lower() != "pydantic"]
    assert len(upgraded) == len(real) - 1
    monkeypatch.setattr(importlib.metadata, "distributions", lambda: upgraded)
    reuse.server_environment_digest.cache_clear()
    try:
        after = keys(tasks, env="default")
    finally:
        monkeypatch.undo()
        reuse.server_environment_digest.cache_clear()
    assert after["scan"] != before["scan"] and after["fit"] != before["fit"]
    assert keys(tasks, env="env-1") == keys(tasks, env="env-1") != before  # a built environment's id is its content


def keyed_record(run_id: str, who: Identity, ended_at: datetime, state: TaskState = TaskState.SUCCEEDED) -> RunRecord:
    task = TaskRecord(task_id="scan", type="m:Scan", split=True, units=10, state=state, key="k", ended_at=ended_at)
    return RunRecord(run_id=run_id, identity=record_identity(who), state=RunState.SUCCEEDED, tasks={"scan": task})


def test_a_key_of_a_long_history_is_found_reading_only_its_newest_rows(tmp_path):
    """The index is read a page at a time, newest first: a key that 500 runs had costs one query and one record
    when the newest holds; older pages are read only while the newer rows are misses, and rows of one time (ties)
    are each read once, none skipped."""
    store = StoreLayout(tmp_path)
    index = KeyIndex(store, tmp_path / "keys.sqlite")
    start = datetime(2026, 1, 1, tzinfo=UTC)
    records = {f"r{n:03d}": keyed_record(f"r{n:03d}", BOB, start + timedelta(seconds=n)) for n in range(500)}
    # 100 more ended at one instant, older than all of those: only the last of them in the index's order holds.
    records |= {f"t{n:03d}": keyed_record(f"t{n:03d}", BOB, start - timedelta(days=1)) for n in range(100)}
    index.rebuild(records.values())
    loads: list[str] = []
    selects: list[str] = []
    reader = index._connect()  # the one reader these finds, one at a time, take from the pool
    reader.set_trace_callback(lambda statement: selects.append(statement) if statement.startswith("SELECT") else None)
    index._readers.put(reader)

    def load(run_id: str) -> RunRecord:
        loads.append(run_id)
        return records[run_id]

    def holds(*run_ids: str) -> None:
        for path in store.runs.iterdir() if store.runs.exists() else []:
            for item in sorted(path.rglob("*"), reverse=True):
                item.unlink() if item.is_file() else item.rmdir()
            path.rmdir()
        for run_id in run_ids:
            finished_outputs(store.run(run_id).task("scan"))

    holds("r499", "r100")
    assert index.find("k", BOB, load=load) == ReuseSource("r499", "scan")
    assert (loads, len(selects)) == (["r499"], 1)
    # The newest 60 lost their outputs: their pages are read and each is a miss, then the next that holds wins.
    holds("r439", "r100")
    loads.clear()
    selects.clear()
    assert index.find("k", BOB, load=load) == ReuseSource("r439", "scan")
    assert loads == [f"r{n:03d}" for n in range(499, 438, -1)]
    assert len(selects) == 4  # pages of 16: 61 rows
    # Among rows of one time, order is by run (newest name first), each read once until the last one holds.
    holds("t000")
    loads.clear()
    assert index.find("k", BOB, load=load) == ReuseSource("t000", "scan")
    assert loads == [f"r{n:03d}" for n in range(499, -1, -1)] + [f"t{n:03d}" for n in range(99, -1, -1)]
    # Resumed, its run comes first whatever its age; excluded, a run is never read.
    holds("t050", "r499")
    loads.clear()
    assert index.find("k", BOB, resume_from="t050", load=load) == ReuseSource("t050", "scan")
    assert loads == ["t050"]
    loads.clear()
    assert index.find("k", BOB, exclude_run="r499", load=load) == ReuseSource("t050", "scan")
    assert "r499" not in loads
    index.close()


def test_a_succeeded_result_anywhere_beats_a_newer_failed_task_s_units(tmp_path):
    store = StoreLayout(tmp_path)
    save_run(store, "r1-done", BOB, TaskState.SUCCEEDED)
    save_run(store, "r2-failed", BOB, TaskState.FAILED, outputs=False, units=[1, 2])
    index = KeyIndex(store, tmp_path / "keys.sqlite")
    index.rebuild(all_records(store))
    assert index.find("k-scan", BOB) == ReuseSource("r1-done", "scan")
    assert index.find("k-scan", BOB, resume_from="r2-failed") == ReuseSource("r1-done", "scan")
    assert index.find("k-scan", BOB, ReusePolicy.SAME_RUN, resume_from="r2-failed") == ReuseSource(
        "r2-failed", "scan", [1, 2]
    )
    index.close()


def holding_the_file(path):
    """Another connection holding the index file's write lock: the index's writer cannot commit meanwhile, and
    readers still read."""
    import sqlite3

    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    return other


def test_an_update_waits_on_no_sqlite_call_and_a_find_sees_it_at_once(tmp_path):
    """`update` queues a run's rows and the writer thread writes them: while it cannot write (the file locked),
    an update returns at once and a find sees the rows, queued and in the transaction under way; the file has them
    once the writer could write."""
    import time

    store = StoreLayout(tmp_path)
    save_run(store, "r1", BOB, TaskState.SUCCEEDED)
    save_run(store, "r2", BOB, TaskState.SUCCEEDED, key="k-other")
    index = KeyIndex(store, tmp_path / "keys.sqlite")
    other = holding_the_file(tmp_path / "keys.sqlite")
    began = time.monotonic()
    index.update(RunRecord.load(store.run("r1")))
    assert time.monotonic() - began < 0.5
    deadline = time.monotonic() + 10
    while not index._writing:  # the writer took r1's row into its transaction, which waits for the file
        assert time.monotonic() < deadline, "the writer did not start writing"
        time.sleep(0.01)
    index.update(RunRecord.load(store.run("r2")))  # queued behind the transaction under way
    assert index.find("k-scan", BOB) == ReuseSource("r1", "scan")
    assert index.find("k-other", BOB) == ReuseSource("r2", "scan")
    assert index._db.execute("SELECT count(*) FROM task_keys").fetchone() == (0,)
    other.execute("COMMIT")
    index.close()
    rows = other.execute("SELECT run_id, key FROM task_keys ORDER BY run_id").fetchall()
    assert rows == [("r1", "k-scan"), ("r2", "k-other")]


def test_rows_in_memory_and_in_the_file_are_read_newest_first_each_once(tmp_path):
    """A find merges the rows not yet written with the file's, in one order (newest first), and a queued row
    stands for its task's older row in the file: each task is read once, where its newest row puts it."""
    store = StoreLayout(tmp_path)
    start = datetime(2026, 1, 1, tzinfo=UTC)
    records = {f"r{n}": keyed_record(f"r{n}", BOB, start + timedelta(seconds=n)) for n in range(1, 6)}
    index = KeyIndex(store, tmp_path / "keys.sqlite")
    index.rebuild(records.values())
    other = holding_the_file(tmp_path / "keys.sqlite")
    records["r3"] = keyed_record("r3", BOB, start + timedelta(seconds=10))  # ended again, later: now the newest
    records["r6"] = keyed_record("r6", BOB, start - timedelta(seconds=1))  # the oldest
    records["r7"] = keyed_record("r7", CAROL_AGENT, start + timedelta(seconds=20))  # not Bob's to reuse
    for run_id in ("r3", "r6", "r7"):
        index.update(records[run_id])
    finished_outputs(store.run("r6").task("scan"))
    loads: list[str] = []

    def load(run_id: str) -> RunRecord:
        loads.append(run_id)
        return records[run_id]

    assert index.find("k", BOB, load=load) == ReuseSource("r6", "scan")
    assert loads == ["r3", "r5", "r4", "r2", "r1", "r6"]
    loads.clear()
    assert index.find("k", BOB, resume_from="r2", load=load) == ReuseSource("r6", "scan")
    assert loads == ["r2", "r3", "r5", "r4", "r1", "r6"]
    loads.clear()
    assert index.find("k", BOB, exclude_run="r3", load=load) == ReuseSource("r6", "scan")
    assert loads == ["r5", "r4", "r2", "r1", "r6"]
    other.execute("COMMIT")
    index.flush()
    loads.clear()
    assert index.find("k", BOB, load=load) == ReuseSource("r6", "scan")
    assert loads == ["r3", "r5", "r4", "r2", "r1", "r6"]  # the same, all from the file now
    index.close()


def test_a_run_s_rows_are_added_and_changed_as_its_tasks_end(tmp_path):
    """A later update adds the rows of tasks ended since and changes the rows that changed, and keeps the
    others; what the writer could not write is written later, none lost."""
    index = KeyIndex(StoreLayout(tmp_path), tmp_path / "keys.sqlite")
    record = keyed_record("r1", BOB, datetime(2026, 1, 1, tzinfo=UTC))
    record.tasks["fit"] = TaskRecord(task_id="fit", type="m:Fit", key="k-fit")  # pending: no row yet
    index.update(record)
    index.flush()
    rows = "SELECT task_id, key, state FROM task_keys WHERE run_id = 'r1' ORDER BY task_id"
    assert index._db.execute(rows).fetchall() == [("scan", "k", "succeeded")]
    record.tasks["fit"].state = TaskState.SUCCEEDED
    record.tasks["fit"].ended_at = datetime(2026, 1, 2, tzinfo=UTC)
    record.tasks["scan"].key = "k2"
    other = holding_the_file(tmp_path / "keys.sqlite")
    other.execute("PRAGMA busy_timeout = 0")
    index._db.execute("PRAGMA busy_timeout = 0")  # a write that finds the file locked fails at once
    index.update(record)
    import sqlite3

    with pytest.raises(sqlite3.OperationalError):
        index.flush()
    other.execute("COMMIT")
    index.flush()  # queued again (by this flush or the writer's), and written now
    assert index._db.execute(rows).fetchall() == [("fit", "k-fit", "succeeded"), ("scan", "k2", "succeeded")]
    index.close()


def digests(*values: object) -> list[str]:
    return [hashlib.sha256(json.dumps(v).encode()).hexdigest() for v in values]


def study(seeds: list[int], snapshots: tuple[str, ...] = ("snap-1",)) -> dict[str, list[str]]:
    """Unit keys of a training task (a unit per seed) and an evaluation task reading it (a unit per policy and
    seed; the learned policy's units read their seed's training unit)."""
    tasks = {
        "train": KeyInputs("m:Train", {"seeds": seeds}, {}, True),
        "evaluate": KeyInputs("m:Evaluate", {"seeds": seeds}, {"policies": "train.policies"}, True),
    }
    order = ["train", "evaluate"]
    keys = task_keys(order, tasks, snapshots, "env-1")
    pairs = [(policy, seed) for policy in ("fixed", "learned") for seed in seeds]
    reads = [{"policies": [seeds.index(seed)]} if policy == "learned" else {} for policy, seed in pairs]
    units = {
        "train": UnitDescription(digests(*seeds)),
        "evaluate": UnitDescription(digests(*pairs), reads),
    }
    found = unit_keys(order, tasks, units, snapshots, "env-1", keys)
    assert (
        keys["train"]
        != task_keys(order, {**tasks, "train": KeyInputs("m:Train", {"seeds": [9]}, {}, True)}, snapshots, "env-1")[
            "train"
        ]
    )
    return {task_id: found[task_id].keys for task_id in order}


def test_unit_keys_stay_when_settings_add_units_and_change_with_the_code():
    two, three = study([1, 2]), study([1, 2, 3])
    assert three["train"][:2] == two["train"]
    # fixed 1, fixed 2 | learned 1, learned 2 keep their keys although the training task's key changed.
    assert set(two["evaluate"]) <= set(three["evaluate"])
    assert len(set(three["evaluate"])) == 6
    other_code = study([1, 2, 3], snapshots=("snap-2",))
    assert not set(other_code["evaluate"]) & set(three["evaluate"])
    assert not set(other_code["train"]) & set(three["train"])


def test_a_unit_reading_an_upstream_unit_that_does_not_exist_is_refused():
    tasks = {
        "train": KeyInputs("m:Train", {}, {}, True),
        "evaluate": KeyInputs("m:Evaluate", {}, {"policies": "train.policies"}, True),
    }
    keys = task_keys(["train", "evaluate"], tasks, ("s",), "e")
    units = {"train": UnitDescription(digests(1)), "evaluate": UnitDescription(digests(1), [{"policies": [3]}])}
    with pytest.raises(InvalidArgument, match="reads unit 3 of task train, which has 1 units"):
        unit_keys(["train", "evaluate"], tasks, units, ("s",), "e", keys)


def test_units_are_seeded_where_their_unit_keys_now_are(tmp_path):
    store = StoreLayout(tmp_path)
    source, dest = store.run("r1").task("scan"), store.run("r2").task("scan")
    compute(source, 4, [0, 1, 3])
    # New units 0..5; new 1 is old 0, new 3 is old 1, new 5 is old 2 (not done), new 4 is old 3.
    assert seed_ledger(source, dest, 6, {1: 0, 3: 1, 5: 2, 4: 3}) == 3
    ledger = Ledger.of(dest)
    assert sorted(ledger.pending_indices()) == [0, 2, 5]
    assert (ledger.layout.result(1) / "value.json").read_text() == "0"
    assert (ledger.layout.result(3) / "value.json").read_text() == "1"
    assert (ledger.layout.result(4) / "value.json").read_text() == "9"


def test_the_index_finds_units_by_scope_only_with_their_unit_keys(tmp_path):
    store = StoreLayout(tmp_path)
    record = save_run(store, "r1", BOB, TaskState.SUCCEEDED, units=[0, 1, 2])
    record.tasks["scan"].unit_scope = "scope-a"
    record.save(store.run("r1"))
    index = KeyIndex(store, tmp_path / "keys.sqlite")
    index.rebuild(all_records(store))
    assert index.find_units("scope-a", BOB) is None  # no unit keys file: its units cannot be placed
    store.run("r1").unit_keys("scan").parent.mkdir()
    store.run("r1").unit_keys("scan").write_text("a\nb\nc\n")
    assert index.find_units("scope-a", BOB) == ReuseSource("r1", "scan", [0, 1, 2], by_unit_keys=True)
    assert index.find_units("scope-b", BOB) is None
    assert index.find_units("scope-a", CAROL_AGENT) is None
    assert index.find_units("scope-a", BOB, ReusePolicy.NEVER) is None
    index.close()
