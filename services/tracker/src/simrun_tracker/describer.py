"""Describes task types in subprocesses with the model's interpreter, so user code never runs in a service."""

from __future__ import annotations

import contextlib
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
from simrun_runtime.describe import DescribeRequest, DescribeResponse, as_line, responses_of

from simrun_tracker.local.confinement import PodConfinement, PodPaths, pod_environment


class TypeDescriber(Protocol):
    """Describes task types (and checks settings, counts units) for a model root with an interpreter."""

    def describe(
        self, interpreter: str, model_root: Path, requests: list[DescribeRequest], libraries: tuple[Path, ...] = ()
    ) -> list[DescribeResponse]: ...

    def close(self) -> None: ...


_Key = tuple[str, str, tuple[str, ...], int]
"""A describer process's key: the interpreter, the model root, the library snapshots it may read, its slot."""

_AnswerKey = tuple[str, str, tuple[str, ...], str]
"""An answer's key: the interpreter, the model root, the library snapshots, the requests as sent (JSON)."""

ANSWERS_KEPT = 1024
"""How many answers a describer keeps for the same requests again (the least recently used go first)."""


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
    and up to `per_model` while submissions of the model come at once (each further one started in the background,
    while the burst that asked for it is answered by the warm ones).

    The same requests of the same snapshots are answered again from memory (`answers_kept`, the least recently
    used forgotten first), as an agent sending one experiment again and again asks them: only an answer whose
    every type was described (`ok`) and declares itself `cacheable` is kept, so a type whose results may differ
    from run to run is described every time.

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
        answers_kept: int = ANSWERS_KEPT,
    ) -> None:
        # Well under a client's 120 s deadline, so the client hears why instead of `Deadline Exceeded`.
        self._max = max_processes
        self._timeout_s = timeout_s
        self._confinement = confinement or PodConfinement()
        self._per_model = per_model
        self._answers_kept = answers_kept
        self._answers: OrderedDict[_AnswerKey, str] = OrderedDict()
        """The kept answers, each the describer's line."""
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
        roots = tuple(str(p) for p in libraries)
        sent = as_line(requests)
        answer_key = (interpreter, str(model_root), roots, sent)
        with self._lock:
            kept = self._answers.get(answer_key)
            if kept is not None:
                self._answers.move_to_end(answer_key)
        if kept is not None:
            return responses_of(kept)
        for attempt in range(2):
            key, process = self._claim(interpreter, str(model_root), roots, requests)
            try:
                process.used = time.monotonic()
                line = self._round_trip(process.proc, sent)
                responses = responses_of(line)
                if all(r.ok and r.description is not None and r.description.cacheable for r in responses):
                    self._keep(answer_key, line)
                return responses
            except _NoAnswer:
                # Not tried again: a model whose import hangs would hang again, long after the client left.
                self._drop(key, process)
                raise self._no_answer(model_root) from None
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

    def _keep(self, key: _AnswerKey, line: str) -> None:
        with self._lock:
            self._answers[key] = line
            self._answers.move_to_end(key)
            while len(self._answers) > self._answers_kept:
                self._answers.popitem(last=False)

    def _no_answer(self, model_root: Path | str) -> FailedPrecondition:
        return FailedPrecondition(
            f"the model's task types gave no answer within {self._timeout_s:.0f} s: does importing "
            f"the model hang? Try `python -c 'import <module>'` in {model_root}"
        )

    def _claim(
        self, interpreter: str, model_root: str, libraries: tuple[str, ...], requests: list[DescribeRequest]
    ) -> tuple[_Key, _Process]:
        """A describer of the model that is free now, held. The model's first describer is started for the caller,
        which waits for its imports. With every started one busy (concurrent submissions of one model), the next is
        started warming in the background (`_warm`) and the caller waits for whichever is given back first, which
        is nearly always a warm one: a burst of submissions does not wait for a second interpreter's imports.
        A caller waits at most the time limit for one (with every describer stuck, the model's import hangs)."""
        deadline = time.monotonic() + self._timeout_s
        while True:
            with self._released:
                seen = self._releases
            missing = []
            for slot in range(self._per_model):
                key = (interpreter, model_root, libraries, slot)
                process = self._running(key)
                if process is None:
                    missing.append(key)
                elif process.lock.acquire(blocking=False):
                    return key, process
            if len(missing) == self._per_model:  # none of the model's is running: the caller waits for one
                process = self._start(missing[0])
                if process is not None:
                    return missing[0], process
                continue
            if missing:
                self._start_warming(missing[0], requests)
            with self._released:
                while self._releases == seen:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise self._no_answer(model_root)
                    self._released.wait(remaining)

    def _round_trip(self, proc: subprocess.Popen[str], sent: str) -> str:
        """The describer's answer (a line of JSON) to `sent` (a JSON list of requests)."""
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(sent + "\n")
        proc.stdin.flush()
        ready, _, _ = select.select([proc.stdout], [], [], self._timeout_s)
        if not ready:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # its own session: whatever the model started dies too
            raise _NoAnswer
        line = proc.stdout.readline()
        if not line:
            raise EOFError(f"the describer exited with {proc.wait()}")
        return line

    def _running(self, key: _Key) -> _Process | None:
        """The describer of `key` if it is running (one that exited is closed and forgotten)."""
        with self._lock:
            process = self._processes.get(key)
            if process is None:
                return None
            if process.proc.poll() is None:
                self._processes.move_to_end(key)
                return process
            del self._processes[key]
        _stop(process)  # exited: close its pipes before replacing it
        return None

    def _start(self, key: _Key) -> _Process | None:
        """Starts the describer of `key`, held by the caller; None when another thread has just started it."""
        with self._lock:
            earlier = self._processes.get(key)
            if earlier is not None and earlier.proc.poll() is None:
                return None
            if earlier is not None:
                _stop(earlier)  # exited: close its pipes before replacing it
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
            process.lock.acquire()
            self._processes[key] = process
            while len(self._processes) > self._max:
                _, oldest = self._processes.popitem(last=False)
                _stop(oldest)
            return process

    def _start_warming(self, key: _Key, requests: list[DescribeRequest]) -> None:
        """Starts the describer of `key`, held, and has a thread make it import the types of `requests` (described
        without settings: no unit is counted) before it gives it back; one that gives no answer is dropped."""
        process = self._start(key)
        if process is None:
            return
        types = list(dict.fromkeys((r.type, r.model_root) for r in requests))
        warm_up = [DescribeRequest(type=name, model_root=root) for name, root in types]
        threading.Thread(
            target=self._warm, args=(key, process, warm_up), name="simrun-describe-warm", daemon=True
        ).start()

    def _warm(self, key: _Key, process: _Process, requests: list[DescribeRequest]) -> None:
        try:
            self._round_trip(process.proc, as_line(requests))
        except (_NoAnswer, BrokenPipeError, OSError, ValueError, EOFError):
            self._drop(key, process)
        finally:
            process.lock.release()
            with self._released:
                self._releases += 1
                self._released.notify_all()

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
