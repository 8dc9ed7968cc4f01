"""The ledger of a split task (`tasks/<task>/units/`): pending, claimed and done units, heartbeats, unit results.

Every transition of a unit is one `os.rename`, atomic on a local file system and on NFS v4.1 or newer, so a
unit is held by at most one worker:

    pending/<i>  --claim-->  claimed/<i>@<worker>  --done-->  done/<i>
                 <--release--

A unit's results are written in `tmp/` and renamed to `results/<i>/`; a second computation of the same unit
finds its rename refused and discards its copy, which is harmless since a unit's output depends on the
settings and its index only.
"""

from __future__ import annotations

import errno
import os
import shutil
import time
import uuid
import zlib
from collections import defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from simrun_runtime.files import write_bytes_atomic
from simrun_runtime.layout import LedgerLayout, TaskLayout

# The concepts page: claims of a worker whose heartbeat is older than the grace period plus a minute are stale.
STALE_MARGIN_S = 60.0
# ext4 allows 65,000 links to one file.
LINKS_PER_SEED = 50_000


class LedgerError(Exception):
    """A ledger which is not in a state it can be used in; the message says what is wrong."""


def create_ledger(task: TaskLayout, count: int) -> bool:
    """Creates the ledger of `task` with `count` pending units, atomically: a complete `units/` appears, or none.

    Built in a temporary directory beside `units/` (its `count` written last) and renamed to it; whoever gets
    there first wins and a loser discards its build. Returns whether this call created the ledger.
    """
    if count < 1:
        raise LedgerError(f"a ledger needs at least one unit, not {count}")
    units = task.units
    if units.count_file.exists():
        return False
    build = LedgerLayout(task.units_building(uuid.uuid4().hex[:12]))
    build.root.mkdir(parents=True)
    try:
        for directory in (build.pending, build.claimed, build.done, build.heartbeats, build.results, build.tmp):
            directory.mkdir()
        _fill_pending(build, count)
        write_bytes_atomic(build.count_file, f"{count}\n".encode())
        os.rename(build.root, units.root)
    except OSError as exc:
        shutil.rmtree(build.root, ignore_errors=True)
        if exc.errno in (errno.ENOTEMPTY, errno.EEXIST) and units.root.exists():
            if not units.count_file.exists():
                raise LedgerError(f"{units.root} exists but is not a ledger (no {units.count_file.name})") from exc
            return False
        raise
    return True


def _fill_pending(build: LedgerLayout, count: int) -> None:
    """Creates `pending/0` … `pending/<count-1>` as hard links to a few empty files: a link costs a directory
    entry, a new file an inode too, which on some file systems is twenty times dearer."""
    pending = str(build.pending)
    seed = ""
    for index in range(count):
        if index % LINKS_PER_SEED == 0:
            seed = str(build.root / f"seed-{index}")
            os.close(os.open(seed, os.O_CREAT | os.O_WRONLY, 0o644))
        try:
            os.link(seed, f"{pending}/{index}")
        except OSError as exc:
            if exc.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.EMLINK, errno.EXDEV):
                raise
            # A file system without hard links (or with fewer than we assumed): plain empty files.
            os.close(os.open(f"{pending}/{index}", os.O_CREAT | os.O_WRONLY, 0o644))
    for path in build.root.glob("seed-*"):
        path.unlink()


def worker_offset(worker: str, count: int) -> int:
    """Where a worker starts walking the indices: spread by the golden ratio so pods start far apart."""
    if worker.startswith("w") and worker[1:].isdigit():
        fraction = (int(worker[1:]) * 0.6180339887498949) % 1.0
    else:
        fraction = (zlib.crc32(worker.encode()) % 1_000_003) / 1_000_003
    return int(fraction * count) % count


@dataclass
class Ledger:
    """One task's ledger; all state is in the files, so any number of pods may hold one."""

    layout: LedgerLayout
    _count: int | None = field(default=None, init=False, repr=False)

    @classmethod
    def of(cls, task: TaskLayout) -> Ledger:
        return cls(task.units)

    def exists(self) -> bool:
        return self.layout.count_file.exists()

    @property
    def count(self) -> int:
        """The number of units, as written when the ledger was created."""
        if self._count is None:
            try:
                self._count = int(self.layout.count_file.read_text().strip())
            except FileNotFoundError:
                raise LedgerError(f"no ledger at {self.layout.root}") from None
        return self._count

    def wait(self, stopping: Callable[[], bool], poll_s: float = 0.2, max_poll_s: float = 2.0) -> bool:
        """Waits until the ledger exists (True) or `stopping()` says to give up (False)."""
        delay = poll_s
        while not self.exists():
            if stopping():
                return False
            time.sleep(delay)
            delay = min(delay * 1.5, max_poll_s)
        return True

    def claimer(self, worker: str) -> Claimer:
        return Claimer(self, worker)

    def claim(self, index: int, worker: str) -> bool:
        """Claims unit `index` for `worker`: one rename, refused if it is not pending."""
        try:
            os.rename(self.layout.pending_unit(index), self.layout.claimed_unit(index, worker))
        except FileNotFoundError:
            return False
        return True

    def release(self, index: int, worker: str) -> bool:
        """Gives a claim back to pending; False if the claim was no longer held."""
        try:
            os.rename(self.layout.claimed_unit(index, worker), self.layout.pending_unit(index))
        except FileNotFoundError:
            return False
        return True

    def mark_done(self, index: int, worker: str) -> bool:
        """Marks a claimed unit done; False if the claim had been released meanwhile (its result is in place)."""
        try:
            os.rename(self.layout.claimed_unit(index, worker), self.layout.done_unit(index))
        except FileNotFoundError:
            return False
        return True

    def claims(self) -> dict[str, list[int]]:
        """Every claim, by worker (one listing of `claimed/`)."""
        held: dict[str, list[int]] = defaultdict(list)
        with os.scandir(self.layout.claimed) as entries:
            for entry in entries:
                index, sep, worker = entry.name.partition("@")
                if sep and index.isdigit():
                    held[worker].append(int(index))
        return {worker: sorted(indices) for worker, indices in held.items()}

    def own_claims(self, worker: str) -> list[int]:
        """The claims `worker` holds, e.g. an earlier incarnation's, which a restarted worker takes back."""
        return self.claims().get(worker, [])

    def has_claims(self) -> bool:
        with os.scandir(self.layout.claimed) as entries:
            return next(entries, None) is not None

    def has_pending(self) -> bool:
        with os.scandir(self.layout.pending) as entries:
            return next(entries, None) is not None

    def missing(self) -> list[int]:
        """Units neither pending, claimed nor done (none, unless someone removed files of the ledger)."""
        with os.scandir(self.layout.done) as entries:
            seen = {int(entry.name) for entry in entries if entry.name.isdigit()}
        seen.update(self.pending_indices())
        seen.update(index for indices in self.claims().values() for index in indices)
        return sorted(set(range(self.count)) - seen)

    def pending_indices(self) -> list[int]:
        with os.scandir(self.layout.pending) as entries:
            return sorted(int(entry.name) for entry in entries if entry.name.isdigit())

    def done_count(self) -> int:
        with os.scandir(self.layout.done) as entries:
            return sum(1 for entry in entries if entry.name.isdigit())

    def is_complete(self) -> bool:
        """Every unit is done."""
        return self.done_count() >= self.count

    def touch_heartbeat(self, worker: str) -> None:
        path = self.layout.heartbeat(worker)
        try:
            os.utime(path)
        except FileNotFoundError:
            path.touch()

    def remove_heartbeat(self, worker: str) -> None:
        self.layout.heartbeat(worker).unlink(missing_ok=True)

    def heartbeat_age(self, worker: str, now: float | None = None) -> float | None:
        """Seconds since `worker` last touched its heartbeat, None if it has none."""
        try:
            mtime = self.layout.heartbeat(worker).stat().st_mtime
        except FileNotFoundError:
            return None
        return (time.time() if now is None else now) - mtime

    def release_stale(self, grace_s: float, exclude: str, now: float | None = None) -> list[tuple[int, str]]:
        """Releases the claims of every other worker whose heartbeat is older than the grace period plus a
        minute (or missing): they died without releasing them. Returns the released (unit, worker) pairs."""
        released: list[tuple[int, str]] = []
        for worker, indices in self.claims().items():
            if worker == exclude:
                continue
            age = self.heartbeat_age(worker, now)
            if age is not None and age <= grace_s + STALE_MARGIN_S:
                continue
            released.extend((index, worker) for index in indices if self.release(index, worker))
        return released

    def has_result(self, index: int) -> bool:
        return self.layout.result(index).is_dir()

    def write_result(self, index: int, worker: str, fill: Callable[[Path], None]) -> bool:
        """Writes unit `index`'s results with `fill(directory)` in a temporary directory, then renames it to
        `results/<index>/`. Returns False if a copy was already in place, in which case this one is discarded."""
        tmp = self.layout.result_tmp(index, worker, os.getpid())
        try:
            tmp.mkdir()
        except FileExistsError:
            shutil.rmtree(tmp)
            tmp.mkdir()
        try:
            fill(tmp)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return self.place_result(tmp, index)

    def place_result(self, tmp: Path, index: int) -> bool:
        try:
            os.rename(tmp, self.layout.result(index))
        except OSError as exc:
            if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
            shutil.rmtree(tmp, ignore_errors=True)
            return False
        return True

    def remove_tmp(self, worker: str) -> None:
        """Removes the unfinished result directories of `worker`'s processes (e.g. of units it was stopped in)."""
        suffix = f".{worker}."
        with os.scandir(self.layout.tmp) as entries:
            for entry in entries:
                if suffix in entry.name:
                    shutil.rmtree(entry.path, ignore_errors=True)


class Claimer:
    """Claims units for one worker at a cost per unit which does not grow with the number of units.

    It walks the indices from the worker's offset trying one rename each; only when a whole pass finds
    nothing does it list `pending/` (one `os.scandir`) and try what is left, listing again once that is used up.
    """

    def __init__(self, ledger: Ledger, worker: str) -> None:
        self.ledger = ledger
        self.worker = worker
        self.count = ledger.count
        self.offset = worker_offset(worker, self.count)
        self._cursor = self.offset
        self._misses = 0
        self._scanned: deque[int] | None = None
        self._pending = str(ledger.layout.pending)
        self._claimed = str(ledger.layout.claimed)
        self.scans = 0

    def _try(self, index: int) -> bool:
        try:
            os.rename(f"{self._pending}/{index}", f"{self._claimed}/{index}@{self.worker}")
        except FileNotFoundError:
            return False
        return True

    def claim(self) -> int | None:
        """Claims one pending unit; None when none is pending."""
        if self._scanned is None:
            while self._misses < self.count:
                index = self._cursor
                self._cursor = index + 1 if index + 1 < self.count else 0
                if self._try(index):
                    self._misses = 0
                    return index
                self._misses += 1
            self._scanned = deque()
        rescanned = False
        while True:
            while self._scanned:
                index = self._scanned.popleft()
                if self._try(index):
                    return index
            if rescanned:
                return None
            self._scanned = deque(self._rescan())
            rescanned = True

    def _rescan(self) -> list[int]:
        self.scans += 1
        pending = self.ledger.pending_indices()
        # Rotated to start at the worker's offset, so pods listing at once try different units first.
        split = next((k for k, index in enumerate(pending) if index >= self.offset), len(pending))
        return pending[split:] + pending[:split]
