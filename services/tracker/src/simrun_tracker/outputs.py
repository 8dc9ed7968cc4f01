"""The outputs of a run's tasks: the files of each output port in the store, listed and read for clients."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from simrun_core.errors import FailedPrecondition, InvalidArgument, NotFound
from simrun_runtime.layout import StoreLayout
from simrun_runtime.record import RunRecord, TaskState

CHUNK_BYTES = 1024 * 1024
"""Bytes of one chunk of a fetched file; well under the gRPC message limit."""

_PORT = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$")
"""An output port's folder name: a path component of at most 128 characters (a longer one is no port, not an
error of the file system)."""


@dataclass(frozen=True)
class OutputFile:
    """A file of an output port.

    Attributes:
        task_id: The task that wrote it.
        port: The output port.
        path: The file's path in the port's folder, `/`-separated.
        store_path: The file's path in the store, relative to the store's root.
        size_bytes: Its size in bytes.
    """

    task_id: str
    port: str
    path: str
    store_path: str
    size_bytes: int


@dataclass(frozen=True)
class Chunk:
    """A piece of a fetched file: `data` at `offset` of the file `path` (in the port's folder)."""

    path: str
    offset: int
    data: bytes
    size_bytes: int


class OutputStore:
    """Reads the output ports of tasks (`runs/<id>/tasks/<task>/out/<port>/…`) and nothing outside them.

    A symlink in an output is followed only where it leads to a file inside the task's `out/`; others are
    left out, so an output cannot hand a client files of the store or the machine.
    """

    def __init__(self, store: StoreLayout) -> None:
        self.store = store

    def list_files(self, record: RunRecord, task_id: str = "", port: str = "") -> list[OutputFile]:
        """The files of a run's output ports (of one task, of one port), by task in run order, port and path.

        Raises:
            InvalidArgument: a port given without its task, or a port name that is not one (e.g. `../x`).
            NotFound: an unknown task, or a port the task did not write.
        """
        if port and not task_id:
            raise InvalidArgument("give the task of the port")
        files: list[OutputFile] = []
        for task in self._tasks(record, task_id):
            for name in [port] if port else self._ports(record, task):
                files.extend(self._files(record, task, name))
        return files

    def fetch(self, record: RunRecord, task_id: str, port: str, chunk_bytes: int = CHUNK_BYTES) -> Iterator[Chunk]:
        """The files of one output port in chunks; an empty file is one empty chunk.

        Raises:
            InvalidArgument: no task or port given, or a port name that is not one.
            NotFound: an unknown task, or a port the task did not write.
            FailedPrecondition: the task has not succeeded, so its outputs are not complete.
        """
        if not task_id or not port:
            raise InvalidArgument("give the task and the port to fetch")
        (task,) = self._tasks(record, task_id)
        state = record.tasks[task].state
        if state is not TaskState.SUCCEEDED:
            raise FailedPrecondition(
                f"task {task!r} of run {record.run_id} is {state.value}: its outputs are complete once it succeeded"
            )
        for file in self._files(record, task, port):
            real = self._inside(record, task, self.store.root / file.store_path)
            if real is None:  # replaced by a link out since it was listed
                continue
            try:
                # No link at the last step either: what was checked is what is read, even if it was swapped since.
                fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            except OSError:
                continue
            with os.fdopen(fd, "rb") as handle:
                offset = 0
                while True:
                    data = handle.read(chunk_bytes)
                    if data or offset == 0:
                        yield Chunk(file.path, offset, data, file.size_bytes)
                    if len(data) < chunk_bytes:
                        break
                    offset += len(data)

    def _tasks(self, record: RunRecord, task_id: str) -> list[str]:
        if not task_id:
            return list(record.tasks)
        if task_id not in record.tasks:
            known = ", ".join(record.tasks) or "none"
            raise NotFound(f"run {record.run_id} has no task {task_id!r}; its tasks: {known}")
        return [task_id]

    def _ports(self, record: RunRecord, task_id: str) -> list[str]:
        out = self.store.run(record.run_id).task(task_id).out
        if not out.is_dir():
            return []
        return sorted(p.name for p in out.iterdir() if p.is_dir() and not p.is_symlink() and _PORT.match(p.name))

    def _files(self, record: RunRecord, task_id: str, port: str) -> list[OutputFile]:
        if not _PORT.match(port):
            raise InvalidArgument(f"{port[:64]!r} is not an output port name: 1-128 letters, digits, '.', '_' or '-'")
        folder = self.store.run(record.run_id).task(task_id).out_port(port)
        if not folder.is_dir() or folder.is_symlink():
            ports = ", ".join(self._ports(record, task_id)) or "none yet"
            raise NotFound(f"task {task_id!r} of run {record.run_id} has no output {port!r}; its outputs: {ports}")
        files = []
        for parent, dirs, names in os.walk(folder, followlinks=False):
            dirs.sort()
            for name in sorted(names):
                path = Path(parent) / name
                real = self._inside(record, task_id, path)
                if real is None or not real.is_file():
                    continue
                files.append(
                    OutputFile(
                        task_id=task_id,
                        port=port,
                        path=path.relative_to(folder).as_posix(),
                        store_path=path.relative_to(self.store.root).as_posix(),
                        size_bytes=real.stat().st_size,
                    )
                )
        return files

    def _inside(self, record: RunRecord, task_id: str, path: Path) -> Path | None:
        """The real file `path` stands for, None where it (or a link on the way) leads out of the task's out/."""
        out = self.store.run(record.run_id).task(task_id).out.resolve()
        try:
            real = path.resolve(strict=True)
        except (OSError, RuntimeError):
            return None
        return real if real.is_relative_to(out) else None
