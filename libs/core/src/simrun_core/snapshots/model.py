"""The snapshot domain's values: file entries, snapshots, and the rules a listing of files must follow."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from simrun_runtime.record import Provenance, SnapshotRef

from simrun_core.errors import InvalidArgument

_SHA256 = re.compile(r"[0-9a-f]{64}")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_SNAPSHOT_ID = re.compile(r"[0-9a-f]{32}")
MAX_PATH_BYTES = 4096
# Linux gives up after 40 symlinks in one lookup (ELOOP); so do we.
MAX_SYMLINK_HOPS = 40


@dataclass(frozen=True, slots=True)
class FileEntry:
    """One file of a tree: its path, the SHA-256 of its content (of its target for a symlink), bytes, mode.

    Attributes:
        path: relative to the tree's root, with forward slashes.
        sha256: hex SHA-256 of the content; of the UTF-8 target for a symlink.
        size: bytes of the content (of the target for a symlink).
        executable: whether the file keeps an executable bit.
        symlink_target: the target of a symlink; empty for a regular file.
    """

    path: str
    sha256: str
    size: int
    executable: bool = False
    symlink_target: str = ""

    @property
    def is_symlink(self) -> bool:
        return bool(self.symlink_target)

    @classmethod
    def symlink(cls, path: str, target: str) -> FileEntry:
        data = target.encode()
        return cls(path, hashlib.sha256(data).hexdigest(), len(data), False, target)


@dataclass(frozen=True)
class Snapshot:
    """A content-named snapshot of a tree in the store.

    Attributes:
        name: the source name, e.g. the checkout's folder name.
        snapshot_id: the content id: the same files give the same id.
        path: the snapshot's folder relative to the store root, `snapshots/<name>/<snapshot_id>`.
        provenance: where the files came from.
        file_count: files and symlinks.
        total_bytes: bytes of the file contents.
        create_time: when the snapshot was first written.
    """

    name: str
    snapshot_id: str
    path: str
    provenance: Provenance
    file_count: int
    total_bytes: int
    create_time: datetime

    def to_ref(self) -> SnapshotRef:
        """The reference a run's record keeps to this snapshot."""
        return SnapshotRef(name=self.name, snapshot_id=self.snapshot_id, path=self.path, provenance=self.provenance)


@dataclass(frozen=True)
class WriteResult:
    """What writing a snapshot did.

    Attributes:
        snapshot: the snapshot, with the provenance of this request (the stored one keeps the first's).
        existed: whether the same content was in the store already, so nothing was written.
        contents_written: file contents copied or received into the store (not hard-linked).
        contents_linked: files hard-linked to the previous snapshot of the name or to a twin in this one.
    """

    snapshot: Snapshot
    existed: bool
    contents_written: int = 0
    contents_linked: int = 0


def validate_name(name: str) -> str:
    """A source name is one folder name of letters, digits, `.`, `_` and `-`, starting with a letter or digit."""
    if not _NAME.fullmatch(name or ""):
        raise InvalidArgument(
            f"bad snapshot name {name!r}: use 1-128 letters, digits, '.', '_' or '-', starting with a letter or digit"
        )
    return name


def validate_snapshot_id(snapshot_id: str) -> str:
    if not _SNAPSHOT_ID.fullmatch(snapshot_id or ""):
        raise InvalidArgument(f"bad snapshot_id {snapshot_id!r}: expected 32 lowercase hex digits")
    return snapshot_id


def sanitize_name(folder_name: str) -> str:
    """The default source name of a folder: its name with every character a name may not hold made `-`."""
    name = re.sub(r"[^A-Za-z0-9._-]", "-", folder_name).lstrip("._-")[:128]
    return name or "tree"


def validate_path(path: str) -> None:
    """A path is relative, with forward slashes, no empty, `.` or `..` part, and no NUL."""
    if not path:
        raise InvalidArgument("empty path in the file list")
    if "\0" in path:
        raise InvalidArgument(f"path {path!r} contains a NUL byte")
    if path[0] == "/":
        raise InvalidArgument(f"path {path!r} is absolute: paths are relative to the tree's root")
    if not path.isascii():
        try:
            path.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidArgument(f"path {path!r} is not valid UTF-8: rename it") from None
    if len(path) > MAX_PATH_BYTES // 4 and len(path.encode()) > MAX_PATH_BYTES:
        raise InvalidArgument(f"path {path[:60]!r}… is longer than {MAX_PATH_BYTES} bytes")
    wrapped = f"/{path}/"
    if "/../" in wrapped:
        raise InvalidArgument(f"path {path!r} contains '..'")
    if "//" in wrapped or "/./" in wrapped:
        raise InvalidArgument(f"path {path!r} has an empty or '.' part: write it normalized")


def validate_sha256(sha256: str, path: str) -> None:
    if not _SHA256.fullmatch(sha256 or ""):
        raise InvalidArgument(f"bad sha256 {sha256!r} of {path!r}: expected 64 lowercase hex digits")


def validate_files(files: Iterable[FileEntry]) -> list[FileEntry]:
    """Checks a listing of a tree and returns it sorted by path.

    Refuses bad paths and hashes, duplicates, a path that is a file and a folder at once, a path that leads
    through a symlink, and a symlink that is absolute or leads out of the tree.
    """
    by_path: dict[str, FileEntry] = {}
    for entry in files:
        validate_path(entry.path)
        validate_sha256(entry.sha256, entry.path)
        if entry.size < 0:
            raise InvalidArgument(f"negative size {entry.size} of {entry.path!r}")
        if entry.path in by_path:
            raise InvalidArgument(f"path {entry.path!r} is listed twice")
        if entry.is_symlink:
            _check_target_text(entry.path, entry.symlink_target)
            expected = FileEntry.symlink(entry.path, entry.symlink_target)
            if (entry.sha256, entry.size) != (expected.sha256, expected.size):
                raise InvalidArgument(f"symlink {entry.path!r}: sha256 and size must be those of its target")
            if entry.executable:
                raise InvalidArgument(f"symlink {entry.path!r} cannot be executable")
        by_path[entry.path] = entry
    folders: set[str] = set()
    for path in by_path:
        folder = path.rpartition("/")[0]
        while folder and folder not in folders:
            folders.add(folder)
            other = by_path.get(folder)
            if other is not None and other.is_symlink:
                raise InvalidArgument(f"path {path!r} leads through the symlink {folder!r}")
            if other is not None:
                raise InvalidArgument(f"path {folder!r} is listed as a file and is the folder of {path!r}")
            folder = folder.rpartition("/")[0]
    symlinks = {e.path: e.symlink_target for e in by_path.values() if e.is_symlink}
    for path, target in symlinks.items():
        _check_symlink(path, target, symlinks)
    return [by_path[p] for p in sorted(by_path)]


def _check_target_text(path: str, target: str) -> None:
    if "\0" in target:
        raise InvalidArgument(f"symlink {path!r} has a NUL byte in its target")
    try:
        target.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidArgument(f"symlink {path!r} has a target that is not valid UTF-8") from None
    if target.startswith("/"):
        raise InvalidArgument(f"symlink {path!r} points to the absolute path {target!r}, out of the tree")


def _check_symlink(path: str, target: str, symlinks: dict[str, str]) -> None:
    _resolve(path, target, symlinks, [0], origin=path)


def _resolve(path: str, target: str, symlinks: dict[str, str], hops: list[int], origin: str) -> list[str]:
    """Resolves a symlink's target within the listed tree, as the kernel would; refuses to leave the tree."""
    hops[0] += 1
    if hops[0] > MAX_SYMLINK_HOPS:
        raise InvalidArgument(f"symlink {origin!r}: too many levels of symlinks (a loop?)")
    if target.startswith("/"):
        raise InvalidArgument(f"symlink {origin!r} leads through {path!r} to the absolute path {target!r}")
    stack = path.split("/")[:-1]
    for part in target.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if not stack:
                raise InvalidArgument(f"symlink {origin!r} points out of the tree ({target!r} from {path!r})")
            stack.pop()
            continue
        stack.append(part)
        joined = "/".join(stack)
        if joined in symlinks:
            stack = _resolve(joined, symlinks[joined], symlinks, hops, origin)
    return stack


def content_id(files: Iterable[FileEntry]) -> str:
    """The snapshot id of a validated, sorted listing: SHA-256 over its canonical form, 32 hex digits.

    Each entry contributes `path NUL kind NUL sha256 NUL target LF`, where kind is `f` (regular), `x`
    (executable) or `l` (symlink); the size is implied by the hash.
    """
    digest = hashlib.sha256()
    for entry in files:
        kind = "l" if entry.is_symlink else ("x" if entry.executable else "f")
        digest.update(f"{entry.path}\0{kind}\0{entry.sha256}\0{entry.symlink_target}\n".encode())
    return digest.hexdigest()[:32]
