"""Atomic writes: a file of the store appears whole or not at all (written aside, then renamed); and the files of a
folder written aside, which appears whole when it is renamed into place."""

from __future__ import annotations

import contextlib
import json
import os
import threading
from pathlib import Path
from typing import Any


def write_bytes_atomic(path: Path, data: bytes, *, durable: bool = True, writer: str = "") -> None:
    """Writes `data` to a temporary file beside `path`, flushes it, and renames it over `path`.

    `durable=False` skips the fsync: the file is still whole or absent to every reader and across a crash of the
    writer, but a power cut may lose the new version (for state that is recomputed anyway). A failed write removes
    its temporary file. `writer` names the writer among machines that share the folder (a pod of a task: process
    ids repeat from one container to the next).
    """
    # Unique per process and thread: two threads of a server may write the same file at once.
    tmp = path.with_name(f".{path.name}.tmp-{writer}{'-' if writer else ''}{os.getpid()}-{threading.get_ident()}")
    # Created, never opened: a link planted at its name (a task's folder is its pods' to write) is not written through.
    try:
        fd = os.open(tmp, _NEW_FILE, 0o666)
    except FileNotFoundError:  # a new folder: made here, rather than checked before every write
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(tmp, _NEW_FILE, 0o666)
    except FileExistsError:  # left by a writer that died, or planted: removed (a link itself, not its target)
        os.unlink(tmp)
        fd = os.open(tmp, _NEW_FILE, 0o666)
    try:
        _write_fd(fd, data, durable)
        os.replace(tmp, path)
    except BaseException:
        _unlink_quietly(tmp)
        raise


def write_bytes_new(path: Path, data: bytes) -> None:
    """Creates `path` with `data`, without fsync, in a folder nobody reads until it is renamed into place (a run
    written aside): no temporary file and rename, which only a file others may read needs. Refuses a name that
    exists (a link too); a failed write removes the file."""
    fd = os.open(path, _NEW_FILE, 0o666)
    try:
        _write_fd(fd, data, durable=False)
    except BaseException:
        _unlink_quietly(path)
        raise


_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC


def _write_fd(fd: int, data: bytes, durable: bool) -> None:
    """Writes all of `data` to a new file's descriptor, fsyncs it if `durable`, and closes it.

    On the descriptor, not through a file object: opening one costs three more system calls (its size, whether it
    is a terminal, its position), and every system call lets the interpreter's lock go to another thread, which a
    server under concurrent submissions pays in hand-overs."""
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)


def _unlink_quietly(path: Path) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


def fsync_file(path: Path) -> None:
    """Flushes a file written with `durable=False` to the disk (a link at its name is refused, not followed)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json_atomic(path: Path, data: Any, *, sort_keys: bool = True, durable: bool = True) -> None:
    """Writes `data` as indented JSON, atomically; keys sorted unless their order means something."""
    write_bytes_atomic(path, json_bytes(data, sort_keys=sort_keys), durable=durable)


def json_bytes(data: Any, *, sort_keys: bool = True) -> bytes:
    """`data` as the store writes JSON: indented, keys sorted unless their order means something, a final newline."""
    return (json.dumps(data, indent=2, sort_keys=sort_keys) + "\n").encode()


def read_json(path: Path) -> Any:
    """Reads a JSON file of the store."""
    return json.loads(path.read_text())
