"""The tracker's task keys at submission: recorded per task, and a type that is not cacheable keys nothing below it."""

from __future__ import annotations

import json

from simrun_runtime.layout import StoreLayout
from simrun_runtime.loading import TypeDescription
from simrun_runtime.record import Identity, RunRecord, SnapshotRef, TaskRecord
from simrun_runtime.tasktype import ResourceHint
from simrun_tracker.reuse import keys_of
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
    store = StoreLayout(tmp_path)
    tasks = [planned("clock", "m:Clock", cacheable=False), planned("fit", "m:Fit"), planned("other", "m:Other")]
    first, second = keys_of(store, run, tasks), keys_of(store, run, tasks)
    assert first["clock"] is None and second["clock"] is None
    assert first["fit"] != second["fit"]  # downstream of a type that is not cacheable: a new key each time
    assert first["other"] == second["other"] and first["other"] is not None


def test_keys_follow_the_settings_with_defaults_filled(tmp_path):
    run = record(tmp_path)
    store = StoreLayout(tmp_path)
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
