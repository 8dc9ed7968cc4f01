"""What every pod entry point shares: the runtime contract's environment, the task read from the run directory,
SIGTERM handling, the report kept while the pod runs, and running user code in a child process."""

from __future__ import annotations

import contextlib
import ctypes
import json
import multiprocessing
import multiprocessing.connection
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from simrun_runtime.editable import EditableError, install_snapshots
from simrun_runtime.files import write_json_atomic
from simrun_runtime.layout import RunLayout, TaskLayout
from simrun_runtime.loading import load_task_type
from simrun_runtime.memory import MemoryProbe, MemorySampler, kill_tree
from simrun_runtime.record import RunRecord, TaskRecord
from simrun_runtime.reports import SecondsSketch, WorkerEnd, WorkerReport, utcnow
from simrun_runtime.tasktype import SettingsError, TaskType, TaskTypeError

EXIT_DONE = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_KILLED = 137
EXIT_STOPPED = 143

# fork: a pool process starts in microseconds with the task type already imported; the pods run on Linux.
MP = multiprocessing.get_context("fork")


class UsageError(Exception):
    """Bad input to a pod (environment, run directory, type, settings): exit 2 with this one-line message."""


@dataclass(frozen=True)
class PodEnv:
    """The runtime contract: the variables a pod of a task is started with.

    SIMRUN_RUN_DIR: `runs/<id>` in the store. SIMRUN_TASK: the task id. SIMRUN_WORKER: `w0` the coordinator,
    `w1`… extra workers. SIMRUN_PROCESSES: worker processes of the pod (default 1). SIMRUN_MERGE: `1` in the
    coordinator to merge once the ledger is complete. SIMRUN_GRACE_S: the termination grace period, seconds
    (default 30). SIMRUN_PROVENANCE: path of the task's provenance.json. SIMRUN_CGROUP: the pod's memory cgroup
    directory, or `self` for the process's own cgroup; unset, the process tree is measured. SIMRUN_SCRATCH: a
    directory on the local disk for scratch files (default the system's temporary directory).
    SIMRUN_INSTALL_SNAPSHOTS: `1` in an image, whose pod installs the run's snapshots that are packages editable
    into its scratch at its start, offline (`simrun_runtime.editable`).
    SIMRUN_UNIT_TIMEOUT_S: the workflow's time limit of one unit of the task, seconds (unset: the type's own,
    else `DEFAULT_UNIT_TIMEOUT_S`). TRACEPARENT: the W3C trace
    context of the task (optional), copied into the pod's report so its span joins the run's trace.
    """

    run_dir: Path
    task_id: str
    worker: str = "w0"
    processes: int = 1
    merge: bool = False
    grace_s: float = 30.0
    provenance: Path | None = None
    cgroup: str | None = None
    scratch: Path | None = None
    traceparent: str | None = None
    unit_timeout_s: float | None = None
    install_snapshots: bool = False

    @property
    def editables_into(self) -> Path | None:
        """Where the pod installs the run's snapshots editable at its start (an image), or None (an overlay has)."""
        if not self.install_snapshots:
            return None
        return self.scratch or Path(tempfile.gettempdir())

    @classmethod
    def from_environ(cls, environ: Mapping[str, str], default_worker: str = "w0") -> PodEnv:
        def need(name: str) -> str:
            value = environ.get(name, "").strip()
            if not value:
                raise UsageError(f"{name} is not set: the pod needs it (see the runtime contract)")
            return value

        def number(name: str, default: str, kind: type) -> Any:
            raw = environ.get(name, "").strip() or default
            try:
                value = kind(raw)
            except ValueError:
                raise UsageError(f"{name}={raw!r} is not a number") from None
            if value < (1 if kind is int else 0):
                raise UsageError(f"{name}={raw!r} is out of range")
            return value

        worker = environ.get("SIMRUN_WORKER", "").strip() or default_worker
        if "@" in worker or "/" in worker or worker.startswith("."):
            raise UsageError(f"SIMRUN_WORKER={worker!r} may not contain '@' or '/' or start with '.'")
        timeout = environ.get("SIMRUN_UNIT_TIMEOUT_S", "").strip()
        unit_timeout_s = number("SIMRUN_UNIT_TIMEOUT_S", "", float) if timeout else None
        if unit_timeout_s is not None and not 0 < unit_timeout_s < float("inf"):
            raise UsageError(f"SIMRUN_UNIT_TIMEOUT_S={timeout!r} must be a number of seconds > 0")
        provenance = environ.get("SIMRUN_PROVENANCE", "").strip()
        scratch = environ.get("SIMRUN_SCRATCH", "").strip()
        return cls(
            # Absolute: the task runs in the model's root (`TaskSetup.load`), not where the pod started.
            run_dir=Path(need("SIMRUN_RUN_DIR")).absolute(),
            task_id=need("SIMRUN_TASK"),
            worker=worker,
            processes=number("SIMRUN_PROCESSES", "1", int),
            merge=environ.get("SIMRUN_MERGE", "").strip() == "1",
            grace_s=number("SIMRUN_GRACE_S", "30", float),
            provenance=Path(provenance).absolute() if provenance else None,
            cgroup=environ.get("SIMRUN_CGROUP", "").strip() or None,
            scratch=Path(scratch).absolute() if scratch else None,
            traceparent=environ.get("TRACEPARENT", "").strip() or None,
            unit_timeout_s=unit_timeout_s,
            install_snapshots=environ.get("SIMRUN_INSTALL_SNAPSHOTS", "").strip() == "1",
        )


@dataclass
class TaskSetup:
    """A task as a pod finds it in the run directory: run.json, settings.json, the type and its inputs."""

    run: RunLayout
    task: TaskLayout
    record: RunRecord
    task_record: TaskRecord
    model_root: Path | None
    task_type: TaskType
    settings: BaseModel
    inputs: dict[str, Path]

    @property
    def type_name(self) -> str:
        return self.task_record.type

    @property
    def model_name(self) -> str | None:
        return self.record.snapshots[0].name if self.record.snapshots else None

    @classmethod
    def load(cls, run_dir: Path, task_id: str, writer: str = "", editables_into: Path | None = None) -> TaskSetup:
        """Reads and checks everything, first writing the task's files that follow from the record where they are
        missing or differ (a pod, `writer`, lays out its task), and makes the model's root the working directory;
        raises `UsageError` with what to fix, having touched nothing else."""
        run = RunLayout(run_dir.resolve())
        if not run.record.is_file():
            raise UsageError(f"{run_dir} has no {run.record.name}: SIMRUN_RUN_DIR must be a run directory runs/<id>")
        try:
            record = RunRecord.load(run)
        except (ValidationError, json.JSONDecodeError) as exc:
            raise UsageError(f"{run.record} is not a valid run record: {str(exc).splitlines()[0]}") from None
        task = run.task(task_id)
        if task_id in record.tasks:
            try:
                record.write_task_files(run, task_id, writer=writer)
            except OSError as exc:
                raise UsageError(f"cannot write the files of task {task_id!r} in {task.root}: {exc}") from None
        if not task.root.is_dir():
            raise UsageError(
                f"no task directory {task.root}: task {task_id!r} is not laid out in run {run.run_id} "
                f"(tasks: {', '.join(record.tasks) or 'none'})"
            )
        task_record = record.tasks.get(task_id)
        if task_record is None:
            raise UsageError(f"task {task_id!r} is not in {run.record} (tasks: {', '.join(record.tasks) or 'none'})")
        model_root = record.model_root(run.store)
        if model_root is not None and not model_root.is_dir():
            raise UsageError(f"the model snapshot {model_root} of run {run.run_id} does not exist")
        if editables_into is not None:
            try:
                install_snapshots([ref.resolve(run.store) for ref in record.snapshots], editables_into)
            except (EditableError, OSError, subprocess.SubprocessError) as exc:
                raise UsageError(str(exc)) from None
        if model_root is not None:
            # As `python -m` in its checkout: `open("data/sites.csv")` reads the model's data, on every executor.
            os.chdir(model_root)
        try:
            task_type = load_task_type(task_record.type, model_root, record.library_roots(run.store))
        except TaskTypeError as exc:
            raise UsageError(str(exc)) from None
        if not task.settings.is_file():
            raise UsageError(f"task {task_id!r} has no {task.settings}: write its settings (a JSON object) there")
        try:
            raw = json.loads(task.settings.read_text())
        except json.JSONDecodeError as exc:
            raise UsageError(f"{task.settings} is not valid JSON: {exc}") from None
        try:
            settings = task_type.validate_settings(raw)
        except SettingsError as exc:
            raise UsageError(f"{task.settings}: {exc}") from None
        inputs = resolve_inputs(run, task_id, task_record, type(task_type).inputs, record)
        return cls(run, task, record, task_record, model_root, task_type, settings, inputs)


INPUT_WAIT_S = 120.0
"""Seconds a pod awaits an input's merge marker: NFS's attribute cache may hide it from another client that long."""


def await_merged(run: RunLayout, upstream: str, record: RunRecord | None, wait_s: float = INPUT_WAIT_S) -> None:
    """Waits until a split upstream task's merge marker is visible, so no pod computes from a half-merged input.

    A cluster starts a downstream task as soon as the upstream coordinator exits, before this client may see the
    marker its merge wrote last.
    """
    upstream_record = record.tasks.get(upstream) if record is not None else None
    if upstream_record is None or not upstream_record.split:
        return
    marker = run.task(upstream).merge_marker
    deadline = time.monotonic() + wait_s
    while not marker.is_file():
        if time.monotonic() >= deadline:
            raise UsageError(f"input task {upstream!r} shows no merge marker after {wait_s:.0f} s: it has not merged")
        time.sleep(0.5)


def resolve_inputs(
    run: RunLayout, task_id: str, task_record: TaskRecord, ports: tuple[str, ...], record: RunRecord | None = None
) -> dict[str, Path]:
    """Input port -> the upstream `tasks/<task>/out/<port>` directory, checked against the type's input ports."""
    unknown = sorted(set(task_record.inputs) - set(ports))
    if unknown:
        raise UsageError(f"task {task_id!r}: its type has no input port(s) {unknown} (ports: {list(ports)})")
    missing = [port for port in ports if port not in task_record.inputs]
    if missing:
        raise UsageError(f"task {task_id!r}: input port(s) {missing} are not connected in run.json")
    inputs = {}
    for port, source in task_record.inputs.items():
        upstream, sep, upstream_port = source.rpartition(".")
        if not sep or not upstream:
            raise UsageError(f"task {task_id!r}: input {port!r} must name `<task>.<port>`, not {source!r}")
        await_merged(run, upstream, record)
        path = run.task(upstream).out_port(upstream_port)
        if not path.is_dir():
            raise UsageError(
                f"task {task_id!r}: input {port!r} reads {path}, which does not exist (has {upstream!r} ended?)"
            )
        inputs[port] = path
    return inputs


class Stopper:
    """SIGTERM (and SIGINT) set a flag and wake a pipe, so the pod stops claiming and ends within the grace."""

    def __init__(self) -> None:
        self.stopping = False
        self._read, self._write = os.pipe()
        os.set_blocking(self._write, False)
        os.set_blocking(self._read, False)

    def install(self) -> Stopper:
        signal.signal(signal.SIGTERM, self._handle)
        signal.signal(signal.SIGINT, self._handle)
        return self

    def _handle(self, signum: int, frame: object) -> None:
        self.stopping = True
        with contextlib.suppress(BlockingIOError):
            os.write(self._write, b"x")

    def fileno(self) -> int:
        return self._read

    def sleep(self, seconds: float) -> None:
        """Sleeps, waking early on SIGTERM."""
        if not self.stopping:
            multiprocessing.connection.wait([self._read], timeout=seconds)


# The report of a running pod is rewritten this often, from its own thread.
REPORT_EVERY_S = 10.0


@dataclass
class ReportKeeper:
    """The report of this pod incarnation, with the memory sampler that feeds it and the thread that rewrites it
    every `REPORT_EVERY_S` (without fsync; the last version, written by `finish`, is synced)."""

    task: TaskLayout
    report: WorkerReport
    sampler: MemorySampler
    oom_kills_at_start: int | None = None
    seconds: SecondsSketch = field(default_factory=SecondsSketch)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _stop: threading.Event = field(default_factory=threading.Event, repr=False)
    _thread: threading.Thread | None = field(default=None, repr=False)

    @classmethod
    def start(
        cls,
        setup: TaskSetup,
        env: PodEnv,
        role: str,
        processes: int,
        worker: str | None = None,
        every_s: float = REPORT_EVERY_S,
    ) -> ReportKeeper:
        probe = MemoryProbe.for_pod(env.cgroup)
        now = utcnow()
        report = WorkerReport(
            run_id=setup.run.run_id,
            task_id=setup.task.task_id,
            worker=worker or env.worker,
            role=role,  # type: ignore[arg-type]
            started_ms=int(now.timestamp() * 1000),
            task_type=setup.type_name,
            cost_value=setup.task_type.cost_value(setup.settings),
            model=setup.model_name,
            processes=processes,
            memory_source=probe.source,
            peak_memory_gb=0.0,
            per_process_gb=0.0,
            started_at=now,
            traceparent=env.traceparent,
        )
        keeper = cls(setup.task, report, MemorySampler(probe).start(), probe.oom_kills())
        keeper.write()
        keeper._thread = threading.Thread(target=keeper._loop, args=(every_s,), name="simrun-report", daemon=True)
        keeper._thread.start()
        return keeper

    def _loop(self, every_s: float) -> None:
        while not self._stop.wait(every_s):
            with contextlib.suppress(OSError):
                self.write(fsync=False)

    def add_unit(self, index: int, seconds: float) -> None:
        with self._lock:
            self.seconds.add(seconds)

    def add_seconds(self, sketch: SecondsSketch) -> None:
        """Adds the seconds of a claim's units (a sketch of their own, made by the process that computed them)."""
        with self._lock:
            self.seconds.merge(sketch)

    def _refresh(self) -> None:
        self.report.peak_memory_gb = round(self.sampler.peak_gb, 6)
        self.report.per_process_gb = round(self.sampler.peak_gb / self.report.processes, 6)
        self.report.memory_samples = self.sampler.samples
        kills = self.sampler.probe.oom_kills()
        if kills is not None:
            self.report.oom_kills = kills - (self.oom_kills_at_start or 0)

    def write(self, fsync: bool = True) -> None:
        with self._lock:
            self._refresh()
            self.report.unit_seconds = self.seconds.summary()
            data = self.report.model_dump(mode="json")
        write_json_atomic(self.report.path(self.task), data, durable=fsync)

    def finish(self, ended: WorkerEnd, exit_code: int, message: str = "") -> int:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.sampler.stop()
        with self._lock:
            self.report.ended = ended
            self.report.exit_code = exit_code
            self.report.message = message
            self.report.ended_at = utcnow()
        self.write()
        return exit_code

    def oom_killed(self) -> bool:
        with self._lock:
            self._refresh()
        return bool(self.report.oom_kills)


def exception_of(error: str) -> tuple[str, str]:
    """The exception's type and its last line from a formatted traceback (`RuntimeError`, `RuntimeError: …`)."""
    lines = [line for line in error.strip().splitlines() if line.strip()]
    last = lines[-1].strip() if lines else "failed"
    kind, sep, _ = last.partition(":")
    return (kind if sep and " " not in kind else last.split(" ")[0]), last


def write_failure(
    task: TaskLayout, message: str, *, unit: int | None, worker: str, exception: str, detail: str
) -> None:
    """Writes `tasks/<task>/failure.json` atomically, before the pod exits non-zero: the tracker shows its
    `message` as the task's."""
    write_json_atomic(
        task.failure,
        {"message": message, "unit": unit, "worker": worker, "exception": exception, "detail": detail},
    )


def die_with_parent() -> None:
    """Asks the kernel to SIGKILL this process when its parent dies, so a killed pod leaves no orphans."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _ignored(signum: int, frame: object) -> None:
    """A handler that does nothing: SIGTERM and SIGINT pass over a pod's child."""


def child_signals() -> None:
    """A child of a pod lets SIGTERM and SIGINT pass: the pod's main process decides how it stops. A handler that
    does nothing, not SIG_IGN, which every program the child starts would inherit (a `timeout 60 solver`, an MPI
    launcher or a solver's own clean-up would then never see SIGTERM); a handler is reset to the default at exec."""
    signal.signal(signal.SIGTERM, _ignored)
    signal.signal(signal.SIGINT, _ignored)
    die_with_parent()


@dataclass
class ChildOutcome:
    """How user code run in a child process ended."""

    value: Any = None
    error: str | None = None
    exitcode: int | None = None
    stopped: bool = False
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return self.error is None and not self.stopped and self.exitcode == 0


def _child_main(conn: Connection, fn: Callable[[], Any]) -> None:
    child_signals()
    try:
        value = fn()
    except BaseException:
        conn.send(("error", traceback.format_exc()))
    else:
        conn.send(("ok", value))
    conn.close()


def run_in_child(
    fn: Callable[[], Any], stopper: Stopper, tick: Callable[[], None] | None = None, limit_s: float | None = None
) -> ChildOutcome:
    """Runs `fn` in a forked child (user code, so SIGTERM can end it at once); `tick` runs about every second; a
    child still running after `limit_s` seconds is killed (`timed_out`)."""
    parent, child = MP.Pipe(duplex=False)
    process = MP.Process(target=_child_main, args=(child, fn), daemon=True)
    process.start()
    child.close()
    deadline = time.monotonic() + limit_s if limit_s is not None else None
    message: tuple[str, Any] | None = None
    while True:
        wait_s = 1.0 if deadline is None else min(1.0, max(deadline - time.monotonic(), 0.0) + 0.01)
        ready = multiprocessing.connection.wait([parent, process.sentinel, stopper.fileno()], timeout=wait_s)
        if stopper.stopping:
            process.kill()
            process.join()
            return ChildOutcome(stopped=True, exitcode=process.exitcode)
        if deadline is not None and not ready and time.monotonic() >= deadline and process.is_alive():
            if process.pid is not None:
                kill_tree(process.pid)  # and what the run started
            process.kill()
            process.join()
            return ChildOutcome(exitcode=process.exitcode, timed_out=True)
        if parent in ready:
            with contextlib.suppress(EOFError):
                message = parent.recv()
        if process.sentinel in ready or message is not None:
            if message is None and parent.poll():
                with contextlib.suppress(EOFError):
                    message = parent.recv()
            process.join()
            break
        if tick is not None:
            tick()
    if message is None:
        return ChildOutcome(error=f"the process {death_of(process.exitcode)}", exitcode=process.exitcode)
    kind, value = message
    if kind == "error":
        return ChildOutcome(error=value, exitcode=process.exitcode)
    return ChildOutcome(value=value, exitcode=process.exitcode)


def death_of(returncode: int | None) -> str:
    """How a process that gave no answer ended, in words: `died of SIGSEGV (exit code 139)`, `exited with status 3`."""
    if returncode is None:
        return "died (its exit status is unknown)"
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"died of {name} (exit code {signal_exit_code(returncode)})"
    return f"exited with status {returncode} (os._exit or a C library's exit)"


def signal_exit_code(returncode: int | None) -> int:
    """A process's exit status as a shell reports it: 128+N for death by signal N."""
    if returncode is None:
        return EXIT_FAILED
    return 128 - returncode if returncode < 0 else returncode


def fail(prog: str, message: str) -> None:
    """One line on stderr."""
    print(f"{prog}: error: {' '.join(message.split())}", file=sys.stderr)
