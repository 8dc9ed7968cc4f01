"""One server per home and per store: an exclusive lock a second server finds taken, naming the first's pid."""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

from simrun_core.errors import FailedPrecondition

LOCK_NAME = ".server.lock"


class HomeLock:
    """Holds `flock` locks on `<folder>/.server.lock` of each folder given, for as long as the server runs.

    Two trackers over one store would both drive its runs and disagree; the kernel drops the lock when the
    process dies, so a crashed server leaves nothing to clean up.

    Raises:
        FailedPrecondition: another server holds one of the locks (its pid in the message).
    """

    def __init__(self, *folders: Path, names: tuple[str, ...] = ("home", "store")) -> None:
        """`folders` in order, named in a refusal by `names` (the home, then the store)."""
        self._fds: list[int] = []
        try:
            taken: set[Path] = set()
            for folder, what in zip(folders, (*names, *(["folder"] * len(folders))), strict=False):
                if folder not in taken:
                    taken.add(folder)
                    self._take(folder, what)
        except BaseException:
            self.release()
            raise

    def _take(self, folder: Path, what: str) -> None:
        path = folder / LOCK_NAME
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise FailedPrecondition(
                f"another simrun server (pid {holder}) uses the {what} {folder}: "
                f"stop it, or give this one another {what}"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fds.append(fd)

    def release(self) -> None:
        """Lets another server take the folders."""
        for fd in self._fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds.clear()
