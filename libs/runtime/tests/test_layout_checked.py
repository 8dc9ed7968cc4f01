"""The one checked way to build store paths from a request, and to read a store file without following links."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest
from simrun_runtime.files import write_json_atomic
from simrun_runtime.layout import (
    NAME,
    RUN_ID,
    TASK_ID,
    StoreLayout,
    TaskLayout,
    UnsafePath,
    checked,
    open_log,
    read_beneath,
)


@pytest.mark.parametrize("name", ["..", ".", "*", "**", "a/b", "/etc", "", "a" * 129, ".hidden", "x\0"])
def test_a_name_that_is_not_a_plain_component_is_unsafe(name: str) -> None:
    with pytest.raises(UnsafePath, match="is not valid: it must match"):
        checked("name", name, NAME)


def test_run_and_task_ids() -> None:
    assert checked("run", "20260101-120000-abcdef", RUN_ID)
    assert checked("task", "fit-2", TASK_ID)
    for bad in ("../x", "20260101-120000-abcdef/..", "Fit"):
        with pytest.raises(UnsafePath):
            checked("run", bad, RUN_ID) if "2026" in bad else checked("task", bad, TASK_ID)


@pytest.mark.parametrize("worker", ["../../../../../var/log/*", "*", "**", "/var/log/syslog", "w0.log", "x"])
def test_a_log_is_named_by_a_pod_only(tmp_path: Path, worker: str) -> None:
    with pytest.raises(UnsafePath):
        TaskLayout(tmp_path).log(worker)
    assert TaskLayout(tmp_path).log("w3") == tmp_path / "logs" / "w3.log"


def test_read_beneath_follows_no_link_at_any_component(tmp_path: Path) -> None:
    secret = tmp_path / "tokens.yaml"
    secret.write_text("secret")
    task = tmp_path / "task"
    (task / "out").mkdir(parents=True)
    (task / "out" / "summary.json").symlink_to(secret)
    (task / "elsewhere").symlink_to(tmp_path)
    os.mkfifo(task / "out" / "fifo")
    (task / "out" / "ok.json").write_text("{}")
    assert read_beneath(task, "out", "ok.json") == b"{}"
    assert read_beneath(task, "out", "ok.json", limit=1) == b"{"
    with pytest.raises(UnsafePath, match="symbolic link"):
        read_beneath(task, "out", "summary.json")
    with pytest.raises(UnsafePath, match="elsewhere is not a folder"):
        read_beneath(task, "elsewhere", "tokens.yaml")
    with pytest.raises(UnsafePath, match="not a regular file"):
        read_beneath(task, "out", "fifo")


def test_open_log_puts_aside_what_a_task_left_in_place_of_its_logs(tmp_path: Path) -> None:
    secret = tmp_path / "token"
    secret.write_text("secret")
    task = TaskLayout(tmp_path / "task")
    task.root.mkdir()
    task.logs.symlink_to(tmp_path)  # logs/ made a link to a folder holding the token
    with os.fdopen(open_log(task, "w0"), "a") as log:
        log.write("line\n")
    assert task.logs.is_dir() and not task.logs.is_symlink()
    (task.logs / "w1.log").symlink_to(secret)
    with os.fdopen(open_log(task, "w1"), "a") as log:
        log.write("line\n")
    assert secret.read_text() == "secret" and not (tmp_path / "w0.log").exists()
    assert (task.logs / "w1.log").read_text() == "line\n"


def test_an_atomic_write_never_writes_through_a_link_planted_at_its_temporary_name(tmp_path: Path) -> None:
    """A task's folder is its pods' to write: one may plant a link where the server's next write makes its
    temporary file. The write replaces the link (and a temporary file a dead writer left), never its target."""
    victim = tmp_path / "victim"
    victim.write_text("the owner's")
    folder = tmp_path / "task"
    folder.mkdir()
    target = folder / "settings.json"
    planted = folder / f".{target.name}.tmp-{os.getpid()}-{threading.get_ident()}"
    planted.symlink_to(victim)
    write_json_atomic(target, {"units": 3})
    assert victim.read_text() == "the owner's"
    assert json.loads(target.read_text()) == {"units": 3} and not target.is_symlink()
    assert not planted.exists() and not planted.is_symlink()
    planted.write_text("left by a writer that died")
    write_json_atomic(target, {"units": 4})
    assert json.loads(target.read_text()) == {"units": 4}


def test_a_store_resolves_a_snapshot_folder_once_and_a_missing_one_every_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = tmp_path / "disk" / "snapshots"
    (real / "model" / "abc").mkdir(parents=True)
    (tmp_path / "store").mkdir()
    (tmp_path / "store" / "snapshots").symlink_to(real)
    store = StoreLayout(tmp_path / "store")
    assert store.resolved("snapshots/model/abc") == (real / "model" / "abc").resolve()
    assert store.resolved("snapshots/model/later") == (real / "model" / "later").resolve()
    expected = (real / "model" / "abc").resolve()
    calls: list[str] = []
    lstat = os.lstat
    monkeypatch.setattr(os, "lstat", lambda path, *a, **k: calls.append(str(path)) or lstat(path, *a, **k))
    assert store.resolved("snapshots/model/abc") == expected
    assert calls == []  # a folder that exists is resolved once
    (real / "model" / "later").mkdir()
    assert store.resolved("snapshots/model/later") == (real / "model" / "later").resolve()
    assert calls  # one that did not exist was not remembered
    assert store == StoreLayout(tmp_path / "store") and hash(store) == hash(StoreLayout(tmp_path / "store"))
