"""The one checked way to build store paths from a request, and to read a store file without following links."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from simrun_runtime.layout import (
    NAME,
    RUN_ID,
    TASK_ID,
    TaskLayout,
    UnsafePath,
    checked,
    checked_path,
    read_regular,
)


@pytest.mark.parametrize("name", ["..", ".", "*", "**", "a/b", "/etc", "", "a" * 129, ".hidden", "x\0"])
def test_a_name_that_is_not_a_plain_component_is_unsafe(name: str) -> None:
    with pytest.raises(UnsafePath, match="is not valid: it must match"):
        checked("name", name, NAME)


def test_checked_path_joins_checked_components(tmp_path: Path) -> None:
    assert checked_path(tmp_path, "a", "b.c") == tmp_path / "a" / "b.c"
    with pytest.raises(UnsafePath):
        checked_path(tmp_path, "a", "../b")


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


def test_read_regular_refuses_links_and_special_files(tmp_path: Path) -> None:
    secret = tmp_path / "tokens.yaml"
    secret.write_text("secret")
    (tmp_path / "summary.json").symlink_to(secret)
    os.mkfifo(tmp_path / "fifo")
    assert read_regular(secret) == b"secret"
    with pytest.raises(UnsafePath, match="symbolic link"):
        read_regular(tmp_path / "summary.json")
    with pytest.raises(UnsafePath, match="not a regular file"):
        read_regular(tmp_path / "fifo")
    assert read_regular(secret, limit=3) == b"sec"
