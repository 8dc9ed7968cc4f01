"""The files git knows of a working tree, each hashed, and their provenance; unchanged files are not read again.

The files are those of `git ls-files --cached --others --exclude-standard` without the tracked files deleted from
the working tree. One `git status` tells which tracked files differ from the index; every other tracked file has the
content of its index blob, whose SHA-256 a cache beside the tree remembers (an entry is cached only after the file's
bytes were seen to hash to that blob). Files that differ from the index and untracked files are hashed through a
stat cache keyed by (size, mtime, ctime, inode), with git's rule for racily clean entries.
"""

from __future__ import annotations

import hashlib
import marshal
import os
import stat
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from simrun_core.errors import InvalidArgument
from simrun_core.snapshots.model import FileEntry, content_id, validate_files
from simrun_runtime.record import Provenance

_READ_BYTES = 1 << 20
_CACHE_VERSION = 1
# File times come from the kernel's coarse clock, up to a tick behind time.time_ns(): keep a margin.
_RACY_SLACK_NS = 50_000_000
_GITLINK = "160000"
_SYMLINK = "120000"
_EXECUTABLE = "100755"
_HASH_THREADS = 4


class TreeScan:
    """A hashed working tree.

    Attributes:
        root: the tree's folder, absolute.
        provenance: branch, commit, changed files (relative to `root`) and whether the tree is dirty.
        snapshot_id: the content id a snapshot of these files has.
        files_read: files whose bytes this scan read (0 for an unchanged tree whose cache is warm).
    """

    def __init__(
        self,
        root: Path,
        provenance: Provenance,
        snapshot_id: str,
        files_read: int,
        files: list[FileEntry] | None = None,
        build: Callable[[], tuple[list[FileEntry], int]] | None = None,
    ) -> None:
        self.root = root
        self.provenance = provenance
        self.snapshot_id = snapshot_id
        self.files_read = files_read
        self._files = files
        self._build = build

    @property
    def files(self) -> list[FileEntry]:
        """The tree's files sorted by path, validated (no symlink leads out of the tree)."""
        if self._files is None:
            assert self._build is not None
            self._files, read = self._build()
            self.files_read += read
        return self._files


def default_cache_dir() -> Path:
    """`$XDG_CACHE_HOME/simrun/stat-cache` (`~/.cache/simrun/stat-cache` without it)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "simrun" / "stat-cache"


def scan_tree(tree: Path, cache_dir: Path | None = None) -> TreeScan:
    """Lists and hashes the files git knows of the working tree at `tree` (its top level or a folder in it).

    Raises:
        InvalidArgument: `tree` is not a folder of a git working tree, or a symlink in it leads out of it.
    """
    started_ns = time.time_ns()
    root = Path(tree).resolve()
    if not root.is_dir():
        raise InvalidArgument(f"{tree} is not a folder")
    # Three git processes at once: the unchanged tree costs about one `git status`.
    prefix_proc = _spawn_git(root, "rev-parse", "--is-inside-work-tree", "--show-prefix")
    status_proc = _spawn_git(
        root, "status", "--porcelain=v2", "-z", "--branch", "--untracked-files=all", "--no-renames", "--", "."
    )
    index_proc = _spawn_git(root, "ls-files", "-z", "--stage", "--full-name", "--", ".")
    prefix_out = prefix_proc.communicate()[0]
    status_out, status_err = status_proc.communicate()
    index_out, index_err = index_proc.communicate()
    prefix = _work_tree_prefix(root, prefix_proc.returncode, prefix_out)
    _check(status_proc, status_err, "git status")
    _check(index_proc, index_err, "git ls-files")
    status = _parse_status(status_out, prefix)
    provenance = Provenance(
        branch=status.branch, commit=status.commit, changed_files=status.changed, dirty=bool(status.changed)
    )
    folder = cache_dir or default_cache_dir()
    memo = _Memo.load(folder, root)
    key = _listing_key(prefix, index_out, status_out, memo.disk_entries(root, status, started_ns))
    if key is not None and key == memo.key and memo.snapshot_id:
        # Same index, same status, same stat of every file git says differs: the same files as last time.
        def build() -> tuple[list[FileEntry], int]:
            files, read, _ = _build(root, prefix, index_out, status, folder, started_ns)
            return files, read

        return TreeScan(root, provenance, memo.snapshot_id, 0, build=build)
    files, read, disk = _build(root, prefix, index_out, status, folder, started_ns)
    snapshot_id = content_id(files)
    memo.save(started_ns, _listing_key(prefix, index_out, status_out, disk), snapshot_id, disk)
    return TreeScan(root, provenance, snapshot_id, read, files=files)


def _build(
    root: Path, prefix: str, index_out: bytes, status: _Status, cache_dir: Path, started_ns: int
) -> tuple[list[FileEntry], int, dict[str, tuple]]:
    """The tree's files from git's listing and the caches; returns them, the files read, and the disk entries."""
    cache = _Cache.load(cache_dir, root)
    work: list[tuple[str, str | None, str | None]] = []  # (path, index mode or None, index oid or None)
    for record in index_out.split(b"\0"):
        if not record:
            continue
        meta, _, raw_path = record.partition(b"\t")
        git_mode, git_oid, stage = meta.decode().split(" ")
        path = _relative(raw_path, prefix)
        if git_mode == _GITLINK or path in status.deleted:
            continue
        if stage != "0" or path in status.modified:
            work.append((path, None, None))
        else:
            work.append((path, git_mode, git_oid))
    work.extend((path, None, None) for path in status.untracked)

    entries: dict[str, FileEntry] = {}
    to_read: list[tuple[str, str | None, str | None]] = []
    for path, mode, oid in work:
        if path in entries:
            continue  # an unmerged path is listed once per stage
        if mode == _SYMLINK:
            entries[path] = _symlink(root, path)
            continue
        if oid is not None:
            known = cache.blobs.get(oid)
            if known is not None:
                entries[path] = FileEntry(path, known[0], known[1], mode == _EXECUTABLE)
                continue
        else:
            entry = _from_stat_cache(root, path, cache.stats, started_ns, cache.written_ns)
            if entry is not None:
                cache.keep(path, cache.stats[path])
                entries[path] = entry
                continue
        to_read.append((path, mode, oid))
    for path, entry in _read_all(root, to_read, cache).items():
        if entry is not None:
            entries[path] = entry

    files = validate_files(entries.values())
    disk_paths = {p for p, m, _ in work if m is None}
    cache.save(started_ns, keep_paths=disk_paths, keep_blobs={o for _, _, o in work if o})
    disk = {p: _disk_key(entries[p], cache) for p in sorted(disk_paths) if p in entries}
    return files, len(to_read), disk


def _disk_key(entry: FileEntry, cache: _Cache) -> tuple:
    """What the memo keeps of a file git says differs: its stat and hash, or its symlink target."""
    if entry.is_symlink:
        return ("l", entry.symlink_target)
    known = cache.kept(entry.path)
    return ("f", *known) if known is not None else ("?", entry.sha256)


def _listing_key(prefix: str, index_out: bytes, status_out: bytes, disk: dict[str, tuple] | None) -> str | None:
    """A hash of everything the listing follows from: git's index and status, and the files that differ."""
    if disk is None or any(v[0] == "?" for v in disk.values()):
        return None
    body = b"\0".join(r for r in status_out.split(b"\0") if not r.startswith(b"#"))
    digest = hashlib.sha256(f"{_CACHE_VERSION}\0{prefix}\0".encode())
    digest.update(index_out)
    digest.update(b"\0\0")
    digest.update(body)
    digest.update(repr(sorted(disk.items())).encode())
    return digest.hexdigest()


@dataclass
class _Status:
    branch: str | None
    commit: str | None
    changed: list[str]
    modified: set[str]
    deleted: set[str]
    untracked: list[str]


def _parse_status(out: bytes, prefix: str) -> _Status:
    status = _Status(None, None, [], set(), set(), [])
    for record in out.split(b"\0"):
        if not record:
            continue
        kind = record[:1]
        if kind == b"#":
            _, key, value = record.decode().split(" ", 2)
            if key == "branch.oid" and value != "(initial)":
                status.commit = value
            elif key == "branch.head" and value != "(detached)":
                status.branch = value
        elif kind == b"?":
            path = _relative(record[2:], prefix)
            if not path.endswith("/"):  # a nested repository: its files are not this tree's
                status.untracked.append(path)
            status.changed.append(path)
        elif kind in (b"1", b"u"):
            fields = 9 if kind == b"1" else 11
            parts = record.split(b" ", fields - 1)
            path = _relative(parts[-1], prefix)
            worktree = parts[1][1:2]
            if worktree == b"D":
                status.deleted.add(path)
            elif worktree != b"." or kind == b"u":
                status.modified.add(path)
            status.changed.append(path)
    status.changed.sort()
    return status


def _relative(raw: bytes, prefix: str) -> str:
    try:
        path = raw.decode()
    except UnicodeDecodeError:
        raise InvalidArgument(f"the path {raw!r} is not valid UTF-8: rename it") from None
    return path[len(prefix) :] if prefix and path.startswith(prefix) else path


def _work_tree_prefix(root: Path, returncode: int, out: bytes) -> str:
    lines = out.decode().splitlines()
    if returncode != 0 or not lines or lines[0] != "true":
        raise InvalidArgument(f"{root} is not a git working tree: run `git init` there or snapshot a checkout")
    return lines[1] if len(lines) > 1 else ""


def _spawn_git(root: Path, *args: str) -> subprocess.Popen[bytes]:
    try:
        return subprocess.Popen(
            ["git", "-c", "core.quotepath=off", *args], cwd=root, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
    except FileNotFoundError as exc:
        raise InvalidArgument("git is not installed: simrun snapshots git working trees") from exc


def _check(proc: subprocess.Popen[bytes], err: bytes, what: str) -> None:
    if proc.returncode != 0:
        raise InvalidArgument(f"{what} failed: {err.decode(errors='replace').strip()}")


def _symlink(root: Path, path: str) -> FileEntry:
    return FileEntry.symlink(path, os.readlink(root / path))


def _from_stat_cache(
    root: Path, path: str, stats: dict[str, tuple], started_ns: int, written_ns: int
) -> FileEntry | None:
    """The cached entry of a regular file whose stat is unchanged and not racily clean; None otherwise."""
    known = stats.get(path)
    if known is None:
        return None
    try:
        st = os.lstat(root / path)
    except FileNotFoundError:
        return None
    size, mtime_ns, ctime_ns, inode, executable, sha256 = known
    if (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino) != (size, mtime_ns, ctime_ns, inode):
        return None
    if not stat.S_ISREG(st.st_mode) or bool(st.st_mode & stat.S_IXUSR) != executable:
        return None
    if mtime_ns >= written_ns - _RACY_SLACK_NS:
        return None  # racily clean: it may have changed in the tick the cache was written in
    return FileEntry(path, sha256, size, executable)


def _read_all(root: Path, work: list[tuple[str, str | None, str | None]], cache: _Cache) -> dict[str, FileEntry | None]:
    if len(work) < 2 * _HASH_THREADS:
        return {path: _read(root, path, mode, oid, cache) for path, mode, oid in work}
    with ThreadPoolExecutor(_HASH_THREADS) as pool:
        results = pool.map(lambda w: _read(root, w[0], w[1], w[2], cache), work)
        return {w[0]: entry for w, entry in zip(work, results, strict=True)}


def _read(root: Path, path: str, mode: str | None, oid: str | None, cache: _Cache) -> FileEntry | None:
    """Hashes a file; None for one gone since git listed it, or a folder (a nested repository)."""
    full = root / path
    try:
        fd = os.open(full, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if os.path.islink(full):
            return FileEntry.symlink(path, os.readlink(full))
        raise InvalidArgument(f"cannot read {path!r}: {exc.strerror}") from exc
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            return None
        digest = hashlib.sha256()
        blob = hashlib.new("sha256" if oid is not None and len(oid) == 64 else "sha1")
        blob.update(b"blob %d\0" % st.st_size)
        size = 0
        while block := f.read(_READ_BYTES):
            digest.update(block)
            blob.update(block)
            size += len(block)
    sha256 = digest.hexdigest()
    executable = mode == _EXECUTABLE if oid is not None else bool(st.st_mode & stat.S_IXUSR)
    if oid is not None:
        if blob.hexdigest() == oid and size == st.st_size:
            cache.learn_blob(oid, sha256, size)
    else:
        cache.learn_stat(path, (size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, executable, sha256))
    return FileEntry(path, sha256, size, executable)


class _Cache:
    """The hashes a tree's previous scans learned: index blobs by id, other files by path and stat."""

    def __init__(
        self, file: Path, root: Path, blobs: dict[str, tuple[str, int]], stats: dict[str, tuple], written_ns: int
    ) -> None:
        self.file = file
        self.root = root
        self.blobs = blobs
        self.stats = stats
        self.written_ns = written_ns
        self._kept: dict[str, tuple] = {}
        self._changed = False

    @classmethod
    def load(cls, folder: Path, root: Path) -> _Cache:
        file = folder / (hashlib.sha256(str(root).encode()).hexdigest()[:32] + ".marshal")
        try:
            data = marshal.loads(file.read_bytes())
            if data["version"] == _CACHE_VERSION and data["root"] == str(root):
                return cls(file, root, data["blobs"], data["stats"], data["written_ns"])
        except (OSError, ValueError, EOFError, TypeError, KeyError):
            pass
        return cls(file, root, {}, {}, 0)

    def keep(self, path: str, known: tuple) -> None:
        self._kept[path] = known

    def kept(self, path: str) -> tuple | None:
        return self._kept.get(path)

    def learn_blob(self, oid: str, sha256: str, size: int) -> None:
        self.blobs[oid] = (sha256, size)
        self._changed = True

    def learn_stat(self, path: str, known: tuple) -> None:
        self._kept[path] = known
        self._changed = True

    def save(self, started_ns: int, keep_paths: set[str], keep_blobs: set[str]) -> None:
        """Writes the cache when this scan learned or forgot something; entries of files gone are dropped."""
        stats = {p: v for p, v in self._kept.items() if p in keep_paths}
        blobs = {o: v for o, v in self.blobs.items() if o in keep_blobs}
        if not self._changed and stats.keys() == self.stats.keys() and len(blobs) == len(self.blobs):
            return
        data = {"version": _CACHE_VERSION, "root": str(self.root), "blobs": blobs, "stats": stats}
        data["written_ns"] = started_ns
        try:
            self.file.parent.mkdir(parents=True, exist_ok=True)
            temp = self.file.with_name(f".{self.file.name}.{os.getpid()}.{time.monotonic_ns()}")
            temp.write_bytes(marshal.dumps(data))
            os.replace(temp, self.file)
        except OSError:
            pass  # a cache that cannot be written costs time, not correctness


class _Memo:
    """The listing key and snapshot id of a tree's last scan, with the stat of the files git said differ.

    It lets the scan of an unchanged tree skip building its listing: the same index, the same status and the
    same stat of those files give the same files.
    """

    def __init__(
        self, file: Path, root: Path, key: str | None, snapshot_id: str, stats: dict[str, tuple], written_ns: int
    ) -> None:
        self.file = file
        self.root = root
        self.key = key
        self.snapshot_id = snapshot_id
        self.stats = stats
        self.written_ns = written_ns

    @classmethod
    def load(cls, folder: Path, root: Path) -> _Memo:
        file = folder / (hashlib.sha256(str(root).encode()).hexdigest()[:32] + ".last")
        try:
            data = marshal.loads(file.read_bytes())
            if data["version"] == _CACHE_VERSION and data["root"] == str(root):
                return cls(file, root, data["key"], data["snapshot_id"], data["stats"], data["written_ns"])
        except (OSError, ValueError, EOFError, TypeError, KeyError):
            pass
        return cls(file, root, None, "", {}, 0)

    def disk_entries(self, root: Path, status: _Status, started_ns: int) -> dict[str, tuple] | None:
        """The memo's view of the files git says differ, if each still has its stat; None otherwise."""
        if self.key is None:
            return None
        disk: dict[str, tuple] = {}
        for path in sorted(status.modified.union(status.untracked)):
            try:
                st = os.lstat(root / path)
            except FileNotFoundError:
                continue
            if stat.S_ISLNK(st.st_mode):
                disk[path] = ("l", os.readlink(root / path))
                continue
            if not stat.S_ISREG(st.st_mode):
                continue
            entry = _from_stat_cache(root, path, self.stats, started_ns, self.written_ns)
            if entry is None:
                return None
            disk[path] = ("f", *self.stats[path])
        return disk

    def save(self, started_ns: int, key: str | None, snapshot_id: str, disk: dict[str, tuple]) -> None:
        stats = {p: v[1:] for p, v in disk.items() if v[0] == "f"}
        if (key, snapshot_id, stats) == (self.key, self.snapshot_id, self.stats):
            return
        data = {
            "version": _CACHE_VERSION,
            "root": str(self.root),
            "key": key,
            "snapshot_id": snapshot_id,
            "stats": stats,
            "written_ns": started_ns,
        }
        try:
            self.file.parent.mkdir(parents=True, exist_ok=True)
            temp = self.file.with_name(f".{self.file.name}.{os.getpid()}.{time.monotonic_ns()}")
            temp.write_bytes(marshal.dumps(data))
            os.replace(temp, self.file)
        except OSError:
            pass  # a cache that cannot be written costs time, not correctness
