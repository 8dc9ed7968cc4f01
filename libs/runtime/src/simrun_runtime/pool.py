"""The local pool of a worker pod: forked processes that compute claims (ranges of units) as they are claimed.

A process computes the units of a claim one after the other, appends the values they returned as one line to its
own log of values and sends back one message per claim: what the parent does per unit is nothing. It records the
unit it is computing and since when in memory it shares with the parent, so the parent kills a unit past its
time limit (and forks a new process in its place) without a message per unit. What a unit prints through
`sys.stdout` or `sys.stderr` reaches the pod's log with every line prefixed `[unit N] `; what its subprocesses or
C code write to file descriptors 1 and 2 is prefixed with the unit being computed when the process's reader
thread reads it.
"""

from __future__ import annotations

import contextlib
import io
import json
import multiprocessing.connection
import os
import secrets
import shutil
import sys
import threading
import time
import traceback
from collections import deque
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any, TextIO

from pydantic import BaseModel

from simrun_runtime.ledger import Ledger, UnitRange
from simrun_runtime.memory import kill_tree
from simrun_runtime.pod import MP, child_signals
from simrun_runtime.reports import SecondsSketch
from simrun_runtime.tasktype import SplitTaskType, UnitContext, _Scratch

# The slot a process shares with the parent: the unit it computes, and since when (time.monotonic; 0 when idle).
_UNIT, _SINCE = 0, 1


@dataclass(frozen=True)
class UnitJob:
    """What a pool process needs to compute any unit of the task."""

    task_type: SplitTaskType
    settings: BaseModel
    ledger: Ledger
    worker: str
    inputs: dict[str, Path]
    provenance: Path | None
    scratch_root: Path


@dataclass(frozen=True)
class ClaimResult:
    """A claim a process finished: units `claim.first` … `done_until - 1` have their results in place; if
    `error` is set (a traceback), unit `done_until` raised it and the units after it were not computed."""

    claim: UnitRange
    done_until: int
    seconds: SecondsSketch
    skipped: int = 0
    error: str | None = None
    cpu_s: float = 0.0  # CPU seconds of the process over the units it computed (claims are sized by them)

    @property
    def complete(self) -> bool:
        return self.error is None and self.done_until > self.claim.last


@dataclass(frozen=True)
class ProcessDied:
    """A pool process died (killed for memory, or by the parent for a unit past its time limit) holding these
    claims; `unit` is the unit it was computing (the first claim's), if it had started one."""

    claims: list[UnitRange]
    exitcode: int | None
    unit: int | None = None
    timed_out: bool = False


class UnitOutput(io.TextIOBase):
    """`sys.stdout` / `sys.stderr` of a pool process: every line a unit writes is prefixed `[unit N] `."""

    def __init__(self, target: TextIO) -> None:
        self._target = target
        self._partial = ""
        self.unit: int | None = None

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        data = self._partial + text
        lines = data.split("\n")
        self._partial = lines.pop()
        if lines:
            prefix = f"[unit {self.unit}] " if self.unit is not None else ""
            self._target.write("".join(f"{prefix}{line}\n" for line in lines))
            self._target.flush()
        return len(text)

    def end_unit(self) -> None:
        """Ends a line the unit left open, so the next unit's output starts on a line of its own."""
        if self._partial:
            self.write("\n")
        self.unit = None

    def flush(self) -> None:
        self._target.flush()

    def fileno(self) -> int:
        return self._target.fileno()

    @property
    def buffer(self) -> Any:
        """The binary stream underneath, for code that writes bytes (those lines are not prefixed)."""
        return self._target.buffer

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self._target, "encoding", "utf-8")


class FdOutput:
    """What is written to file descriptor 1 or 2 of a pool process directly (a unit's subprocess, a C library):
    read from a pipe by a thread of the process and passed on with every line prefixed by the unit being
    computed when it is read. Nothing runs while units are silent."""

    def __init__(self, fd: int, target: int, slot: Any) -> None:
        self._read, write = os.pipe()
        os.dup2(write, fd)
        os.close(write)
        self._fd = fd
        self._target = target
        self._slot = slot
        self._thread = threading.Thread(target=self._loop, name=f"simrun-output-{fd}", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        partial = b""
        while True:
            try:
                data = os.read(self._read, 65536)
            except OSError:
                return
            if not data:
                break
            lines = (partial + data).split(b"\n")
            partial = lines.pop()
            if lines:
                prefix = b"[unit %d] " % int(self._slot[_UNIT])
                with contextlib.suppress(OSError):
                    os.write(self._target, b"".join(prefix + line + b"\n" for line in lines))
        if partial:
            with contextlib.suppress(OSError):
                os.write(self._target, b"[unit %d] " % int(self._slot[_UNIT]) + partial + b"\n")

    def close(self) -> None:
        """Ends the pipe (this process's end of it) and passes on what is left in it."""
        with contextlib.suppress(OSError):
            os.close(self._fd)
        self._thread.join(timeout=2)


def compute_claim(
    job: UnitJob,
    claim: UnitRange,
    slot: Any = None,
    outputs: tuple[UnitOutput, ...] = (),
    values_log: Path | None = None,
) -> ClaimResult:
    """Computes the units of `claim` in order; writes the values they returned into the claim's file, and renames
    the files of units that wrote files into `results/<i>/`. A unit that raises ends the claim there."""
    ledger = job.ledger
    pid = os.getpid()
    if values_log is None:
        values_log = process_log(job)
    tmp = f"{ledger.layout.tmp}/"
    suffix = f".{job.worker}.{pid}"
    scratch_prefix = f"{job.scratch_root}/{job.worker}-{pid}-"
    compute, settings, inputs, worker, provenance = (
        job.task_type.compute_unit,
        job.settings,
        job.inputs,
        job.worker,
        job.provenance,
    )
    clock = time.perf_counter
    durations: list[float] = []
    values: list[Any] = []
    packed = False  # some unit returned a value or wrote no files: the claim needs its line of values
    skipped = 0
    error: str | None = None
    index = claim.first
    single = claim.size == 1
    cpu_start = time.process_time()
    for index in claim.indices():
        if slot is not None:
            slot[_UNIT] = index
            slot[_SINCE] = time.monotonic()
        for output in outputs:
            output.unit = index
        # A unit of its own claim may have its files in place from an earlier incarnation; a short unit in a
        # claim of many is cheaper to compute again than to look for.
        if single and ledger.has_result(index):
            skipped += 1
            values.append(None)
            continue
        scratch = _Scratch(f"{scratch_prefix}{index}")
        context = UnitContext(index, f"{tmp}{index}{suffix}", inputs, worker, provenance, scratch)
        start = clock()
        try:
            value = compute(settings, index, context)
        except BaseException:
            if context.wrote_files:
                shutil.rmtree(context.result_path, ignore_errors=True)
            error = traceback.format_exc()
            break
        finally:
            if scratch._created:
                scratch.remove()
            for output in outputs:
                output.end_unit()
        if context.wrote_files:
            ledger.place_result(Path(context.result_path), index)
        packed = packed or value is not None or not context.wrote_files
        values.append(value)
        durations.append(clock() - start)
    else:
        index = claim.last + 1
    if slot is not None:
        slot[_SINCE] = 0.0
    if packed and index > claim.first:
        kept = values[: index - claim.first]
        bad = next((k for k, value in enumerate(kept) if value is not None and not _is_json(value)), None)
        if bad is not None:
            # The first unit whose value is no JSON fails; the units before it are kept.
            kind = type(kept[bad]).__name__
            error = (
                f"compute_unit of unit {claim.first + bad} returned a {kind}: return a JSON value (or None and "
                f"write files)\nTypeError: compute_unit of unit {claim.first + bad} returned a {kind}, "
                "not a JSON value\n"
            )
            index = claim.first + bad
            del durations[bad:]
            kept = kept[:bad]
        if index > claim.first:
            ledger.append_values(values_log, UnitRange(claim.first, index - 1), kept)
    cpu_s = time.process_time() - cpu_start
    return ClaimResult(claim, index, SecondsSketch.of(durations), skipped, error, cpu_s)


def process_log(job: UnitJob) -> Path:
    """The log of values of this process (its pid and a random token: pids repeat in the pods of a task)."""
    return job.ledger.layout.values_log(job.worker, f"{os.getpid()}-{secrets.token_hex(4)}")


def _is_json(value: Any) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True


def _process_main(conn: Connection, job: UnitJob, slot: Any) -> None:
    child_signals()
    # The pod's own stdout and stderr, which the prefixed lines go to; fds 1 and 2 become pipes of FdOutput.
    out, err = os.dup(1), os.dup(2)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    captured = (FdOutput(1, out, slot), FdOutput(2, err, slot))
    outputs = (
        UnitOutput(open(out, "w", buffering=1, closefd=False)),  # noqa: SIM115 - lives as long as the process
        UnitOutput(open(err, "w", buffering=1, closefd=False)),  # noqa: SIM115
    )
    sys.stdout, sys.stderr = outputs  # type: ignore[assignment]
    log = process_log(job)
    try:
        while True:
            try:
                claim = conn.recv()
            except EOFError:
                return
            if claim is None:
                return
            conn.send(compute_claim(job, claim, slot, outputs, log))
    finally:
        for output in captured:
            output.close()


@dataclass
class _Member:
    process: BaseProcess
    conn: Connection
    slot: Any
    claims: deque[UnitRange] = field(default_factory=deque)


class UnitPool:
    """`processes` forked processes; claims are sent to the least busy one as soon as they are claimed."""

    def __init__(self, job: UnitJob, processes: int) -> None:
        self.job = job
        self.members: list[_Member] = [self._spawn() for _ in range(processes)]

    def _spawn(self) -> _Member:
        parent, child = MP.Pipe()
        slot = MP.RawArray("d", 2)
        process = MP.Process(target=_process_main, args=(child, self.job, slot), daemon=True)
        process.start()
        child.close()
        return _Member(process, parent, slot)

    @property
    def in_flight(self) -> int:
        """Claims sent to processes and not yet finished."""
        return sum(len(member.claims) for member in self.members)

    def units(self) -> list[UnitRange]:
        """Every claim sent to a process and not yet finished."""
        return [claim for member in self.members for claim in member.claims]

    def submit(self, claim: UnitRange) -> None:
        member = min(self.members, key=lambda m: len(m.claims))
        member.claims.append(claim)
        # A process that died is found by `wait` through its sentinel, which reports its claims.
        with contextlib.suppress(OSError):
            member.conn.send(claim)

    def wait(self, timeout: float, also: list[Any], limit_s: float | None = None) -> list[ClaimResult | ProcessDied]:
        """Finished claims and dead processes, waiting up to `timeout` seconds or until one of `also` is ready. A
        process whose unit ran past `limit_s` is killed (reported as `ProcessDied(timed_out=True)`) and replaced."""
        busy = [member for member in self.members if member.claims]
        if limit_s is not None:
            now = time.monotonic()
            for member in busy:
                since = member.slot[_SINCE]
                if since > 0:
                    timeout = min(timeout, max(since + limit_s - now, 0.0) + 0.01)
        waitables: list[Any] = [m.conn for m in busy] + [m.process.sentinel for m in busy] + also
        ready = set(multiprocessing.connection.wait(waitables, timeout=timeout))
        events: list[ClaimResult | ProcessDied] = []
        for member in busy:
            broken = False
            # One message per ready pipe: a second one is found by the next wait, sparing a poll per claim.
            if member.conn in ready:
                try:
                    result: ClaimResult = member.conn.recv()
                    member.claims.remove(result.claim)
                    events.append(result)
                except (EOFError, OSError):
                    broken = True
            if member.claims and (broken or member.process.sentinel in ready):
                member.process.join(timeout=1.0)
                if not member.process.is_alive():
                    events.append(self._died(member, timed_out=False))
        if limit_s is not None:
            now = time.monotonic()
            for member in self.members:
                since = member.slot[_SINCE]
                if member.claims and since > 0 and now - since > limit_s and member.process.is_alive():
                    if member.process.pid is not None:
                        kill_tree(member.process.pid)  # and what the unit started, which would go on alone
                    member.process.kill()
                    member.process.join()
                    events.append(self._died(member, timed_out=True))
        return events

    def _died(self, member: _Member, timed_out: bool) -> ProcessDied:
        unit = int(member.slot[_UNIT]) if member.slot[_SINCE] > 0 else None
        died = ProcessDied(list(member.claims), member.process.exitcode, unit, timed_out)
        member.claims.clear()
        return died

    def replace_dead(self) -> None:
        """Forks a new process in place of each dead one (after a unit was killed at its time limit)."""
        for k, member in enumerate(self.members):
            if not member.process.is_alive():
                member.conn.close()
                self.members[k] = self._spawn()

    def close(self) -> None:
        """Lets idle processes exit."""
        for member in self.members:
            with contextlib.suppress(OSError):
                member.conn.send(None)
        for member in self.members:
            member.process.join(timeout=5)
            if member.process.is_alive():
                member.process.kill()
                member.process.join()

    def kill(self) -> None:
        """Ends every process at once (their claims are abandoned: the caller releases them)."""
        for member in self.members:
            if member.process.is_alive():
                member.process.kill()
        for member in self.members:
            member.process.join()
            member.claims.clear()
