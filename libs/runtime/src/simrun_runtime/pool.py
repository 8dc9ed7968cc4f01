"""The local pool of a worker pod: forked processes that compute units as they are claimed, one pipe each."""

from __future__ import annotations

import contextlib
import multiprocessing.connection
import os
import time
import traceback
from collections import deque
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from simrun_runtime.ledger import Ledger
from simrun_runtime.pod import MP, child_signals
from simrun_runtime.tasktype import SplitTaskType, UnitContext, _Scratch


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
class UnitResult:
    """A unit a process finished: `seconds` None if its result was already in place; `error` a traceback."""

    index: int
    seconds: float | None
    error: str | None = None


@dataclass(frozen=True)
class ProcessDied:
    """A pool process died (e.g. killed for memory) holding these units."""

    units: list[int]
    exitcode: int | None


def compute_one(job: UnitJob, index: int) -> float | None:
    """Computes unit `index` into its result directory; None if a result was already in place."""
    if job.ledger.has_result(index):
        return None
    start = time.perf_counter()
    scratch = _Scratch(job.scratch_root / f"{job.worker}-{os.getpid()}-{index}")
    try:
        job.ledger.write_result(
            index,
            job.worker,
            lambda result_dir: job.task_type.compute_unit(
                job.settings,
                index,
                UnitContext(index, result_dir, job.inputs, job.worker, job.provenance, scratch),
            ),
        )
    finally:
        scratch.remove()
    return time.perf_counter() - start


def _process_main(conn: Connection, job: UnitJob) -> None:
    child_signals()
    while True:
        try:
            index = conn.recv()
        except EOFError:
            return
        if index is None:
            return
        try:
            conn.send(UnitResult(index, compute_one(job, index)))
        except BaseException:
            conn.send(UnitResult(index, None, traceback.format_exc()))


@dataclass
class _Member:
    process: BaseProcess
    conn: Connection
    units: deque[int] = field(default_factory=deque)


class UnitPool:
    """`processes` forked processes; units are sent to the least busy one as soon as they are claimed."""

    def __init__(self, job: UnitJob, processes: int) -> None:
        self.members: list[_Member] = []
        for _ in range(processes):
            parent, child = MP.Pipe()
            process = MP.Process(target=_process_main, args=(child, job), daemon=True)
            process.start()
            child.close()
            self.members.append(_Member(process, parent))

    @property
    def in_flight(self) -> int:
        return sum(len(member.units) for member in self.members)

    def units(self) -> list[int]:
        """Every unit sent to a process and not yet finished."""
        return [index for member in self.members for index in member.units]

    def submit(self, index: int) -> None:
        member = min(self.members, key=lambda m: len(m.units))
        member.units.append(index)
        # A process that died is found by `wait` through its sentinel, which reports its units.
        with contextlib.suppress(OSError):
            member.conn.send(index)

    def wait(self, timeout: float, also: list[Any]) -> list[UnitResult | ProcessDied]:
        """Finished units and dead processes, waiting up to `timeout` seconds or until one of `also` is ready."""
        busy = [member for member in self.members if member.units]
        waitables: list[Any] = [m.conn for m in busy] + [m.process.sentinel for m in busy] + also
        ready = set(multiprocessing.connection.wait(waitables, timeout=timeout))
        events: list[UnitResult | ProcessDied] = []
        for member in busy:
            broken = False
            # One message per ready pipe: a second one is found by the next wait, sparing a poll per unit.
            if member.conn in ready:
                try:
                    result: UnitResult = member.conn.recv()
                    member.units.remove(result.index)
                    events.append(result)
                except (EOFError, OSError):
                    broken = True
            if member.units and (broken or member.process.sentinel in ready):
                member.process.join(timeout=1.0)
                if not member.process.is_alive():
                    events.append(ProcessDied(list(member.units), member.process.exitcode))
                    member.units.clear()
        return events

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
        """Ends every process at once (their units are abandoned: the caller releases the claims)."""
        for member in self.members:
            if member.process.is_alive():
                member.process.kill()
        for member in self.members:
            member.process.join()
            member.units.clear()
