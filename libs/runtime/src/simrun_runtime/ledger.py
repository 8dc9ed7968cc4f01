"""The ledger of a split task (`tasks/<task>/units/`): pending, claimed, done and failed units, heartbeats, results.

An entry of the ledger names a range of consecutive units, `<first>-<last>` (both included), or one unit, `<i>`;
a unit that failed carries its failures so far, `<i>~<n>`. Every transition is one `os.rename`, atomic on a local
file system and on NFS v4.1 or newer, so a unit is held by at most one worker:

    pending/<r>  --claim-->  claimed/<r>@<worker>  --done-->  done/<r>
                 <--release--                       --fail-->  failed/<i>~<n>   (past its retries)

A worker claims a whole pending range with one rename and, when it wants fewer units, splits its claim in two
(a hard link to a second claimed name of its own, then a rename of the first to its shorter name) and releases
the rest (one rename): at every moment each unit is held by at most one worker, and a range two claimed names of
one worker overlap on is given back once. A ledger written before ranges (one entry per unit) is the special
case of ranges of one unit and completes and merges as it is.

A claim's results are in place before its done rename: the values its units returned as one line of its pool
process's log, `results/<worker>.<process>.jsonl` (one file per process, not per unit or claim), and the files
of units that wrote files written in `tmp/` and renamed to `results/<i>/`. A second computation of the same
units adds a line with the same values, or finds its rename refused and discards its files, which is harmless
since a unit's output depends on the settings and its index only.
"""

from __future__ import annotations

import bisect
import contextlib
import errno
import json
import os
import shutil
import time
import uuid
import zlib
from collections import defaultdict, deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from simrun_runtime.files import write_bytes_atomic
from simrun_runtime.layout import VALUES_SUFFIX, LedgerLayout, TaskLayout

# The concepts page: claims of a worker whose heartbeat is older than the grace period plus a minute are stale.
STALE_MARGIN_S = 60.0
# A unit a worker failed is left this long to other live workers before it tries the unit again itself.
RETRY_ELSEWHERE_S = 10.0
# Pending ranges a new ledger starts with, at most: enough for many pods to start on different ranges, few
# enough that a ledger of a million units is a few hundred files.
BLOCKS = 64
# The largest range a new ledger starts with; a claim never spans two ranges, so this bounds a claim too.
MAX_BLOCK = 1024


class LedgerError(Exception):
    """A ledger which is not in a state it can be used in; the message says what is wrong."""


@dataclass(frozen=True, order=True)
class UnitRange:
    """Consecutive units `first` … `last` of a ledger entry; `failures` counts the failed attempts of a one-unit
    entry that is being retried."""

    first: int
    last: int
    failures: int = 0

    @classmethod
    def one(cls, index: int, failures: int = 0) -> UnitRange:
        return cls(index, index, failures)

    @classmethod
    def parse(cls, name: str) -> UnitRange | None:
        """`<first>[-<last>][~<failures>]`, None for a name that is no entry (a temporary file)."""
        body, sep, failures = name.partition("~")
        if sep and not failures.isdigit():
            return None
        first, dash, last = body.partition("-")
        if not first.isdigit() or (dash and not last.isdigit()):
            return None
        a, b = int(first), int(last) if dash else int(first)
        if b < a:
            return None
        return cls(a, b, int(failures) if sep else 0)

    @property
    def name(self) -> str:
        body = str(self.first) if self.first == self.last else f"{self.first}-{self.last}"
        return f"{body}~{self.failures}" if self.failures else body

    @property
    def size(self) -> int:
        return self.last - self.first + 1

    def indices(self) -> range:
        return range(self.first, self.last + 1)

    def split(self, at: int) -> tuple[UnitRange, UnitRange]:
        """`first … at-1` and `at … last`."""
        if not self.first < at <= self.last:
            raise ValueError(f"cannot split {self.name} at {at}")
        return UnitRange(self.first, at - 1), UnitRange(at, self.last)


def as_range(unit: int | UnitRange) -> UnitRange:
    return unit if isinstance(unit, UnitRange) else UnitRange.one(unit)


class IntervalSet:
    """Disjoint sorted ranges of unit indices: counts the distinct units of overlapping ranges without a set of
    every index."""

    def __init__(self) -> None:
        self._starts: list[int] = []
        self._ends: list[int] = []  # inclusive
        self.total = 0

    def add(self, first: int, last: int) -> None:
        i = bisect.bisect_left(self._ends, first - 1)
        j = i
        while j < len(self._starts) and self._starts[j] <= last + 1:
            first = min(first, self._starts[j])
            last = max(last, self._ends[j])
            self.total -= self._ends[j] - self._starts[j] + 1
            j += 1
        self._starts[i:j] = [first]
        self._ends[i:j] = [last]
        self.total += last - first + 1

    def ranges(self) -> Iterator[tuple[int, int]]:
        return zip(self._starts, self._ends, strict=True)

    def __contains__(self, index: int) -> bool:
        i = bisect.bisect_left(self._ends, index)
        return i < len(self._starts) and self._starts[i] <= index


def block_size(count: int) -> int:
    """Units per pending range of a new ledger: one for small ledgers (one unit per entry, as before ranges)."""
    return max(1, min(MAX_BLOCK, count // BLOCKS))


def create_ledger(task: TaskLayout, count: int, block: int | None = None) -> bool:
    """Creates the ledger of `task` with `count` pending units, atomically: a complete `units/` appears, or none.

    Built in a temporary directory beside `units/` (its `count` written last) and renamed to it; whoever gets
    there first wins and a loser discards its build. The units are pending in ranges of `block` units (default
    `block_size(count)`). Returns whether this call created the ledger.
    """
    if count < 1:
        raise LedgerError(f"a ledger needs at least one unit, not {count}")
    units = task.units
    if units.count_file.exists():
        return False
    build = LedgerLayout(task.units_building(uuid.uuid4().hex[:12]))
    build.root.mkdir(parents=True)
    try:
        for directory in (
            build.pending,
            build.claimed,
            build.done,
            build.failed,
            build.heartbeats,
            build.results,
            build.tmp,
        ):
            directory.mkdir()
        _fill_pending(build, count, block or block_size(count))
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


def _fill_pending(build: LedgerLayout, count: int, block: int) -> None:
    """Creates the pending ranges as empty files: a few hundred at most, so their inodes do not matter."""
    pending = str(build.pending)
    for first in range(0, count, block):
        name = UnitRange(first, min(first + block, count) - 1).name
        os.close(os.open(f"{pending}/{name}", os.O_CREAT | os.O_WRONLY, 0o644))


def worker_offset(worker: str, count: int) -> int:
    """Where a worker starts walking the indices: spread by the golden ratio so pods start far apart."""
    if worker.startswith("w") and worker[1:].isdigit():
        fraction = (int(worker[1:]) * 0.6180339887498949) % 1.0
    else:
        fraction = (zlib.crc32(worker.encode()) % 1_000_003) / 1_000_003
    return int(fraction * count) % count


def _outermost(ranges: Iterable[UnitRange]) -> tuple[list[UnitRange], list[UnitRange]]:
    """Splits one worker's claims into the outermost ones and those contained in another (the second name of a
    split that did not finish), which are dropped rather than given back twice."""
    kept: list[UnitRange] = []
    contained: list[UnitRange] = []
    for unit in sorted(ranges, key=lambda r: (r.first, -r.last)):
        if kept and unit.last <= kept[-1].last:
            contained.append(unit)
        else:
            kept.append(unit)
    return kept, contained


@dataclass
class Ledger:
    """One task's ledger; all state is in the files, so any number of pods may hold one."""

    layout: LedgerLayout
    _count: int | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        # Strings for the transitions, made per claim: a Path per name costs more than the rename it names.
        self._pending = f"{self.layout.pending}/"
        self._claimed = f"{self.layout.claimed}/"
        self._done = f"{self.layout.done}/"

    @classmethod
    def of(cls, task: TaskLayout) -> Ledger:
        return cls(task.units)

    def exists(self) -> bool:
        return self.layout.count_file.exists()

    @property
    def count(self) -> int:
        if self._count is None:
            try:
                self._count = int(self.layout.count_file.read_text().strip())
            except (FileNotFoundError, ValueError):
                raise LedgerError(f"{self.layout.root} is not a complete ledger (no valid count file)") from None
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

    def claimer(
        self, worker: str, avoid: dict[int, float] | None = None, others_alive: Callable[[], bool] | None = None
    ) -> Claimer:
        return Claimer(self, worker, avoid if avoid is not None else {}, others_alive)

    @staticmethod
    def _rename(source: Path | str, target: Path | str) -> bool:
        try:
            os.rename(source, target)
        except FileNotFoundError:
            return False
        return True

    def claim(self, unit: int | UnitRange, worker: str) -> bool:
        """Claims a pending entry for `worker`: one rename, refused if it is not pending."""
        name = as_range(unit).name
        return self._rename(f"{self._pending}{name}", f"{self._claimed}{name}@{worker}")

    def release(self, unit: int | UnitRange, worker: str) -> bool:
        """Gives a claim back to pending; False if the claim was no longer held."""
        name = as_range(unit).name
        return self._rename(f"{self._claimed}{name}@{worker}", f"{self._pending}{name}")

    def mark_done(self, unit: int | UnitRange, worker: str) -> bool:
        """Marks a claim done; False if it had been released meanwhile (its results are in place regardless)."""
        unit = as_range(unit)
        done = UnitRange(unit.first, unit.last).name
        return self._rename(f"{self._claimed}{unit.name}@{worker}", f"{self._done}{done}")

    def retry(self, unit: UnitRange, worker: str, failures: int) -> bool:
        """Gives a one-unit claim back to pending with its failures so far (`pending/<i>~<n>`)."""
        retried = UnitRange.one(unit.first, failures)
        return self._rename(self.layout.claimed_entry(unit.name, worker), self.layout.pending_entry(retried.name))

    def mark_failed(self, unit: UnitRange, worker: str, failures: int) -> bool:
        """Moves a one-unit claim that failed past its retries to `failed/<i>~<n>`."""
        failed = UnitRange.one(unit.first, failures)
        return self._rename(self.layout.claimed_entry(unit.name, worker), self.layout.failed_entry(failed.name))

    def split(self, claim: UnitRange, worker: str, at: int) -> tuple[UnitRange, UnitRange] | None:
        """Splits a claim of `worker` into `first … at-1` and `at … last`, both still held by `worker`: a hard link
        to the second name, then a rename of the claim to the first. None if the claim was no longer held."""
        left, right = claim.split(at)
        source = f"{self._claimed}{claim.name}@{worker}"
        second = f"{self._claimed}{right.name}@{worker}"
        try:
            os.link(source, second)
        except FileNotFoundError:
            return None
        except FileExistsError:
            pass  # left by a split that died half-way: the same name of the same worker
        except OSError as exc:
            if exc.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.EMLINK, errno.EXDEV):
                raise
            # A file system without hard links: a new empty file of the second name.
            os.close(os.open(second, os.O_CREAT | os.O_WRONLY, 0o644))
        if not self._rename(source, f"{self._claimed}{left.name}@{worker}"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(second)
            return None
        return left, right

    def touch_claim(self, unit: UnitRange, worker: str) -> None:
        """Restarts a claim's clock (its change time), e.g. for claims a restarted worker takes back."""
        with contextlib.suppress(FileNotFoundError):
            os.utime(self.layout.claimed_entry(unit.name, worker))

    def claims(self) -> dict[str, list[UnitRange]]:
        """Every claim, by worker (one listing of `claimed/`)."""
        held: dict[str, list[UnitRange]] = defaultdict(list)
        with os.scandir(self.layout.claimed) as entries:
            for entry in entries:
                name, sep, worker = entry.name.partition("@")
                unit = UnitRange.parse(name) if sep else None
                if unit is not None:
                    held[worker].append(unit)
        return {worker: sorted(units) for worker, units in held.items()}

    def own_claims(self, worker: str) -> list[UnitRange]:
        """The claims `worker` holds, e.g. an earlier incarnation's, which a restarted worker takes back."""
        return self.claims().get(worker, [])

    def release_all(self, worker: str, units: Iterable[UnitRange]) -> list[UnitRange]:
        """Gives back claims of `worker`, each unit once: a name contained in another claim of the same worker
        (the second name of an unfinished split) is removed instead. Returns the released claims."""
        kept, contained = _outermost(units)
        for unit in contained:
            self.layout.claimed_entry(unit.name, worker).unlink(missing_ok=True)
        return [unit for unit in kept if self.release(unit, worker)]

    def take_back(self, worker: str) -> list[UnitRange]:
        """The claims of an earlier incarnation of `worker`, each unit once, their clocks restarted."""
        kept, contained = _outermost(self.own_claims(worker))
        for unit in contained:
            self.layout.claimed_entry(unit.name, worker).unlink(missing_ok=True)
        for unit in kept:
            self.touch_claim(unit, worker)
        return kept

    def has_claims(self) -> bool:
        with os.scandir(self.layout.claimed) as entries:
            return next(entries, None) is not None

    def has_pending(self) -> bool:
        with os.scandir(self.layout.pending) as entries:
            return any(UnitRange.parse(entry.name) is not None for entry in entries)

    def _entries(self, directory: Path) -> list[UnitRange]:
        if not directory.is_dir():  # `failed/` is absent from a ledger written before it existed
            return []
        with os.scandir(directory) as entries:
            parsed = (UnitRange.parse(entry.name) for entry in entries)
            return sorted(unit for unit in parsed if unit is not None)

    def pending_ranges(self) -> list[UnitRange]:
        return self._entries(self.layout.pending)

    def pending_indices(self) -> list[int]:
        return [index for unit in self.pending_ranges() for index in unit.indices()]

    def done_ranges(self) -> list[UnitRange]:
        return self._entries(self.layout.done)

    def failed(self) -> list[UnitRange]:
        """Units that failed past their retries (the task has failed)."""
        return self._entries(self.layout.failed)

    def has_failed(self) -> bool:
        try:
            with os.scandir(self.layout.failed) as entries:
                return next(entries, None) is not None
        except FileNotFoundError:
            return False

    def done(self) -> IntervalSet:
        done = IntervalSet()
        for unit in self.done_ranges():
            done.add(unit.first, unit.last)
        return done

    def done_count(self) -> int:
        """Distinct units done."""
        return self.done().total

    def is_complete(self) -> bool:
        """Every unit is done."""
        return self.done_count() >= self.count

    def missing(self) -> list[int]:
        """Units neither pending, claimed, done nor failed (none, unless someone removed files of the ledger)."""
        seen = self.done()
        for unit in self.pending_ranges() + self.failed():
            seen.add(unit.first, unit.last)
        for units in self.claims().values():
            for unit in units:
                seen.add(unit.first, unit.last)
        missing: list[int] = []
        expected = 0
        for first, last in seen.ranges():
            missing.extend(range(expected, min(first, self.count)))
            expected = last + 1
        missing.extend(range(expected, self.count))
        return missing

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

    def others_alive(self, worker: str, within_s: float) -> bool:
        """Another worker touched its heartbeat within `within_s` seconds."""
        now = time.time()
        with os.scandir(self.layout.heartbeats) as entries:
            for entry in entries:
                if entry.name != worker and not entry.name.startswith("."):
                    try:
                        if now - entry.stat().st_mtime <= within_s:
                            return True
                    except FileNotFoundError:
                        continue
        return False

    def release_stale(self, grace_s: float, exclude: str, now: float | None = None) -> list[tuple[UnitRange, str]]:
        """Releases the claims of every other worker whose heartbeat is older than the grace period plus a
        minute (or missing): they died without releasing them. Returns the released (claim, worker) pairs."""
        released: list[tuple[UnitRange, str]] = []
        for worker, units in self.claims().items():
            if worker == exclude:
                continue
            age = self.heartbeat_age(worker, now)
            if age is not None and age <= grace_s + STALE_MARGIN_S:
                continue
            released.extend((unit, worker) for unit in self.release_all(worker, units))
        return released

    def release_overdue(self, limit_s: float, exclude: str, now: float | None = None) -> list[tuple[UnitRange, str]]:
        """Releases the claims of other workers held longer than their units' time limit allows (the limit
        times the claim's units, plus the limit again up to 30 s): their holder is alive but does not end them."""
        now = time.time() if now is None else now
        released = []
        for worker, units in self.claims().items():
            if worker == exclude:
                continue
            for unit in units:
                try:
                    changed = self.layout.claimed_entry(unit.name, worker).stat().st_ctime
                except FileNotFoundError:
                    continue
                if now - changed > limit_s * unit.size + min(limit_s, 30.0) and self.release(unit, worker):
                    released.append((unit, worker))
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

    def append_values(self, log: Path, unit: UnitRange, values: list[Any]) -> None:
        """Appends the values of a claim's units to its process's log, one line written whole, and closes the
        file (which on NFS puts the data on the server), all before the claim's done rename."""
        line = json.dumps({"first": unit.first, "last": unit.last, "values": values}, separators=(",", ":"))
        fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (line + "\n").encode())
        finally:
            os.close(fd)

    def values(self) -> tuple[list[Any], IntervalSet]:
        """What every unit returned, read in bulk from the logs of the pool processes, and which units the logs
        cover (a unit computed twice is on two lines with the same value; a line cut short by a kill is left)."""
        values: list[Any] = [None] * self.count
        covered = IntervalSet()
        with os.scandir(self.layout.results) as entries:
            logs = [entry.path for entry in entries if entry.name.endswith(VALUES_SUFFIX)]
        for log in sorted(logs):
            with open(log, "rb") as f:
                for line in f:
                    if not line.endswith(b"\n"):
                        continue
                    try:
                        data = json.loads(line)
                        first, last, unit_values = int(data["first"]), int(data["last"]), data["values"]
                    except (ValueError, KeyError, TypeError):
                        continue
                    if len(unit_values) != last - first + 1 or not 0 <= first <= last < self.count:
                        continue
                    values[first : last + 1] = unit_values
                    covered.add(first, last)
        return values, covered

    def remove_tmp_of(self, worker: str, index: int) -> None:
        """Removes what a killed process of `worker` left unfinished of unit `index`."""
        prefix = f"{index}.{worker}."
        with os.scandir(self.layout.tmp) as entries:
            for entry in entries:
                if entry.name.startswith(prefix):
                    shutil.rmtree(entry.path, ignore_errors=True)

    def remove_tmp(self, worker: str) -> None:
        """Removes the unfinished results of `worker`'s processes (e.g. of units it was stopped in)."""
        suffix = f".{worker}."
        with os.scandir(self.layout.tmp) as entries:
            for entry in entries:
                if suffix in entry.name:
                    if entry.is_dir(follow_symlinks=False):
                        shutil.rmtree(entry.path, ignore_errors=True)
                    else:
                        with contextlib.suppress(FileNotFoundError):
                            os.unlink(entry.path)


class Claimer:
    """Claims ranges of units for one worker at a cost per claim which does not grow with the number of units.

    It lists `pending/` (a few hundred ranges at most) rotated to start at the worker's offset, tries one rename
    per entry, and continues with the rest of its own last split first, so a worker walks its range in order
    while others walk theirs. It lists again only when what it listed is used up. Units this worker failed are
    tried last, so their retry goes to another worker when there is one.
    """

    def __init__(
        self,
        ledger: Ledger,
        worker: str,
        avoid: dict[int, float],
        others_alive: Callable[[], bool] | None = None,
    ) -> None:
        self.ledger = ledger
        self.worker = worker
        self.count = ledger.count
        self.offset = worker_offset(worker, self.count)
        self.avoid = avoid  # unit -> when (time.monotonic) this worker failed it
        self.others_alive = others_alive
        self._candidates: deque[UnitRange] = deque()
        self._next: UnitRange | None = None
        self.scans = 0

    def claim(self, want: int = 1) -> UnitRange | None:
        """Claims up to `want` consecutive pending units (at least one); None when none is pending."""
        rescanned = False
        deferred: list[UnitRange] = []
        while True:
            if self._next is not None:
                unit, self._next = self._next, None
            elif self._candidates:
                unit = self._candidates.popleft()
            elif not rescanned:
                self._candidates = deque(self._rescan())
                rescanned = True
                continue
            elif deferred:
                unit = deferred.pop(0)
                if self._leave_to_others(unit):
                    continue
                if self.ledger.claim(unit, self.worker):
                    return unit
                continue
            else:
                return None
            if unit.failures and unit.first in self.avoid:
                deferred.append(unit)
                continue
            if not self.ledger.claim(unit, self.worker):
                continue
            if want >= unit.size:
                return unit
            halves = self.ledger.split(unit, self.worker, unit.first + want)
            if halves is None:
                continue
            left, right = halves
            if self.ledger.release(right, self.worker):
                self._next = right
            return left

    def _leave_to_others(self, unit: UnitRange) -> bool:
        """A unit this worker failed is left to another live worker for `RETRY_ELSEWHERE_S` after the failure."""
        failed_at = self.avoid.get(unit.first)
        if failed_at is None or time.monotonic() - failed_at > RETRY_ELSEWHERE_S:
            return False
        return self.others_alive is not None and self.others_alive()

    def _rescan(self) -> list[UnitRange]:
        self.scans += 1
        pending = self.ledger.pending_ranges()
        # Rotated to start at the worker's offset, so pods listing at once try different units first.
        split = next((k for k, unit in enumerate(pending) if unit.last >= self.offset), len(pending))
        return pending[split:] + pending[:split]
