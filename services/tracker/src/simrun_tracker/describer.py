"""Describes task types in subprocesses with the model's interpreter, so user code never runs in a service."""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from simrun_core.errors import FailedPrecondition, Unavailable
from simrun_runtime.describe import DescribeRequest, DescribeResponse

from simrun_tracker.local.confinement import PodConfinement, PodPaths, pod_environment


class TypeDescriber(Protocol):
    """Describes task types (and checks settings, counts units) for a model root with an interpreter."""

    def describe(
        self, interpreter: str, model_root: Path, requests: list[DescribeRequest], libraries: tuple[Path, ...] = ()
    ) -> list[DescribeResponse]: ...

    def close(self) -> None: ...


_Key = tuple[str, str, tuple[str, ...], int]
"""A describer process's key: the interpreter, the model root, the library snapshots it may read, its slot."""


class _NoAnswer(Exception):
    """The describer gave no answer within the time limit."""


@dataclass
class _Process:
    proc: subprocess.Popen[str]
    lock: threading.Lock
    used: float
    scratch: Path


class SubprocessDescriber:
    """Keeps long-lived `python -m simrun_runtime.describe --serve` processes per (interpreter, model root): one,
    and up to `per_model` while submissions of the model come at once.

    A model root is an immutable snapshot, so what a describer imported from it never goes stale; keeping the
    process makes a submission cost a round trip instead of an interpreter start and the model's imports.
    The model's imports are user code: the process is confined as a pod is (it reads the model root and its
    interpreter and the snapshots of the model's libraries, writes only its own scratch folder) and gets the pod
    allow-list of variables, never the server's environment.
    """

    def __init__(
        self,
        max_processes: int = 8,
        timeout_s: float = 60.0,
        confinement: PodConfinement | None = None,
        per_model: int = 2,
    ) -> None:
        # Well under a client's 120 s deadline, so the client hears why instead of `Deadline Exceeded`.
        self._max = max_processes
        self._timeout_s = timeout_s
        self._confinement = confinement or PodConfinement()
        self._per_model = per_model
        self._lock = threading.Lock()
        self._processes: OrderedDict[_Key, _Process] = OrderedDict()
        self._released = threading.Condition()
        self._releases = 0
        """Describers given back so far: a caller that found every one of its model's busy waits for the next."""

    def describe(
        self, interpreter: str, model_root: Path, requests: list[DescribeRequest], libraries: tuple[Path, ...] = ()
    ) -> list[DescribeResponse]:
        """The descriptions of `requests`, in order; `libraries` are the run's other snapshots (the folders of the
        model's path dependencies), which the model's imports may read as the run's pods do."""
        for attempt in range(2):
            key, process = self._claim(interpreter, str(model_root), tuple(str(p) for p in libraries))
            try:
                process.used = time.monotonic()
                return self._round_trip(process.proc, requests)
            except _NoAnswer:
                # Not tried again: a model whose import hangs would hang again, long after the client left.
                self._drop(key, process)
                raise FailedPrecondition(
                    f"the model's task types gave no answer within {self._timeout_s:.0f} s: does importing "
                    f"the model hang? Try `python -c 'import <module>'` in {model_root}"
                ) from None
            except (BrokenPipeError, OSError, ValueError, EOFError) as exc:
                self._drop(key, process)
                if attempt:
                    raise Unavailable(
                        f"the task type describer for {model_root} failed: {exc}; check that the model imports"
                    ) from exc
            finally:
                process.lock.release()
                with self._released:
                    self._releases += 1
                    self._released.notify_all()
        raise AssertionError("unreachable")

    def _claim(self, interpreter: str, model_root: str, libraries: tuple[str, ...]) -> tuple[_Key, _Process]:
        """A describer of the model that is free now, held: a second one starts only while the first is busy
        (concurrent submissions of one model), and with all of them busy the caller waits for whichever is given
        back first."""
        while True:
            with self._released:
                seen = self._releases
            for slot in range(self._per_model):
                key = (interpreter, model_root, libraries, slot)
                process = self._process(key)
                if process.lock.acquire(blocking=False):
                    return key, process
            with self._released:
                while self._releases == seen:
                    self._released.wait()

    def _round_trip(self, proc: subprocess.Popen[str], requests: list[DescribeRequest]) -> list[DescribeResponse]:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(json.dumps([r.model_dump(mode="json") for r in requests]) + "\n")
        proc.stdin.flush()
        ready, _, _ = select.select([proc.stdout], [], [], self._timeout_s)
        if not ready:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # its own session: whatever the model started dies too
            raise _NoAnswer
        line = proc.stdout.readline()
        if not line:
            raise EOFError(f"the describer exited with {proc.wait()}")
        return [DescribeResponse.model_validate(item) for item in json.loads(line)]

    def _process(self, key: _Key) -> _Process:
        with self._lock:
            process = self._processes.get(key)
            if process is not None and process.proc.poll() is None:
                self._processes.move_to_end(key)
                return process
            if process is not None:
                _stop(process)  # exited: close its pipes before replacing it
            interpreter, model_root, libraries, _ = key
            scratch = Path(tempfile.mkdtemp(prefix="simrun-describe-"))
            command = self._confinement.command(
                interpreter,
                [interpreter, "-m", "simrun_runtime.describe", "--serve"],
                PodPaths(read=(Path(model_root), *(Path(p) for p in libraries)), write=(scratch,)),
            )
            try:
                proc = subprocess.Popen(
                    command,
                    cwd=model_root,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.DEVNULL,
                    text=True,
                    env=pod_environment({}, scratch),
                    start_new_session=True,
                )
            except BaseException:
                shutil.rmtree(scratch, ignore_errors=True)
                raise
            process = _Process(proc, threading.Lock(), time.monotonic(), scratch)
            self._processes[key] = process
            while len(self._processes) > self._max:
                _, oldest = self._processes.popitem(last=False)
                _stop(oldest)
            return process

    def _drop(self, key: _Key, process: _Process) -> None:
        with self._lock:
            if self._processes.get(key) is process:
                del self._processes[key]
        _stop(process)

    def close(self) -> None:
        with self._lock:
            processes = list(self._processes.values())
            self._processes.clear()
        for process in processes:
            _stop(process)


def _stop(process: _Process) -> None:
    proc = process.proc
    if proc.stdin:  # closed even when the process has exited, so its pipe is not leaked
        with contextlib.suppress(OSError):
            proc.stdin.close()
    if proc.poll() is None:
        try:
            proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    for stream in (proc.stdout,):
        if stream:
            stream.close()
    shutil.rmtree(process.scratch, ignore_errors=True)
