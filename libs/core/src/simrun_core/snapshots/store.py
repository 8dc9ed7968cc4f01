"""Writes content-named snapshots into the store atomically, hard-linking what the last snapshot of the name has."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from simrun_runtime.layout import StoreLayout
from simrun_runtime.record import Provenance

from simrun_core.errors import FailedPrecondition, InvalidArgument, NotFound
from simrun_core.snapshots.model import (
    FileEntry,
    Snapshot,
    WriteResult,
    content_id,
    validate_files,
    validate_name,
    validate_snapshot_id,
)
from simrun_core.snapshots.tarball import drain, receive_contents

_COPY_BYTES = 1 << 20
READ_ONLY = 0o444
READ_ONLY_EXECUTABLE = 0o555


class ContentSource(Protocol):
    """Where the contents a snapshot lacks come from: the client's tree, or what an upload sent."""

    def has(self, sha256: str) -> bool:
        """Whether this source can place the content with this hash."""
        ...

    def place(self, entry: FileEntry, dest: str) -> None:
        """Creates `dest` with the content of `entry`, verified against its announced hash."""
        ...


class LocalFiles:
    """The files of a tree on this machine (a client with the store mounted), each verified as it is copied."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def has(self, sha256: str) -> bool:
        return True

    def place(self, entry: FileEntry, dest: str) -> None:
        source = self.root / entry.path
        try:
            fd = os.open(source, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError as exc:
            raise InvalidArgument(f"cannot read {entry.path!r} of the tree: {exc.strerror}; snapshot again") from exc
        digest = hashlib.sha256()
        with os.fdopen(fd, "rb") as src, open(dest, "xb") as out:
            while block := src.read(_COPY_BYTES):
                digest.update(block)
                out.write(block)
        if digest.hexdigest() != entry.sha256:
            raise InvalidArgument(
                f"the content of {entry.path!r} does not match its announced sha256 (changed while snapshotting?)"
            )


class StagedContents:
    """Contents an upload sent, extracted and verified in a folder of the store, named by their hash."""

    def __init__(self, stage: Path, received: set[str]) -> None:
        self.stage = stage
        self.received = received

    def has(self, sha256: str) -> bool:
        return sha256 in self.received

    def place(self, entry: FileEntry, dest: str) -> None:
        os.rename(self.stage / entry.sha256, dest)
        self.received.discard(entry.sha256)


@dataclass
class _Contents:
    """The regular files of a stored snapshot by (sha256, executable): what a new one can hard-link."""

    by_key: dict[tuple[str, bool], str] = field(default_factory=dict)

    @property
    def hashes(self) -> set[str]:
        return {sha for sha, _ in self.by_key}

    def find(self, sha256: str, executable: bool) -> str | None:
        return self.by_key.get((sha256, executable)) or self.by_key.get((sha256, not executable))


class SnapshotStore:
    """The snapshots of a store: `snapshots/<name>/<snapshot_id>/` with `<snapshot_id>.files.json` beside it."""

    def __init__(self, root: Path) -> None:
        self.layout = StoreLayout(Path(root))

    # reading

    def get(self, name: str, snapshot_id: str) -> Snapshot:
        """A stored snapshot; `NotFound` when there is none."""
        validate_name(name)
        validate_snapshot_id(snapshot_id)
        snapshot = self._existing(name, snapshot_id)
        if snapshot is None:
            raise NotFound(f"no snapshot {snapshot_id} of {name!r} in the store")
        return snapshot

    def list_snapshots(self, name: str) -> list[Snapshot]:
        """The snapshots of a name, newest first; empty for a name never snapshotted."""
        validate_name(name)
        folder = self.layout.snapshot_name(name)
        if not folder.is_dir():
            return []
        suffix = ".files.json"
        snapshots = []
        for listing in folder.glob(f"*{suffix}"):
            snapshot_id = listing.name[: -len(suffix)]
            snapshot = self._existing(name, snapshot_id)
            if snapshot is not None:
                snapshots.append(snapshot)
        return sorted(snapshots, key=lambda s: (s.create_time, s.snapshot_id), reverse=True)

    def latest_id(self, name: str) -> str | None:
        """The id of the last snapshot made of a name, if any."""
        try:
            return self.layout.snapshot_latest(validate_name(name)).read_text().strip() or None
        except FileNotFoundError:
            return None

    def find_missing(self, name: str, files: Iterable[FileEntry]) -> list[str]:
        """The hashes of the announced regular contents that the latest snapshot of the name lacks, sorted."""
        validate_name(name)
        entries = validate_files(files)
        have = self._latest_contents(name).hashes
        return sorted({e.sha256 for e in entries if not e.is_symlink and e.sha256 not in have})

    def path_of(self, name: str, snapshot_id: str) -> str:
        """A snapshot's folder relative to the store root."""
        return self.layout.snapshot(name, snapshot_id).relative_to(self.layout.root).as_posix()

    # writing

    def write(
        self, name: str, files: Iterable[FileEntry], provenance: Provenance, source: ContentSource
    ) -> WriteResult:
        """Writes the snapshot of these files, or nothing when the store has it already.

        Raises:
            InvalidArgument: a bad name, path, hash or symlink, or a content that does not match its hash.
            FailedPrecondition: a content neither the source nor the store has.
        """
        validate_name(name)
        entries = validate_files(files)
        snapshot_id = content_id(entries)
        reused = self.reuse(name, snapshot_id, provenance)
        if reused is not None:
            return reused
        return self._build(name, snapshot_id, entries, provenance, source)

    def reuse(self, name: str, snapshot_id: str, provenance: Provenance) -> WriteResult | None:
        """The stored snapshot with this content id, made the name's latest; None when there is none.

        This is how making a snapshot again writes nothing: a client that computed the id itself asks first.
        """
        existing = self._existing(validate_name(name), validate_snapshot_id(snapshot_id))
        if existing is None:
            return None
        self._point_latest(name, snapshot_id)
        return WriteResult(replace(existing, provenance=provenance), existed=True)

    def receive_upload(
        self,
        name: str,
        files: Iterable[FileEntry],
        provenance: Provenance,
        tar_size: int,
        chunks: Iterable[bytes],
    ) -> WriteResult:
        """Writes the snapshot an upload announces from the contents of its tar and of the store.

        Every check of the header runs before a byte of the tar is read; nothing is left in the store on error.
        """
        validate_name(name)
        entries = validate_files(files)
        if tar_size < 0:
            raise InvalidArgument(f"negative tar_size {tar_size}")
        snapshot_id = content_id(entries)
        reused = self.reuse(name, snapshot_id, provenance)
        if reused is not None:
            drain(chunks, tar_size)
            return reused
        announced = {e.sha256: e.size for e in entries if not e.is_symlink}
        with _Cleanup(self.layout, name) as cleanup:
            stage = cleanup.temp()
            stage.mkdir()
            received = receive_contents(chunks, tar_size, announced, stage)
            return self._build(name, snapshot_id, entries, provenance, StagedContents(stage, received))

    def _build(
        self, name: str, snapshot_id: str, entries: list[FileEntry], provenance: Provenance, source: ContentSource
    ) -> WriteResult:
        target = self.layout.snapshot(name, snapshot_id)
        with _Cleanup(self.layout, name) as cleanup:
            build = cleanup.temp()
            build.mkdir()
            previous = self._latest_contents(name)
            others: _Contents | None = None
            placed = _Contents()
            made = {""}
            written = linked = 0
            base = f"{build}/"
            for entry in entries:
                folder = entry.path.rpartition("/")[0]
                if folder not in made:
                    os.makedirs(base + folder, exist_ok=True)
                    while folder not in made:
                        made.add(folder)
                        folder = folder.rpartition("/")[0]
                dest = base + entry.path
                if entry.is_symlink:
                    os.symlink(entry.symlink_target, dest)
                    continue
                key = (entry.sha256, entry.executable)
                link_from = placed.by_key.get(key) or previous.by_key.get(key)
                if link_from is None and not source.has(entry.sha256):
                    others = others or self._all_contents(name)
                    link_from = others.by_key.get(key)
                if link_from is not None and _link(link_from, dest):
                    linked += 1
                else:
                    # No twin with the same mode to share an inode with: copy the content, then set the mode.
                    copy_from = (
                        link_from
                        or placed.find(entry.sha256, entry.executable)
                        or previous.find(entry.sha256, entry.executable)
                    )
                    if copy_from is None and source.has(entry.sha256):
                        source.place(entry, dest)
                        written += 1
                    else:
                        if copy_from is None:
                            others = others or self._all_contents(name)
                            copy_from = others.find(entry.sha256, entry.executable)
                        if copy_from is None:
                            raise FailedPrecondition(
                                f"content {entry.sha256} of {entry.path!r} was neither sent nor is it in the store: "
                                "ask which contents are missing again"
                            )
                        shutil.copyfile(copy_from, dest)
                    os.chmod(dest, READ_ONLY_EXECUTABLE if entry.executable else READ_ONLY)
                placed.by_key.setdefault(key, dest)
            self._write_listing(name, snapshot_id, entries, provenance, cleanup)
            try:
                os.rename(build, target)
            except OSError as exc:
                if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                    raise
                # Another writer put the same content in place first: theirs is as good as ours.
                stored = self._existing(name, snapshot_id)
                if stored is None:
                    raise
                self._point_latest(name, snapshot_id)
                return WriteResult(replace(stored, provenance=provenance), existed=True)
            self._point_latest(name, snapshot_id)
        stored = self._existing(name, snapshot_id)
        assert stored is not None
        return WriteResult(replace(stored, provenance=provenance), False, written, linked)

    def _write_listing(
        self, name: str, snapshot_id: str, entries: list[FileEntry], provenance: Provenance, cleanup: _Cleanup
    ) -> None:
        """Writes `<snapshot_id>.files.json` before the folder appears; a listing already there is kept."""
        listing = {
            "name": name,
            "snapshot_id": snapshot_id,
            "create_time": datetime.now(UTC).isoformat(),
            "provenance": provenance.model_dump(mode="json"),
            "file_count": len(entries),
            "total_bytes": sum(e.size for e in entries if not e.is_symlink),
            "files": {e.path: e.sha256 for e in entries},
            "executable": [e.path for e in entries if e.executable],
            "symlinks": {e.path: e.symlink_target for e in entries if e.is_symlink},
        }
        temp = cleanup.temp()
        temp.write_text(json.dumps(listing, indent=1, sort_keys=True) + "\n")
        with contextlib.suppress(FileExistsError):
            os.link(temp, self.layout.snapshot_files(name, snapshot_id))

    def _point_latest(self, name: str, snapshot_id: str) -> None:
        if self.latest_id(name) == snapshot_id:
            return
        temp = self.layout.snapshot_temp(name, uuid.uuid4().hex)
        temp.write_text(snapshot_id + "\n")
        os.replace(temp, self.layout.snapshot_latest(name))

    # stored snapshots

    def _read_listing(self, name: str, snapshot_id: str) -> dict[str, Any] | None:
        try:
            data: dict[str, Any] = json.loads(self.layout.snapshot_files(name, snapshot_id).read_text())
        except FileNotFoundError:
            return None
        return data

    def _existing(self, name: str, snapshot_id: str) -> Snapshot | None:
        """A snapshot whose folder is in place (its listing is written before it)."""
        if not self.layout.snapshot(name, snapshot_id).is_dir():
            return None
        listing = self._read_listing(name, snapshot_id)
        if listing is None:
            return None
        return Snapshot(
            name=name,
            snapshot_id=snapshot_id,
            path=self.path_of(name, snapshot_id),
            provenance=Provenance.model_validate(listing["provenance"]),
            file_count=int(listing["file_count"]),
            total_bytes=int(listing["total_bytes"]),
            create_time=datetime.fromisoformat(listing["create_time"]),
        )

    def _contents(self, name: str, snapshot_id: str, into: _Contents) -> None:
        folder = self.layout.snapshot(name, snapshot_id)
        listing = self._read_listing(name, snapshot_id) if folder.is_dir() else None
        if listing is None:
            return
        executable = set(listing["executable"])
        symlinks = listing["symlinks"]
        base = f"{folder}/"
        for path, sha256 in listing["files"].items():
            if path not in symlinks:
                into.by_key.setdefault((sha256, path in executable), base + path)

    def _latest_contents(self, name: str) -> _Contents:
        contents = _Contents()
        latest = self.latest_id(name)
        if latest is not None:
            self._contents(name, latest, contents)
        return contents

    def _all_contents(self, name: str) -> _Contents:
        contents = _Contents()
        for snapshot in self.list_snapshots(name):
            self._contents(name, snapshot.snapshot_id, contents)
        return contents


def _link(source: str, dest: str) -> bool:
    """Hard-links `dest` to `source`; False where the file system refuses (too many links, another owner)."""
    try:
        os.link(source, dest)
    except OSError as exc:
        if exc.errno in (errno.EMLINK, errno.EPERM, errno.EXDEV, errno.EACCES, errno.ENOENT):
            return False
        raise
    return True


class _Cleanup:
    """Removes the temporaries of one write, and the name's folder if the write created it and failed."""

    def __init__(self, layout: StoreLayout, name: str) -> None:
        self.layout = layout
        self.name = name
        self.temps: list[Path] = []

    def __enter__(self) -> _Cleanup:
        folder = self.layout.snapshot_name(self.name)
        self.created = [p for p in (self.layout.snapshots, folder) if not p.exists()]
        folder.mkdir(parents=True, exist_ok=True)
        return self

    def temp(self) -> Path:
        path = self.layout.snapshot_temp(self.name, uuid.uuid4().hex)
        self.temps.append(path)
        return path

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        for path in self.temps:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
        if exc_type is not None:
            for folder in reversed(self.created):
                with contextlib.suppress(OSError):
                    folder.rmdir()
