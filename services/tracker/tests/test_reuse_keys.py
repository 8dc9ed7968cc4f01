"""The tracker's task keys at submission: recorded per task, and a type that is not cacheable keys nothing below it."""

from __future__ import annotations

import hashlib
import json

from hypothesis import given, settings
from hypothesis import strategies as st
from simrun_core.reuse import SnapshotContent, snapshot_key
from simrun_runtime.layout import StoreLayout
from simrun_runtime.loading import TypeDescription
from simrun_runtime.record import Identity, RunRecord, SnapshotRef, TaskRecord
from simrun_runtime.tasktype import ResourceHint
from simrun_tracker.reuse import SnapshotKeys, keys_of
from simrun_tracker.submission import PlannedTask


def planned(task_id: str, type_name: str, cacheable: bool = True, settings: dict | None = None) -> PlannedTask:
    description = TypeDescription(
        type=type_name,
        split=False,
        inputs=[],
        outputs=["out"],
        resources=ResourceHint(),
        cost_setting=None,
        cacheable=cacheable,
        settings_schema={},
        settings=settings or {},
    )
    return PlannedTask(task_id, description, None, None, None)  # type: ignore[arg-type]


def record(tmp_path) -> RunRecord:
    store = StoreLayout(tmp_path)
    listing = store.snapshot_files("m", "s1")
    listing.parent.mkdir(parents=True)
    listing.write_text(json.dumps({"files": {"a.py": "0" * 64}, "executable": [], "symlinks": {}}))
    return RunRecord(
        run_id="r",
        identity=Identity(name="bob", kind="person", priority="standard"),
        tasks={
            "clock": TaskRecord(task_id="clock", type="m:Clock"),
            "fit": TaskRecord(task_id="fit", type="m:Fit", inputs={"t": "clock.out"}),
            "other": TaskRecord(task_id="other", type="m:Other"),
        },
        snapshots=[SnapshotRef(name="m", snapshot_id="s1", path="snapshots/m/s1")],
        environment="env-1",
    )


def test_a_type_that_is_not_cacheable_keys_nothing_that_reads_it(tmp_path):
    run = record(tmp_path)
    store = SnapshotKeys(StoreLayout(tmp_path))
    tasks = [planned("clock", "m:Clock", cacheable=False), planned("fit", "m:Fit"), planned("other", "m:Other")]
    first, second = keys_of(store, run, tasks), keys_of(store, run, tasks)
    assert first["clock"] is None and second["clock"] is None
    assert first["fit"] != second["fit"]  # downstream of a type that is not cacheable: a new key each time
    assert first["other"] == second["other"] and first["other"] is not None


def test_keys_follow_the_settings_with_defaults_filled(tmp_path):
    run = record(tmp_path)
    store = SnapshotKeys(StoreLayout(tmp_path))
    base = [planned("clock", "m:Clock"), planned("fit", "m:Fit", settings={"order": 2}), planned("other", "m:Other")]
    changed = [base[0], planned("fit", "m:Fit", settings={"order": 3}), base[2]]
    a, b = keys_of(store, run, base), keys_of(store, run, changed)
    assert a["clock"] == b["clock"] and a["other"] == b["other"]
    assert a["fit"] != b["fit"]


def test_a_reuse_request_that_contradicts_itself_or_hides_a_run_is_refused(tmp_path):
    """Requests are checked before anything is written: a task to rerun must exist, same-run needs a run and never
    refuses one; a run to resume must be readable (else not found, as reads say) and ended."""
    import pytest
    from simrun_core.config import ReadPolicy
    from simrun_core.errors import FailedPrecondition, InvalidArgument, NotFound
    from simrun_core.identity import Identity as Caller
    from simrun_core.identity import IdentityKind, Priority
    from simrun_core.reuse import ReusePolicy
    from simrun_runtime.record import RunState
    from simrun_tracker.reuse import ReuseRequest, check_request

    bob = Caller("bob", IdentityKind.PERSON, Priority.STANDARD)
    bobs_agent = Caller("bob-agent", IdentityKind.AGENT, Priority.AGENT, on_behalf_of="bob")
    ended = record(tmp_path).model_copy(update={"state": RunState.SUCCEEDED})
    running = record(tmp_path / "b").model_copy(update={"state": RunState.RUNNING})
    runs = {"ended": ended, "running": running}

    def load(run_id: str) -> RunRecord:
        if run_id not in runs:
            raise NotFound(f"no run {run_id!r}")
        return runs[run_id]

    tasks = ["clock", "fit"]
    check_request(ReuseRequest(ReusePolicy.SAME_RUN, "ended"), tasks, bob, load)
    with pytest.raises(InvalidArgument, match="no such task"):
        check_request(ReuseRequest(rerun=("fitt",)), tasks, bob, load)
    with pytest.raises(InvalidArgument, match="needs the run to resume"):
        check_request(ReuseRequest(ReusePolicy.SAME_RUN), tasks, bob, load)
    with pytest.raises(InvalidArgument, match="reuse never takes nothing"):
        check_request(ReuseRequest(ReusePolicy.NEVER, "ended"), tasks, bob, load)
    with pytest.raises(NotFound, match="no run 'ended'") as hidden:
        check_request(ReuseRequest(resume_from="ended"), tasks, bobs_agent, load)
    assert "bob" not in str(hidden.value)
    check_request(ReuseRequest(resume_from="ended"), tasks, bobs_agent, load, ReadPolicy(agents_see_their_person=True))
    with pytest.raises(FailedPrecondition, match="resume it once it has ended"):
        check_request(ReuseRequest(resume_from="running"), tasks, bob, load)


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


texts = st.sampled_from(["tasks: a", "tasks: b", "code", "data", "link"])


@settings(max_examples=200, deadline=None)
@given(
    files=st.dictionaries(st.sampled_from(["a.py", "wf.yaml", "d/x", "l"]), texts, max_size=4),
    linked=st.booleans(),
    workflow=st.one_of(st.none(), texts),
)
def test_a_kept_snapshots_key_is_the_key_its_listing_gives(tmp_path_factory, files, linked, workflow):
    """The key from a snapshot's kept content equals `snapshot_key` of its listing, whatever the workflow text:
    one no file holds, one a regular file holds (left out), one only a symlink's digest matches (kept in)."""
    store = StoreLayout(tmp_path_factory.mktemp("store"))
    listing = {
        "files": {path: sha(text) for path, text in files.items()},
        "executable": ["a.py"] if "a.py" in files else [],
        "symlinks": {"l": "target"} if linked and "l" in files else {},
    }
    path = store.snapshot_files("m", "s1")
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(listing))
    run = record_with_workflow(workflow)
    keys = SnapshotKeys(store)
    first = keys.of(run)  # read from the listing
    path.unlink()  # the second comes from what was kept, or from the listing when it must be read
    expected = snapshot_key(listing, workflow)
    assert first == [expected]
    second = keys.of(run)
    assert second == [expected] or (second == ["s1"] and SnapshotContent.of(listing).key(workflow) is None), (
        "only a text a regular file holds needs the listing again"
    )


def record_with_workflow(text: str | None) -> RunRecord:
    return RunRecord(
        run_id="r",
        identity=Identity(name="bob", kind="person", priority="standard"),
        workflow={"text": text} if text is not None else {},
        snapshots=[SnapshotRef(name="m", snapshot_id="s1", path="snapshots/m/s1")],
    )


def test_an_unreadable_listing_counts_by_the_snapshot_id_and_is_read_once_readable(tmp_path):
    store = StoreLayout(tmp_path)
    path = store.snapshot_files("m", "s1")
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    keys = SnapshotKeys(store)
    run = record_with_workflow("tasks: a")
    assert keys.of(run) == ["s1"]
    listing = {"files": {"a.py": sha("code")}, "executable": [], "symlinks": {}}
    path.write_text(json.dumps(listing))
    assert keys.of(run) == [snapshot_key(listing, "tasks: a")]


def test_kept_snapshots_are_bounded(tmp_path):
    """Past `kept` snapshots, the least recently used is forgotten: its key is read from its listing again."""
    store = StoreLayout(tmp_path)
    keys = SnapshotKeys(store, kept=2)
    runs = {}
    for snapshot_id in ("s1", "s2", "s3"):
        path = store.snapshot_files("m", snapshot_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"files": {"a.py": sha(snapshot_id)}}))
        runs[snapshot_id] = record_with_workflow(None)
        runs[snapshot_id].snapshots = [
            SnapshotRef(name="m", snapshot_id=snapshot_id, path=f"snapshots/m/{snapshot_id}")
        ]
        keys.of(runs[snapshot_id])
    for snapshot_id in runs:
        store.snapshot_files("m", snapshot_id).unlink()
    assert keys.of(runs["s1"]) == ["s1"]  # forgotten, and its listing is gone
    assert keys.of(runs["s3"]) == [snapshot_key({"files": {"a.py": sha("s3")}}, None)]


def test_kept_snapshots_are_bounded_by_their_files_too(tmp_path):
    """The content kept is bounded by the files of the snapshots kept: past it the oldest goes, and a snapshot
    larger than the bound alone is never kept (its listing is read at every submission)."""
    store = StoreLayout(tmp_path)
    keys = SnapshotKeys(store, kept=10, files_kept=3)
    listings = {
        "small-1": {"files": {"a.py": sha("1"), "b.py": sha("2")}},
        "small-2": {"files": {"a.py": sha("3"), "b.py": sha("4")}},
        "large": {"files": {f"f{i}.py": sha(str(i)) for i in range(5)}},
    }
    runs = {}
    for snapshot_id, listing in listings.items():
        path = store.snapshot_files("m", snapshot_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(listing))
        runs[snapshot_id] = record_with_workflow(None)
        runs[snapshot_id].snapshots = [
            SnapshotRef(name="m", snapshot_id=snapshot_id, path=f"snapshots/m/{snapshot_id}")
        ]
        assert keys.of(runs[snapshot_id]) == [snapshot_key(listing, None)]
    for snapshot_id in listings:
        store.snapshot_files("m", snapshot_id).unlink()
    assert keys.of(runs["small-1"]) == ["small-1"]  # gone: 2 + 2 files are more than 3
    assert keys.of(runs["small-2"]) == [snapshot_key(listings["small-2"], None)]
    assert keys.of(runs["large"]) == ["large"]  # never kept
