"""End to end: submissions take turns for the server's own work, and a slow model holds up no other one."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from e2e_support import E2E_MODEL, git_repo, write_workflow
from simrun_core.key_index import KeyIndex
from simrun_runtime import record as record_module
from simrun_tracker import runstore
from simrun_tracker import tracker as tracker_module

SLOW_IMPORT_S = 8


def test_a_model_slow_to_describe_holds_up_no_other_submission(start_server, client_for, e2e_model, tmp_path: Path):
    """A submission steps out of its turn while the model's describer imports the model: another model's
    submission is answered meanwhile, and the slow one is answered once its import ends."""
    slow_model = git_repo(
        E2E_MODEL,
        tmp_path / "slow-model",
        {"slowimport.py": f"import time\n\ntime.sleep({SLOW_IMPORT_S})\nfrom e2etasks.tasks import Slow  # noqa\n"},
    )
    server = start_server()
    slow_client, quick_client = client_for(server), client_for(server)
    # Each model's describer warmed up first, so the figure below is the wait behind the slow one, if any.
    quick_client.submit(write_workflow(e2e_model, "tasks: {a: {type: 'e2etasks.tasks:Slow', settings: {units: 1}}}"))
    answered: list[str] = []
    failed: list[BaseException] = []

    def submit_slow() -> None:
        try:
            workflow = write_workflow(slow_model, "tasks: {a: {type: 'slowimport:Slow', settings: {units: 1}}}")
            answered.append(slow_client.submit(workflow).run_id)
        except BaseException as exc:
            failed.append(exc)

    slow = threading.Thread(target=submit_slow)
    began = time.monotonic()
    slow.start()
    time.sleep(1.0)  # the slow submission is in its describer's import by now
    quick = quick_client.submit(write_workflow(e2e_model, "tasks: {b: {type: 'e2etasks.tasks:Slow'}}", "b.yaml"))
    quick_s = time.monotonic() - began
    assert quick.run_id
    assert slow.is_alive(), "the slow model's submission was answered before its import could have ended"
    assert quick_s < SLOW_IMPORT_S - 2, f"another model's submission waited {quick_s:.1f} s behind a slow import"
    slow.join(timeout=60)
    assert not failed, failed
    assert len(answered) == 1 and time.monotonic() - began >= SLOW_IMPORT_S
    assert {r.run_id for r in quick_client.list_runs()} >= {answered[0], quick.run_id}


def test_a_submission_that_fails_after_its_turn_releases_its_node_and_leaves_nothing(
    start_server, client_for, e2e_model, monkeypatch
):
    """The run is fsynced and renamed after the submission's turn: a failure there (a full disk, say) still
    releases the node it reserved and leaves no run, staged or placed."""
    server = start_server()
    client = client_for(server)
    tracker = server.tracker
    assert tracker is not None

    def disk_full(path: Path) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(runstore, "fsync_file", disk_full)
    with pytest.raises(Exception, match="No space left on device"):
        client.submit(write_workflow(e2e_model, "tasks: {a: {type: 'e2etasks.tasks:Slow'}}\nreserve: node-a"))
    assert [n.reserved_by for n in tracker.executor.nodes()] == [None]
    assert client.list_runs() == []
    assert not any((server.config.store / "runs").iterdir()), "a staged run was left behind"
    monkeypatch.undo()
    run = client.submit(write_workflow(e2e_model, "tasks: {a: {type: 'e2etasks.tasks:Slow'}}\nreserve: node-a"))
    assert [n.reserved_by for n in tracker.executor.nodes()] == [run.run_id]


def test_a_run_slow_to_write_holds_up_no_other_submission(start_server, client_for, e2e_model, monkeypatch):
    """A run's files are written aside after its submission's turn: while one run's files wait on a slow disk,
    another submission is checked, planned and answered (before, it waited for the turn the slow one held)."""
    server = start_server()
    slow_client, quick_client = client_for(server), client_for(server)
    quick_client.submit(write_workflow(e2e_model, "tasks: {a: {type: 'e2etasks.tasks:Slow'}}"))  # describer warm
    disk_free = threading.Event()
    writing = threading.Event()
    write_new = record_module.write_bytes_new

    def slow_disk(path: Path, data: bytes) -> None:
        # The record of the run whose task is `slow`, written in its folder aside (its only file: its pods lay
        # out their task's files).
        if path.name == "run.json" and b'"slow"' in data and not disk_free.is_set():
            writing.set()
            disk_free.wait(timeout=60)
        write_new(path, data)

    monkeypatch.setattr(record_module, "write_bytes_new", slow_disk)
    answered: dict[str, str] = {}
    failed: list[BaseException] = []

    def submit(name: str, client) -> None:
        try:
            workflow = write_workflow(e2e_model, f"tasks: {{{name}: {{type: 'e2etasks.tasks:Slow'}}}}", f"{name}.yaml")
            answered[name] = client.submit(workflow).run_id
        except BaseException as exc:
            failed.append(exc)

    slow = threading.Thread(target=submit, args=("slow", slow_client))
    quick = threading.Thread(target=submit, args=("quick", quick_client))
    slow.start()
    try:
        assert writing.wait(timeout=30), "the slow run's files were never begun"
        quick.start()
        quick.join(timeout=20)
        assert not failed, failed
        assert "quick" in answered, "a submission waited for another run's files to be written"
        assert "slow" not in answered, "the slow run was answered before its files were written"
    finally:
        disk_free.set()
        slow.join(timeout=60)
        if quick.ident is not None:  # started
            quick.join(timeout=60)
    assert not failed, failed
    assert {r.run_id for r in quick_client.list_runs()} >= set(answered.values())


def test_a_run_slow_to_save_in_the_driver_holds_up_no_submission(start_server, client_for, e2e_model, monkeypatch):
    """The driver saves a run's record outside its turn: while its save of one run's step waits on a slow disk,
    a submission is checked, planned and answered (before, it waited for the turn the driver held)."""
    client = warm_client(start_server, client_for, e2e_model)
    slow_disk, saving, disk_free = held_when(
        record_module.write_bytes_atomic, lambda path, data, **_: path.name == "run.json" and b'"slow"' in data
    )
    monkeypatch.setattr(record_module, "write_bytes_atomic", slow_disk)
    slow = "tasks: {slow: {type: 'e2etasks.tasks:Slow'}}"
    answered_while_saving = answered_while_held(client, e2e_model, slow, saving, disk_free, "saved the slow run's step")
    assert answered_while_saving, "a submission waited for the driver's save of another run"


def test_a_run_id_drawn_twice_is_drawn_again_not_a_failed_submission(start_server, client_for, e2e_model, monkeypatch):
    """Ids of the same second differ only by six random hex digits: one that a run has already (or another
    submission holds) is drawn again, where the second run's folder would not rename into place."""
    client = client_for(start_server())
    drawn = iter(["20261203-120000-aaaaaa", "20261203-120000-aaaaaa", "20261203-120000-bbbbbb"])
    monkeypatch.setattr(tracker_module, "new_run_id", lambda: next(drawn))
    workflow = write_workflow(e2e_model, "tasks: {a: {type: 'e2etasks.tasks:Slow', settings: {units: 1}}}")
    first, second = client.submit(workflow).run_id, client.submit(workflow, reuse="never").run_id
    assert (first, second) == ("20261203-120000-aaaaaa", "20261203-120000-bbbbbb")
    assert {r.run_id for r in client.list_runs()} == {first, second}


def test_the_driver_records_a_run_s_keys_outside_its_turn(start_server, client_for, e2e_model, monkeypatch):
    """The driver records an ended task's keys outside its turn, so while that is held a submission is answered
    (a key index may wait: on a lock, on SQLite, on a service)."""
    client = warm_client(start_server, client_for, e2e_model)
    # The driver's update, once the task ended (its submission's has no ended task to record).
    slow_index, recording, index_free = held_when(
        KeyIndex.update, lambda _index, record: "slowkeys" in record.tasks and record.tasks["slowkeys"].state.final
    )
    monkeypatch.setattr(KeyIndex, "update", slow_index)
    slow = "tasks: {slowkeys: {type: 'e2etasks.tasks:Slow', settings: {units: 1, seconds: 0}}}"
    answered_while_recording = answered_while_held(
        client, e2e_model, slow, recording, index_free, "recorded the ended task's keys"
    )
    assert answered_while_recording, "a submission waited for the driver's record of another run's keys"


def warm_client(start_server, client_for, model: Path):
    """A client of a new server whose model's describer is warm (one run submitted)."""
    client = client_for(start_server())
    client.submit(write_workflow(model, "tasks: {a: {type: 'e2etasks.tasks:Slow'}}"))
    return client


def held_when(call, holds):
    """A stand-in for `call` that, while not freed, holds each call `holds` matches until freed; returns it with
    the events `held` (set once one is held) and `free` (set to let them go)."""
    held, free = threading.Event(), threading.Event()

    def stand_in(*args, **kwargs):
        if holds(*args, **kwargs) and not free.is_set():
            held.set()
            free.wait(timeout=60)
        return call(*args, **kwargs)

    return stand_in, held, free


def answered_while_held(
    client, model: Path, workflow: str, held: threading.Event, free: threading.Event, what: str
) -> bool:
    """Submits `workflow`, waits until the driver is `held` on its run, and says whether another submission was
    answered before `free` is set (set at the end, whatever happened)."""
    answered: list[str] = []
    failed: list[BaseException] = []

    def submit_quick() -> None:
        try:
            answered.append(
                client.submit(write_workflow(model, "tasks: {b: {type: 'e2etasks.tasks:Slow'}}", "b.yaml")).run_id
            )
        except BaseException as exc:
            failed.append(exc)

    quick = threading.Thread(target=submit_quick)
    try:
        client.submit(write_workflow(model, workflow, "slow.yaml"))
        assert held.wait(timeout=30), f"the driver never {what}"
        quick.start()
        quick.join(timeout=20)
        answered_while = bool(answered)
    finally:
        free.set()
        if quick.ident is not None:  # started
            quick.join(timeout=60)
    assert not failed, failed
    return answered_while
