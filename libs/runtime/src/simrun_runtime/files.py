"""Atomic writes: a file of the store appears whole or not at all (written aside, then renamed)."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any


def write_bytes_atomic(path: Path, data: bytes, *, durable: bool = True) -> None:
    """Writes `data` to a temporary file beside `path`, flushes it, and renames it over `path`.

    `durable=False` skips the fsync: the file is still whole or absent to every reader and across a crash of the
    writer, but a power cut may lose the new version (for state that is recomputed anyway).
    """
    # Unique per process and thread: two threads of a server may write the same file at once.
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{threading.get_ident()}")
    # Created, never opened: a link planted at its name (a task's folder is its pods' to write) is not written through.
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
    try:
        fd = os.open(tmp, flags, 0o666)
    except FileNotFoundError:  # a new folder: made here, rather than checked before every write
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(tmp, flags, 0o666)
    except FileExistsError:  # left by a writer that died, or planted: removed (a link itself, not its target)
        os.unlink(tmp)
        fd = os.open(tmp, flags, 0o666)
    with open(fd, "wb") as f:
        f.write(data)
        f.flush()
        if durable:
            os.fsync(f.fileno())
    os.replace(tmp, path)


def fsync_file(path: Path) -> None:
    """Flushes a file written with `durable=False` to the disk (a link at its name is refused, not followed)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json_atomic(path: Path, data: Any, *, sort_keys: bool = True, durable: bool = True) -> None:
    """Writes `data` as indented JSON, atomically; keys sorted unless their order means something."""
    write_bytes_atomic(path, (json.dumps(data, indent=2, sort_keys=sort_keys) + "\n").encode(), durable=durable)


def read_json(path: Path) -> Any:
    """Reads a JSON file of the store."""
    return json.loads(path.read_text())
