"""The snapshot store: content ids, atomic writes, hard links to the last snapshot, and every refusal."""

from __future__ import annotations

import hashlib
import io
import json
import os
import stat
import tarfile
import threading
from pathlib import Path

import pytest
from simrun_core.errors import FailedPrecondition, InvalidArgument, NotFound
from simrun_core.snapshots.model import FileEntry, content_id, validate_files
from simrun_core.snapshots.store import LocalFiles, SnapshotStore
from simrun_core.snapshots.tarball import iter_tar, tar_size
from simrun_runtime.layout import StoreLayout
from simrun_runtime.record import Provenance

PROVENANCE = Provenance(branch="main", commit="a" * 40, changed_files=["x.py"], dirty=True)


def entry(path: str, data: bytes, executable: bool = False) -> FileEntry:
    return FileEntry(path, hashlib.sha256(data).hexdigest(), len(data), executable)


def make_tree(root: Path, files: dict[str, bytes], executable: set[str] = frozenset()) -> list[FileEntry]:
    entries = []
    for path, data in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_bytes(data)
        entries.append(entry(path, data, path in executable))
    return entries


def listing(root: Path) -> list[tuple[str, int, int]]:
    """Every path of a folder with its inode and mtime: unchanged means nothing was written."""
    if not root.exists():
        return []
    return sorted((str(p.relative_to(root)), p.lstat().st_ino, p.lstat().st_mtime_ns) for p in root.rglob("*"))


def tar_of(contents: dict[str, bytes]) -> bytes:
    members = [(sha, len(data), lambda d=data: io.BytesIO(d)) for sha, data in contents.items()]
    return b"".join(iter_tar(members))


@pytest.fixture
def tree(tmp_path: Path) -> tuple[Path, list[FileEntry]]:
    root = tmp_path / "tree"
    files = {"a.py": b"print('a')\n", "pkg/b.py": b"b = 2\n", "run.sh": b"#!/bin/sh\necho hi\n", "same.txt": b"b = 2\n"}
    entries = make_tree(root, files, executable={"run.sh"})
    os.symlink("pkg/b.py", root / "link.py")
    entries.append(FileEntry.symlink("link.py", "pkg/b.py"))
    return root, entries


def test_a_snapshot_is_written_whole_read_only_with_its_listing(tmp_path: Path, tree: tuple[Path, list]) -> None:
    root, entries = tree
    store = SnapshotStore(tmp_path / "store")
    result = store.write("model", entries, PROVENANCE, LocalFiles(root))
    layout = StoreLayout(tmp_path / "store")
    folder = layout.snapshot("model", result.snapshot.snapshot_id)
    assert not result.existed
    assert result.snapshot.snapshot_id == content_id(validate_files(entries))
    assert result.snapshot.path == f"snapshots/model/{result.snapshot.snapshot_id}"
    assert result.snapshot.file_count == 5 and result.snapshot.total_bytes == sum(e.size for e in entries[:4])
    assert (folder / "pkg/b.py").read_bytes() == b"b = 2\n"
    assert stat.S_IMODE((folder / "a.py").stat().st_mode) == 0o444
    assert stat.S_IMODE((folder / "run.sh").stat().st_mode) == 0o555
    assert os.readlink(folder / "link.py") == "pkg/b.py"
    # twins inside one snapshot share an inode
    assert (folder / "same.txt").stat().st_ino == (folder / "pkg/b.py").stat().st_ino
    files = layout.snapshot_files("model", result.snapshot.snapshot_id)
    recorded = json.loads(files.read_text())
    assert recorded["files"] == {e.path: e.sha256 for e in entries}
    assert recorded["executable"] == ["run.sh"] and recorded["symlinks"] == {"link.py": "pkg/b.py"}
    assert layout.snapshot_latest("model").read_text().strip() == result.snapshot.snapshot_id
    assert [p.name for p in layout.snapshot_name("model").iterdir() if p.name.startswith(".")] == []
    assert store.get("model", result.snapshot.snapshot_id).provenance == PROVENANCE


def test_the_same_files_again_write_nothing(tmp_path: Path, tree: tuple[Path, list]) -> None:
    root, entries = tree
    store = SnapshotStore(tmp_path / "store")
    first = store.write("model", entries, PROVENANCE, LocalFiles(root))
    before = listing(tmp_path / "store")
    again = store.write("model", list(reversed(entries)), Provenance(branch="other"), LocalFiles(root))
    assert again.existed and again.snapshot.snapshot_id == first.snapshot.snapshot_id
    assert again.snapshot.provenance.branch == "other"  # this request's provenance; the stored one is kept
    assert store.get("model", first.snapshot.snapshot_id).provenance == PROVENANCE
    assert listing(tmp_path / "store") == before


def test_a_changed_file_shares_every_other_inode_with_the_last_snapshot(
    tmp_path: Path, tree: tuple[Path, list]
) -> None:
    root, entries = tree
    store = SnapshotStore(tmp_path / "store")
    first = store.write("model", entries, PROVENANCE, LocalFiles(root))
    (root / "a.py").write_bytes(b"print('changed')\n")
    changed = [entry("a.py", b"print('changed')\n"), *entries[1:]]
    second = store.write("model", changed, PROVENANCE, LocalFiles(root))
    assert second.contents_written == 1
    old = tmp_path / "store" / first.snapshot.path
    new = tmp_path / "store" / second.snapshot.path
    for path in ("pkg/b.py", "run.sh", "same.txt"):
        assert (old / path).stat().st_ino == (new / path).stat().st_ino
    assert (old / "a.py").stat().st_ino != (new / "a.py").stat().st_ino
    assert (old / "a.py").read_bytes() == b"print('a')\n"
    assert store.latest_id("model") == second.snapshot.snapshot_id
    assert [s.snapshot_id for s in store.list_snapshots("model")] == [
        second.snapshot.snapshot_id,
        first.snapshot.snapshot_id,
    ]


def test_a_mode_change_does_not_share_the_inode(tmp_path: Path, tree: tuple[Path, list]) -> None:
    root, entries = tree
    store = SnapshotStore(tmp_path / "store")
    first = store.write("model", entries, PROVENANCE, LocalFiles(root))
    flipped = [FileEntry(e.path, e.sha256, e.size, e.path == "a.py") if not e.is_symlink else e for e in entries]
    second = store.write("model", flipped, PROVENANCE, LocalFiles(root))
    old, new = (tmp_path / "store" / r.snapshot.path for r in (first, second))
    assert stat.S_IMODE((new / "a.py").stat().st_mode) == 0o555
    assert stat.S_IMODE((old / "a.py").stat().st_mode) == 0o444


def test_concurrent_identical_snapshots_give_one_whole_snapshot(tmp_path: Path, tree: tuple[Path, list]) -> None:
    root, entries = tree
    store_root = tmp_path / "store"
    barrier = threading.Barrier(6)
    results: list = []
    errors: list = []

    def snapshot() -> None:
        try:
            barrier.wait()
            results.append(SnapshotStore(store_root).write("model", entries, PROVENANCE, LocalFiles(root)))
        except Exception as exc:
            errors.append(exc)

    threads = [threading.Thread(target=snapshot) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len({r.snapshot.snapshot_id for r in results}) == 1
    snapshot_id = results[0].snapshot.snapshot_id
    folder = StoreLayout(store_root).snapshot_name("model")
    assert sorted(p.name for p in folder.iterdir()) == sorted([snapshot_id, f"{snapshot_id}.files.json", "latest"])
    assert (folder / snapshot_id / "pkg/b.py").read_bytes() == b"b = 2\n"
    assert len(list((folder / snapshot_id).rglob("*"))) == 6


@pytest.mark.parametrize(
    ("files", "message"),
    [
        ([FileEntry("/etc/passwd", "0" * 64, 1)], "absolute"),
        ([FileEntry("a/../../x", "0" * 64, 1)], "'..'"),
        ([FileEntry("..", "0" * 64, 1)], "'..'"),
        ([FileEntry("a//b", "0" * 64, 1)], "empty"),
        ([FileEntry("a", "0" * 64, 1), FileEntry("a", "1" * 64, 1)], "twice"),
        ([FileEntry("a", "0" * 64, 1), FileEntry("a/b", "1" * 64, 1)], "file and is the folder"),
        ([FileEntry("a", "XYZ", 1)], "sha256"),
        ([FileEntry.symlink("out", "../elsewhere")], "out of the tree"),
        ([FileEntry.symlink("out", "/etc")], "absolute"),
        ([FileEntry.symlink("d/l", "../../x")], "out of the tree"),
        ([FileEntry.symlink("up", ".."), FileEntry.symlink("via", "up/x")], "out of the tree"),
        ([FileEntry.symlink("l", "sub"), FileEntry("l/f", "0" * 64, 1)], "through the symlink"),
        ([FileEntry.symlink("a", "b"), FileEntry.symlink("b", "a")], "too many levels"),
        ([FileEntry("l", hashlib.sha256(b"x").hexdigest(), 1, False, "y")], "of its target"),
    ],
)
def test_bad_listings_are_refused_and_write_nothing(tmp_path: Path, files: list[FileEntry], message: str) -> None:
    store = SnapshotStore(tmp_path / "store")
    with pytest.raises(InvalidArgument, match=message):
        store.write("model", files, PROVENANCE, LocalFiles(tmp_path))
    with pytest.raises(InvalidArgument, match=message):
        store.receive_upload("model", files, PROVENANCE, 0, iter([]))
    assert not (tmp_path / "store").exists()


def test_symlinks_that_stay_inside_are_kept() -> None:
    kept = validate_files(
        [
            FileEntry.symlink("d/up", ".."),
            FileEntry.symlink("d/l", "../d/./x"),
            FileEntry.symlink("root", "."),
            FileEntry.symlink("via", "d/up/f"),
        ]
    )
    assert [e.path for e in kept] == ["d/l", "d/up", "root", "via"]


@pytest.mark.parametrize("name", ["", ".hidden", "a/b", "..", "x" * 200, "spaced name"])
def test_bad_names_are_refused(tmp_path: Path, name: str) -> None:
    with pytest.raises(InvalidArgument, match="name"):
        SnapshotStore(tmp_path).find_missing(name, [])


def test_a_content_that_does_not_match_its_hash_is_refused(tmp_path: Path, tree: tuple[Path, list]) -> None:
    root, entries = tree
    (root / "a.py").write_bytes(b"print('A')\n")  # same size, other bytes
    with pytest.raises(InvalidArgument, match="does not match"):
        SnapshotStore(tmp_path / "store").write("model", entries, PROVENANCE, LocalFiles(root))
    assert listing(tmp_path / "store") == []


def test_an_upload_writes_the_same_snapshot_as_local_files(tmp_path: Path, tree: tuple[Path, list]) -> None:
    root, entries = tree
    local = SnapshotStore(tmp_path / "local").write("model", entries, PROVENANCE, LocalFiles(root))
    remote = SnapshotStore(tmp_path / "remote")
    missing = remote.find_missing("model", entries)
    regular = {e.sha256: (root / e.path).read_bytes() for e in entries if not e.is_symlink}
    assert missing == sorted(regular)
    data = tar_of({sha: regular[sha] for sha in missing})
    assert len(data) == tar_size(len(regular[sha]) for sha in missing)
    uploaded = remote.receive_upload("model", entries, PROVENANCE, len(data), iter([data[:700], data[700:]]))
    assert uploaded.snapshot.snapshot_id == local.snapshot.snapshot_id
    assert uploaded.contents_written == len(missing)
    assert remote.find_missing("model", entries) == []
    assert listing(tmp_path / "remote" / "snapshots" / "model" / uploaded.snapshot.snapshot_id)
    for e in entries:
        a = tmp_path / "local" / local.snapshot.path / e.path
        b = tmp_path / "remote" / uploaded.snapshot.path / e.path
        assert a.lstat().st_mode == b.lstat().st_mode
        assert (os.readlink(a) == os.readlink(b)) if e.is_symlink else (a.read_bytes() == b.read_bytes())


def _bad_tar(kind: str, sha: str, data: bytes) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        info = tarfile.TarInfo(sha)
        if kind == "device":
            info.type, info.devmajor, info.devminor = tarfile.CHRTYPE, 1, 3
            tar.addfile(info)
        elif kind == "hardlink":
            info.type, info.linkname = tarfile.LNKTYPE, "/etc/passwd"
            tar.addfile(info)
        elif kind == "symlink":
            info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
            tar.addfile(info)
        elif kind == "folder":
            info.type = tarfile.DIRTYPE
            tar.addfile(info)
        elif kind == "unannounced":
            info = tarfile.TarInfo("../" + sha)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        elif kind == "mismatch":
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data.upper()))
        elif kind == "larger":
            info.size = len(data) + 1
            tar.addfile(info, io.BytesIO(data + b"!"))
    return out.getvalue()


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("device", "character device"),
        ("hardlink", "hard link"),
        ("symlink", "symlink"),
        ("folder", "folder"),
        ("unannounced", "not named by"),
        ("mismatch", "does not match"),
        ("larger", "announced"),
        ("garbage", "not a valid tar"),
    ],
)
def test_bad_tars_are_refused_and_write_nothing(tmp_path: Path, kind: str, message: str) -> None:
    data = b"hello world\n"
    files = [entry("f.txt", data)]
    body = b"\x01" * 2048 if kind == "garbage" else _bad_tar(kind, files[0].sha256, data)
    store = SnapshotStore(tmp_path / "store")
    with pytest.raises(InvalidArgument, match=message):
        store.receive_upload("model", files, PROVENANCE, len(body), iter([body]))
    assert listing(tmp_path / "store") == []


def test_more_or_fewer_bytes_than_announced_are_refused(tmp_path: Path) -> None:
    data = b"hello world\n"
    files = [entry("f.txt", data)]
    body = tar_of({files[0].sha256: data})
    store = SnapshotStore(tmp_path / "store")
    with pytest.raises(InvalidArgument, match="more bytes than"):
        store.receive_upload("model", files, PROVENANCE, len(body) - 1, iter([body]))
    with pytest.raises(InvalidArgument, match="more bytes than"):
        store.receive_upload("model", files, PROVENANCE, 0, iter([body]))
    with pytest.raises(InvalidArgument, match="announced"):
        store.receive_upload("model", files, PROVENANCE, len(body) + 512, iter([body]))
    assert listing(tmp_path / "store") == []


def test_a_content_neither_sent_nor_stored_is_a_failed_precondition(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path / "store")
    with pytest.raises(FailedPrecondition, match="neither sent"):
        store.receive_upload("model", [entry("f.txt", b"x")], PROVENANCE, 0, iter([]))
    assert listing(tmp_path / "store") == []


def test_an_upload_finds_contents_in_older_snapshots_when_latest_moved_on(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path / "store")
    tree = tmp_path / "t"
    a = make_tree(tree, {"f.txt": b"one"})
    store.write("model", a, PROVENANCE, LocalFiles(tree))
    b = make_tree(tree, {"f.txt": b"two"})
    store.write("model", b, PROVENANCE, LocalFiles(tree))
    # a client that asked before `b` was written sends nothing for `one`: it is found in the older snapshot
    again = store.receive_upload("model", [*a, entry("g.txt", b"one")], PROVENANCE, 0, iter([]))
    assert not again.existed and again.contents_written == 0


def test_get_and_list(tmp_path: Path, tree: tuple[Path, list]) -> None:
    root, entries = tree
    store = SnapshotStore(tmp_path / "store")
    assert store.list_snapshots("model") == []
    with pytest.raises(NotFound):
        store.get("model", "0" * 32)
    with pytest.raises(InvalidArgument):
        store.get("model", "../x")
    written = store.write("model", entries, PROVENANCE, LocalFiles(root)).snapshot
    assert store.get("model", written.snapshot_id) == written
