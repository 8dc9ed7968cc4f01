"""Snapshotting working trees: which files, their hashes and modes, the provenance, the stat cache; the mounted
and the upload paths, the command, and every refusal, on real git repositories in temporary folders."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from simrun_client import snapshot_cli
from simrun_client.channel import open_channel
from simrun_client.snapshots import snapshot_to_store, upload_snapshot
from simrun_client.worktree import scan_tree
from simrun_core.errors import InvalidArgument, Unauthenticated

GIT_ENV = {
    "GIT_AUTHOR_NAME": "Test",
    "GIT_AUTHOR_EMAIL": "test@example.com",
    "GIT_COMMITTER_NAME": "Test",
    "GIT_COMMITTER_EMAIL": "test@example.com",
    "GIT_CONFIG_NOSYSTEM": "1",
}


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout


@pytest.fixture(autouse=True)
def isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for key, value in GIT_ENV.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


@pytest.fixture
def repo(tmp_path: Path, isolated: None) -> Path:
    """A model repository with committed, modified, untracked, ignored, deleted, executable and symlinked files."""
    root = tmp_path / "model"
    root.mkdir()
    git(root, "init", "-q", "-b", "main")
    (root / ".gitignore").write_text("*.log\nbuild/\n")
    (root / "model.py").write_text("x = 1\n")
    (root / "pkg").mkdir()
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "core.py").write_text("def f():\n    return 1\n")
    (root / "run.sh").write_text("#!/bin/sh\necho run\n")
    (root / "run.sh").chmod(0o755)
    (root / "gone.py").write_text("deleted later\n")
    os.symlink("pkg/core.py", root / "core_link.py")
    git(root, "add", ".")
    git(root, "commit", "-q", "-m", "initial")
    (root / "model.py").write_text("x = 2\n")  # modified
    (root / "notes.txt").write_text("untracked\n")  # untracked
    (root / "debug.log").write_text("ignored\n")  # ignored
    (root / "build").mkdir()
    (root / "build" / "out.bin").write_bytes(b"\0" * 10)  # ignored folder
    (root / "gone.py").unlink()  # tracked, deleted
    return root


def test_the_files_git_knows_with_uncommitted_changes(repo: Path) -> None:
    scan = scan_tree(repo)
    by_path = {e.path: e for e in scan.files}
    listed = git(repo, "ls-files", "-z", "--cached", "--others", "--exclude-standard").split("\0")
    assert set(by_path) == {p for p in listed if p} - {"gone.py"}
    assert set(by_path) == {
        ".gitignore",
        "model.py",
        "pkg/__init__.py",
        "pkg/core.py",
        "run.sh",
        "core_link.py",
        "notes.txt",
    }
    for path, e in by_path.items():
        if not e.is_symlink:
            data = (repo / path).read_bytes()
            assert (e.sha256, e.size) == (hashlib.sha256(data).hexdigest(), len(data))
    assert by_path["model.py"].sha256 == hashlib.sha256(b"x = 2\n").hexdigest()
    assert by_path["run.sh"].executable and not by_path["model.py"].executable
    assert by_path["core_link.py"].symlink_target == "pkg/core.py"
    assert scan.files == sorted(scan.files, key=lambda e: e.path)


def test_provenance(repo: Path) -> None:
    scan = scan_tree(repo)
    assert scan.provenance.branch == "main"
    assert scan.provenance.commit == git(repo, "rev-parse", "HEAD").strip()
    assert scan.provenance.changed_files == ["gone.py", "model.py", "notes.txt"]
    assert scan.provenance.dirty
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "clean")
    git(repo, "checkout", "-q", "--detach")
    clean = scan_tree(repo)
    assert clean.provenance.branch is None and not clean.provenance.dirty and clean.provenance.changed_files == []
    assert clean.snapshot_id == scan.snapshot_id  # the same files, committed or not


def test_a_repository_without_commits(tmp_path: Path) -> None:
    root = tmp_path / "fresh"
    root.mkdir()
    git(root, "init", "-q", "-b", "main")
    (root / "a.py").write_text("a\n")
    scan = scan_tree(root)
    assert [e.path for e in scan.files] == ["a.py"]
    assert scan.provenance.commit is None and scan.provenance.branch == "main" and scan.provenance.dirty


def test_a_folder_of_a_working_tree_is_snapshotted_alone(repo: Path) -> None:
    scan = scan_tree(repo / "pkg")
    assert [e.path for e in scan.files] == ["__init__.py", "core.py"]
    (repo / "pkg" / "core.py").write_text("changed\n")
    assert scan_tree(repo / "pkg").provenance.changed_files == ["core.py"]


def test_an_unchanged_tree_is_not_read_again(repo: Path) -> None:
    first = scan_tree(repo)
    assert first.files_read == len(first.files) - 1  # all but the symlink
    # Let the untracked and modified files' times fall out of the racy window of the next scan.
    past = time.time() - 10
    for path in ("model.py", "notes.txt"):
        os.utime(repo / path, (past, past))
    second = scan_tree(repo)  # re-reads the two files whose stat changed (utime)
    assert second.files_read == 2
    third = scan_tree(repo)
    assert third.files_read == 0
    assert third.files == first.files
    (repo / "notes.txt").write_text("untracked, changed\n")
    (repo / "pkg" / "core.py").write_text("def f():\n    return 2\n")
    fourth = scan_tree(repo)
    assert fourth.files_read == 2
    assert {e.path: e.sha256 for e in fourth.files}["notes.txt"] == hashlib.sha256(b"untracked, changed\n").hexdigest()


def test_racily_clean_entries_are_hashed_again(repo: Path) -> None:
    # An mtime not older than the cache's writing could hide a change of the same size in the same tick,
    # so such an entry is hashed again even though its stat matches; once its mtime is older, it is trusted.
    recent = time.time_ns() + 10**9
    past = time.time_ns() - 10 * 10**9
    os.utime(repo / "notes.txt", ns=(recent, recent))
    os.utime(repo / "model.py", ns=(past, past))
    scan_tree(repo)
    assert scan_tree(repo).files_read == 1
    assert scan_tree(repo).files_read == 1
    os.utime(repo / "notes.txt", ns=(past, past))
    assert scan_tree(repo).files_read == 1
    assert scan_tree(repo).files_read == 0


def test_not_a_working_tree(tmp_path: Path) -> None:
    (tmp_path / "plain").mkdir()
    with pytest.raises(InvalidArgument, match="not a git working tree"):
        scan_tree(tmp_path / "plain")
    with pytest.raises(InvalidArgument, match="not a folder"):
        scan_tree(tmp_path / "missing")
    bare = tmp_path / "bare.git"
    subprocess.run(["git", "init", "-q", "--bare", str(bare)], check=True)
    with pytest.raises(InvalidArgument, match="not a git working tree"):
        scan_tree(bare)


@pytest.mark.parametrize("target", ["../outside", "/etc/passwd", "pkg/../../outside"])
def test_a_symlink_out_of_the_tree_is_refused(repo: Path, target: str) -> None:
    os.symlink(target, repo / "escape")
    with pytest.raises(InvalidArgument, match="escape"):
        scan_tree(repo)


# snapshots: the mounted store and the upload path


@pytest.fixture
def service(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A snapshot service on loopback over its own store; yields its address and store root."""
    from simrun_core.identity import TokenRegistry
    from simrun_snapshot.server import create_server

    tokens = TokenRegistry.from_mapping({"owner": "alice", "tokens": {"tok": {"name": "alice"}}})
    server = create_server(tmp_path / "served", "127.0.0.1:0", tokens).start()
    try:
        yield f"127.0.0.1:{server.port}", tmp_path / "served"
    finally:
        server.stop(None)


def store_state(root: Path) -> list[tuple[str, int, int, int]]:
    """Every path of the store with inode, mode and mtime: equal states mean nothing was written."""
    if not root.exists():
        return []
    out = []
    for p in root.rglob("*"):
        st = p.lstat()
        out.append((str(p.relative_to(root)), st.st_ino, st.st_mode, st.st_mtime_ns))
    return sorted(out)


def snapshot_tree(root: Path) -> dict[str, tuple[int, str]]:
    """A snapshot's files: mode and content (or symlink target), by path."""
    out = {}
    for p in root.rglob("*"):
        st = p.lstat()
        if stat.S_ISLNK(st.st_mode):
            out[str(p.relative_to(root))] = (st.st_mode, "-> " + os.readlink(p))
        elif stat.S_ISREG(st.st_mode):
            out[str(p.relative_to(root))] = (stat.S_IMODE(st.st_mode), p.read_text())
    return out


def test_the_same_tree_twice_is_one_snapshot_and_writes_nothing(repo: Path, tmp_path: Path) -> None:
    store = tmp_path / "store"
    first = snapshot_to_store(repo, store)
    assert not first.existed and first.snapshot.name == "model"
    files = snapshot_tree(store / first.snapshot.path)
    assert files["run.sh"][0] == 0o555 and files["model.py"] == (0o444, "x = 2\n")
    assert files["core_link.py"][1] == "-> pkg/core.py"
    assert "debug.log" not in files and "gone.py" not in files and "build/out.bin" not in files
    before = store_state(store)
    again = snapshot_to_store(repo, store)
    assert again.existed and again.snapshot.snapshot_id == first.snapshot.snapshot_id and again.contents_sent == 0
    assert store_state(store) == before


def test_a_one_file_change_shares_every_other_inode(repo: Path, tmp_path: Path) -> None:
    store = tmp_path / "store"
    first = snapshot_to_store(repo, store)
    (repo / "pkg" / "core.py").write_text("def f():\n    return 2\n")
    second = snapshot_to_store(repo, store)
    assert second.snapshot.snapshot_id != first.snapshot.snapshot_id and second.contents_sent == 1
    old, new = store / first.snapshot.path, store / second.snapshot.path
    for path in snapshot_tree(new):
        if path == "pkg/core.py" or (new / path).is_symlink():
            continue
        assert (old / path).stat().st_ino == (new / path).stat().st_ino, path
    assert (old / "pkg/core.py").stat().st_ino != (new / "pkg/core.py").stat().st_ino
    listing = json.loads((store / f"{second.snapshot.path}.files.json").read_text())
    assert listing["files"]["pkg/core.py"] == hashlib.sha256(b"def f():\n    return 2\n").hexdigest()


def test_the_upload_path_and_the_mounted_path_give_identical_snapshots(
    repo: Path, tmp_path: Path, service: tuple[str, Path]
) -> None:
    address, served = service
    mounted = snapshot_to_store(repo, tmp_path / "store")
    channel = open_channel(address, "tok")
    try:
        uploaded = upload_snapshot(repo, channel)
        assert uploaded.snapshot.snapshot_id == mounted.snapshot.snapshot_id
        assert uploaded.snapshot.path == mounted.snapshot.path
        assert uploaded.snapshot.provenance == mounted.snapshot.provenance
        assert uploaded.contents_sent == 6 and uploaded.bytes_sent > 0
        assert snapshot_tree(served / uploaded.snapshot.path) == snapshot_tree(
            tmp_path / "store" / mounted.snapshot.path
        )
        mounted_listing = json.loads((tmp_path / "store" / f"{mounted.snapshot.path}.files.json").read_text())
        served_listing = json.loads((served / f"{uploaded.snapshot.path}.files.json").read_text())
        for key in ("files", "executable", "symlinks", "file_count", "total_bytes", "provenance"):
            assert mounted_listing[key] == served_listing[key]
        before = store_state(served)
        again = upload_snapshot(repo, channel)
        assert again.existed and again.bytes_sent == 0 and again.contents_sent == 0
        assert store_state(served) == before
        (repo / "notes.txt").write_text("one change\n")
        changed = upload_snapshot(repo, channel)
        assert changed.contents_sent == 1 and not changed.existed
        assert changed.snapshot.snapshot_id == snapshot_to_store(repo, tmp_path / "store").snapshot.snapshot_id
    finally:
        channel.close()


def test_the_upload_path_needs_a_token(repo: Path, service: tuple[str, Path]) -> None:
    channel = open_channel(service[0])
    try:
        with pytest.raises(Unauthenticated):
            upload_snapshot(repo, channel)
    finally:
        channel.close()


def test_concurrent_identical_snapshots_do_not_corrupt_each_other(
    repo: Path, tmp_path: Path, service: tuple[str, Path]
) -> None:
    store = tmp_path / "store"
    command = [sys.executable, "-m", "simrun_client.snapshot_cli", str(repo), "--store", str(store)]
    processes = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(3)]
    outputs = [p.communicate() for p in processes]
    assert [p.returncode for p in processes] == [0, 0, 0], outputs
    ids = {json.loads(out)["snapshot_id"] for out, _ in outputs}
    assert len(ids) == 1
    (snapshot_id,) = ids
    folder = store / "snapshots" / "model"
    assert sorted(p.name for p in folder.iterdir()) == sorted([snapshot_id, f"{snapshot_id}.files.json", "latest"])

    address, served = service
    results: list = []
    barrier = threading.Barrier(4)

    def upload() -> None:
        channel = open_channel(address, "tok")
        try:
            barrier.wait()
            results.append(upload_snapshot(repo, channel))
        finally:
            channel.close()

    threads = [threading.Thread(target=upload) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 4 and {r.snapshot.snapshot_id for r in results} == {snapshot_id}
    served_folder = served / "snapshots" / "model"
    # The service also records who has the snapshot (the read policy's readers), beside it.
    assert sorted(p.name for p in served_folder.iterdir()) == sorted(
        [*(p.name for p in folder.iterdir()), f"{snapshot_id}.readers.json"]
    )
    assert snapshot_tree(served_folder / snapshot_id) == snapshot_tree(folder / snapshot_id)


def test_the_command_prints_one_json_object(
    repo: Path, tmp_path: Path, service: tuple[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert snapshot_cli.main([str(repo), "--store", str(tmp_path / "store")]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["name"] == "model" and printed["path"] == f"snapshots/model/{printed['snapshot_id']}"
    assert printed["provenance"]["branch"] == "main" and printed["provenance"]["dirty"] is True
    assert snapshot_cli.main([str(repo), "--server", service[0], "--token", "tok", "--name", "other"]) == 0
    served = json.loads(capsys.readouterr().out)
    assert served["snapshot_id"] == printed["snapshot_id"] and served["name"] == "other"
    assert snapshot_cli.main([str(tmp_path), "--store", str(tmp_path / "store")]) == 1
    assert "not a git working tree" in capsys.readouterr().err
