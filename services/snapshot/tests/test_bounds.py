"""The snapshot service's bounds: files per snapshot, path component length, upload size; refused before writing."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from simrun_core.config import Limits
from simrun_core.errors import InvalidArgument
from simrun_core.snapshots.model import FileEntry
from simrun_core.snapshots.store import LocalFiles, SnapshotStore
from simrun_runtime.record import Provenance

PROVENANCE = Provenance()


def entries_of(root: Path, files: dict[str, bytes]) -> list[FileEntry]:
    out = []
    for path, data in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_bytes(data)
        out.append(FileEntry(path, hashlib.sha256(data).hexdigest(), len(data)))
    return out


def test_too_many_files_are_refused(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path / "store", Limits(files_per_snapshot=2))
    entries = entries_of(tmp_path / "tree", {"a": b"1", "b": b"2", "c": b"3"})
    with pytest.raises(InvalidArgument, match="3 files, more than the 2 this server takes"):
        store.write("m", entries, PROVENANCE, LocalFiles(tmp_path / "tree"))
    assert not (tmp_path / "store" / "snapshots").exists() or not any((tmp_path / "store" / "snapshots").rglob("*"))


def test_a_path_component_longer_than_a_file_name_is_invalid_argument(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path / "store")
    data = b"x"
    entry = FileEntry("pkg/" + "n" * 256, hashlib.sha256(data).hexdigest(), 1)
    with pytest.raises(InvalidArgument, match="has a component of 256 bytes, more than the 255"):
        store.find_missing("m", [entry])
    with pytest.raises(InvalidArgument, match="component of 256 bytes"):
        store.receive_upload("m", [entry], PROVENANCE, 1024, iter([b"\0" * 1024]))


def test_an_oversized_upload_is_refused_before_a_byte_is_read(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path / "store", Limits(upload_bytes=1000))
    entry = FileEntry("big.bin", hashlib.sha256(b"y").hexdigest(), 1)
    read = []

    def chunks():  # type: ignore[no-untyped-def]
        read.append(1)
        yield b"\0" * 512

    with pytest.raises(InvalidArgument, match="announces 5000 bytes, more than the 1000 this server takes"):
        store.receive_upload("m", [entry], PROVENANCE, 5000, chunks())
    assert read == []
