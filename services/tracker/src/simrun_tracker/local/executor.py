"""The local executor: pods as process groups on this machine, admitted, preempted and retried by Kueue's rules."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from simrun_core.config import LocalExecutorConfig
from simrun_core.errors import FailedPrecondition, InvalidArgument, NotFound
from simrun_core.identity import priority_value
from simrun_planner import Node
from simrun_runtime.layout import WORKER_NAME, StoreLayout, UnsafePath, checked_worker, open_beneath, open_log
from simrun_runtime.record import RunRecord

from simrun_tracker.executor import (
    SIGKILL_EXIT,
    SIGTERM_EXIT,
    STORE_PATH_VARIABLES,
    ChangeListener,
    MemoryKill,
    PodHistory,
    PodPhase,
    PodSpec,
    PodStatus,
    RunRecovery,
    RunSpec,
    TaskOrdering,
)
from simrun_tracker.local.admission import Placed, Slot, Waiting, decide, decide_arrivals
from simrun_tracker.local.config import configured_nodes, default_nodes
from simrun_tracker.local.confinement import PodConfinement, PodPaths, pod_environment
from simrun_tracker.local.memory import (
    GIB,
    CgroupPool,
    PodCgroup,
    anon_memory_by_group,
    detect_cgroup_root,
    open_cgroups,
)

logger = logging.getLogger(__name__)

WATCHDOG_INTERVAL_S = 0.2
"""Seconds between two samples of the anonymous memory of running pods: the watchdog's limit where a pod has no
cgroup, and every pod's measured peak (`PodStatus.peak_memory_gb`)."""
PEAK_GROWTH_TOLD = 0.25
"""The growth of a pod's measured peak, as a part of what its listeners were last told, at which they are told
again, and never for less than `PEAK_GROWTH_TOLD_BYTES`."""
PEAK_GROWTH_TOLD_BYTES = 64 << 20
PEAK_FIRST_TOLD_AFTER_S = 1.0
"""Seconds a pod runs before its listeners are first told its measured peak (sooner if it passes
`PEAK_GROWTH_TOLD_BYTES`): a sample of a process still starting is a few MiB, and what it grows to next would stay
untold below the least growth."""

STOPPED = "stopped"
"""The message of a pod stopped with its run or task."""

LOG_POLL_S = 0.25
"""Seconds between two reads of a followed pod log."""

LOG_READ_BYTES = 1 << 20
"""The most of a pod log read at once; a line longer than this is sent in pieces of it."""

Launcher = Callable[[PodSpec], list[str]]
"""How this machine runs a pod: its command line, from the pod's role and environment (a local concern)."""
# `sh -c` puts the pod into its cgroup before the command is exec'd, so no byte of user code runs outside of it.
_ENTER_CGROUP = 'echo $$ > "$0" && exec "$@"'


def _nice_prefix(niceness: int) -> list[str]:
    """The command words that start a pod at `niceness`: none for 0, else `nice -n N` (niceness is inherited
    through exec, so no byte of user code runs at the server's own)."""
    if not 0 <= niceness <= 19:
        raise InvalidArgument(f"pod_nice must be from 0 to 19, not {niceness}")
    if niceness == 0:
        return []
    nice = shutil.which("nice")
    if nice is None:
        raise InvalidArgument(
            "pods are niced but this machine has no `nice` command: install coreutils or set executor.local.pod_nice: 0"
        )
    return [nice, "-n", str(niceness)]


def gib(value: float) -> str:
    """GiB for a message: `3`, `1.5`, `0.375`."""
    return f"{round(value, 3):g}"


@dataclass
class _Pod:
    spec: PodSpec
    status: PodStatus
    priority: int
    seq: int
    """Queue order while pending, admission order while running."""
    process: subprocess.Popen[bytes] | None = None
    cgroup: PodCgroup | None = None
    scratch: Path | None = None
    """The attempt's own scratch folder (its HOME and TMPDIR), removed when it exits."""
    stopping: str | None = None
    """Why it was sent SIGTERM: `preempted`, `evicted` or `stopped`."""
    kill_at: float | None = None
    watchdog_bytes: int | None = None
    """The anonymous memory the watchdog saw when it killed the pod."""
    claim: str | None = None
    log_fd: int | None = None
    """The executor's own descriptor of the attempt's log: its size is read through it, not through the path,
    which the pod (its task folder is its own) may rename or replace while it writes on."""
    log_start: int = 0
    """The log's size when the attempt began: its bound counts what this attempt printed."""
    log_over: int | None = None
    """What the attempt had printed when it was killed for printing more than its bound."""
    attempt: str = ""
    """The name of its current attempt (`<pod id>.<attempt>`, with only file-name characters)."""
    image: str = ""
    """The image its attempt runs, where attempts run images (the containers executor)."""
    told_peak_bytes: int = 0
    """The measured peak the listeners were last told of (see `_measured`)."""
    started_at: float = 0.0
    """When its attempt's process started (monotonic seconds)."""


class LocalExecutor:
    """Runs pods as process groups on this machine's nodes (see `simrun_tracker.executor.Executor`).

    One scheduler thread admits pending pods in priority order (then first in, first out) onto nodes with their
    cores and memory free, preempts running pods of strictly lower priority with SIGTERM when a pod fits nowhere,
    reaps exits and retries them by their exit code, and enforces memory limits: by the pod's memory cgroup where
    one can be made, else by killing its process group once its anonymous memory passes the limit.

    Args:
        store_root: the run store on this machine; pods' store-relative paths are resolved against it.
        launcher: a pod's command line on this machine (interpreter of its environment, runtime module).
        nodes: the nodes; None for this machine as one node (`default_nodes`).
        cgroup_root: the memory cgroup mount (v1 `/sys/fs/cgroup/memory` or v2 `/sys/fs/cgroup`), `"auto"` to detect
            it, or None to enforce limits with the watchdog only.
        poll_s: seconds between two passes of the scheduler.
        confinement: how pods are confined (`PodConfinement`); None for Landlock where the kernel has it.
        pod_variables: more of the server's environment variables that reach pods (the allow-list's extension).
        log_bytes: what an attempt of a pod may print; past it, checked with the memory watchdog's samples, the
            pod is killed, its log cut back to the bound and it fails (not retried) with a message.
        pod_nice: the niceness pods start at above the server's own (0 to 19): pods compute on the cores the
            server and its clients answer from, and a niced pod takes only what they leave. 0: the server's own.

    Raises:
        InvalidArgument: no node, nodes of one name, or a niceness out of range or without the `nice` command.
    """

    ordering = TaskOrdering.DRIVER

    def __init__(
        self,
        store_root: Path,
        launcher: Launcher,
        nodes: list[Node] | None = None,
        cgroup_root: Path | Literal["auto"] | None = "auto",
        poll_s: float = 0.1,
        confinement: PodConfinement | None = None,
        pod_variables: list[str] | None = None,
        log_bytes: int = 1 << 30,
        pod_nice: int = 0,
    ) -> None:
        self._nodes = list(nodes) if nodes is not None else default_nodes()
        if not self._nodes:
            raise InvalidArgument("the local executor needs at least one node")
        names = [n.name for n in self._nodes]
        if len(set(names)) != len(names):
            raise InvalidArgument(f"node names must be unique: {names}")
        self.executor_id = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._store = StoreLayout(Path(store_root))
        self._launcher = launcher
        self._confinement = confinement or PodConfinement()
        self._pod_variables = list(pod_variables or [])
        self._log_bytes = log_bytes
        self._nice = _nice_prefix(pod_nice)
        self._niceness = pod_nice
        self._scratch_root = Path(tempfile.mkdtemp(prefix=f"simrun-scratch-{self.executor_id}-"))
        self._listeners: list[ChangeListener] = []
        self._history: dict[tuple[str, str, str], PodHistory] = {}
        root = detect_cgroup_root() if cgroup_root == "auto" else cgroup_root
        self._cgroups: CgroupPool | None = open_cgroups(root, self.executor_id)
        self._poll_s = poll_s
        self._reservations: dict[str, str] = {}
        self._pods: dict[str, _Pod] = {}
        self._by_run: dict[str, list[str]] = {}
        # The pods a scheduler pass looks at, so its cost follows what runs and waits, not every pod of the past.
        self._running: dict[str, _Pod] = {}
        self._pending: dict[str, _Pod] = {}
        self._seq = 0
        self._lock = threading.RLock()
        self._wake = threading.Event()
        self._halt = threading.Event()
        self._admission_due = True
        """Something admission depends on changed (a pod went or ended, a reservation): the next pass considers
        every pending pod. Pending pods are considered again only then, or when pods arrive, so a long queue costs
        nothing while nothing changes."""
        self._arrived: list[str] = []
        """Pods queued since the last pass while nothing else changed. The next pass considers only them and the
        pods holding a claim: every other pending pod found no room and no victims then, and a pass over the same
        state with only more pods in the queue gives it neither (`admission.decide` says why)."""
        self._claimed: set[str] = set()
        """Pending pods waiting on a node whose preempted pods they are waiting for."""
        self._closed = False
        self._forgotten: set[str] = set()
        """Ended runs the tracker asks no more about: dropped by the scheduler pass once their pods have stopped."""
        self._next_watchdog = 0.0
        self._thread = threading.Thread(target=self._loop, name=f"simrun-local-{self.executor_id}", daemon=True)
        self._thread.start()

    @classmethod
    def from_config(cls, config: LocalExecutorConfig, store_root: Path, launcher: Launcher) -> LocalExecutor:
        """The executor a server config's `executor.local` describes: nodes (or this machine), cgroups, poll."""
        return cls(
            store_root,
            launcher,
            nodes=configured_nodes(config.nodes),
            cgroup_root=config.cgroup_root,
            poll_s=config.poll_s,
            confinement=PodConfinement(config.confinement, network=config.pod_network),
            pod_variables=config.pod_variables,
            log_bytes=config.log_bytes_per_pod,
            pod_nice=config.pod_nice,
        )

    @property
    def cgroup_version(self) -> int | None:
        """1 or 2 where pods get memory cgroups; None where the watchdog limits them."""
        return self._cgroups.version if self._cgroups else None

    def __enter__(self) -> LocalExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # The port.

    def subscribe(self, listener: ChangeListener) -> None:
        with self._lock:
            self._listeners.append(listener)

    def nodes(self) -> list[Node]:
        with self._lock:
            return [dataclasses.replace(n, reserved_by=self._reservations.get(n.name)) for n in self._nodes]

    def start_pods(self, pods: list[PodSpec]) -> None:
        priorities = {}
        for spec in pods:
            priorities[spec.pod_id] = priority_value(spec.priority_class)
            if spec.cores < 0 or spec.memory_gb <= 0 or spec.processes < 1:
                raise InvalidArgument(f"pod {spec.pod_id}: cores >= 0, memory_gb > 0 and processes >= 1 are required")
        with self._lock:
            if self._closed:
                raise FailedPrecondition("the local executor is closed")
            for spec in pods:
                if spec.pod_id in self._pods:
                    continue
                history = self._history.pop((spec.run_id, spec.task_id, spec.worker), None)
                status = PodStatus(spec=spec, phase=PodPhase.PENDING, memory_gb=spec.memory_gb)
                if history is not None:
                    status.attempts, status.sigkills = history.attempts, history.sigkills
                    status.memory_kills = [dataclasses.replace(k) for k in history.memory_kills]
                    if self._retried(status):
                        status.memory_gb = spec.retry_memory_gb
                self._pods[spec.pod_id] = _Pod(spec, status, priorities[spec.pod_id], self._next_seq())
                self._pending[spec.pod_id] = self._pods[spec.pod_id]
                self._by_run.setdefault(spec.run_id, []).append(spec.pod_id)
                # New pods wait for the next scheduler pass (at most `poll_s`) rather than waking it: under a burst
                # of submissions, one pass admits them all, and the submitting thread does not hand the interpreter
                # lock to the scheduler's thread once per pod.
                self._arrived.append(spec.pod_id)

    def start_run(self, run: RunSpec) -> None:
        raise FailedPrecondition("the local executor starts a run's tasks one by one (start_pods), not a whole run")

    def restore(self, recovery: RunRecovery) -> None:
        """Re-applies each pod's memory kills and attempts and the run's reservation, before its pods start again.

        The history first: a reservation that cannot be taken again (its node is gone from the config) raises, and
        must not cost the pods their kills for memory (a second one must still fail the pod).
        """
        with self._lock:
            for pod in recovery.pods:
                self._history[(recovery.run_id, pod.task_id, pod.worker)] = pod
        if recovery.reservation:
            self.reserve(recovery.reservation, recovery.run_id)

    def logs(
        self, run_id: str, task_id: str, worker: str, follow: bool, alive: Callable[[], bool] = lambda: True
    ) -> Iterator[tuple[str, str]]:
        """Reads `tasks/<task>/logs/<worker>.log` of the store, from where the last read stopped.

        The logs folder is in the task's folder, which its pods write: only regular files named by a worker are
        read, never through a symbolic link (a task could point one at the tokens file).
        """
        task = self._store.run(run_id).task(task_id)
        offsets: dict[str, int] = {}
        wanted = checked_worker(worker) if worker else None
        while True:
            live = follow and any(not p.status.phase.final for p in self._pods_of(run_id) if p.spec.task_id == task_id)
            for name in _log_names(task.logs, wanted):
                try:
                    fd = open_beneath(task.root, "logs", name)
                except (UnsafePath, OSError):
                    continue
                with os.fdopen(fd, "rb") as f:
                    offset = offsets.get(name, 0)
                    if os.fstat(f.fileno()).st_size < offset:  # cut back past what was read: go on from the cut
                        offset = self._log_cut(run_id, task_id, name)
                    while True:  # in bounded reads: a pod may have printed a gigabyte since the last one
                        f.seek(offset)
                        data = f.read(LOG_READ_BYTES)
                        cut = data.rfind(b"\n") + 1 or (len(data) if len(data) == LOG_READ_BYTES else 0)
                        if not cut:  # nothing, or the start of a line still being printed
                            break
                        offset = offsets[name] = offset + cut
                        yield name, data[:cut].decode(errors="replace")
            if not live or not alive():
                return
            time.sleep(LOG_POLL_S)

    def _log_cut(self, run_id: str, task_id: str, name: str) -> int:
        """Where the log `name` of a task was cut back (`_close_log`): what simrun wrote after it follows."""
        for pod in self._pods_of(run_id):
            if pod.spec.task_id == task_id and f"{pod.spec.worker}.log" == name:
                return pod.log_start + self._log_bytes
        return 0

    def _pods_of(self, run_id: str) -> list[_Pod]:
        with self._lock:
            return [self._pods[pod_id] for pod_id in self._by_run.get(run_id, [])]

    def pods(self, run_id: str) -> list[PodStatus]:
        with self._lock:
            return [_copy(self._pods[pod_id].status) for pod_id in self._by_run.get(run_id, [])]

    def stop_pods(self, run_id: str, task_id: str | None = None) -> None:
        with self._lock:
            for pod_id in self._by_run.get(run_id, []):
                pod = self._pods[pod_id]
                if task_id is None or pod.spec.task_id == task_id:
                    self._stop(pod)
        self._poke()

    def reserve(self, node: str, run_id: str) -> None:
        with self._lock:
            if node not in {n.name for n in self._nodes}:
                raise NotFound(f"no node {node!r}; the nodes are {', '.join(n.name for n in self._nodes)}")
            holder = self._reservations.get(node)
            if holder is not None and holder != run_id:
                raise FailedPrecondition(f"node {node!r} is reserved by run {holder}")
            self._reservations[node] = run_id
            # As a NoExecute taint: the pods of other runs leave the node and wait for admission elsewhere.
            for pod in self._pods.values():
                if pod.status.phase is PodPhase.RUNNING and pod.status.node == node and pod.spec.run_id != run_id:
                    self._terminate(pod, "evicted")
        self._poke()

    def release(self, run_id: str) -> None:
        with self._lock:
            for node in [n for n, holder in self._reservations.items() if holder == run_id]:
                del self._reservations[node]
        self._poke()

    def forget(self, run_id: str) -> None:
        with self._lock:
            if run_id in self._by_run or any(key[0] == run_id for key in self._history):
                self._forgotten.add(run_id)
        self._wake.set()

    def close(self) -> None:
        """Stops this machine's pods with the executor (its own choice: processes cannot outlive their parent's
        supervision here); a restarted tracker starts them again from their ledgers."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for pod in self._pods.values():
                self._stop(pod)
            grace = max((p.spec.grace_s for p in self._pods.values() if p.process is not None), default=0.0)
        self._poke()
        deadline = time.monotonic() + grace + 5.0
        while time.monotonic() < deadline:
            with self._lock:
                if not any(p.process is not None for p in self._pods.values()):
                    break
            time.sleep(self._poll_s / 2)
        self._halt.set()
        self._poke()
        self._thread.join()
        with self._lock:
            for pod in self._pods.values():
                if pod.process is not None:
                    self._signal(pod, signal.SIGKILL)
                    self._exited(pod, pod.process.wait())
            if self._cgroups is not None:
                self._cgroups.close()
        shutil.rmtree(self._scratch_root, ignore_errors=True)

    # The scheduler thread.

    def _poke(self) -> None:
        self._admission_due = True
        self._wake.set()

    def _loop(self) -> None:
        while not self._halt.is_set():
            try:
                with self._lock:
                    self._tick()
            except Exception:
                logger.exception("the local executor's scheduler pass failed")
            self._wake.wait(self._poll_s)
            self._wake.clear()

    def _tick(self) -> None:
        now = time.monotonic()
        if self._forgotten:
            self._drop_forgotten()
        for pod in list(self._running.values()):
            if pod.process is None:
                continue
            code = pod.process.poll()
            if code is not None:
                self._exited(pod, code)
            elif pod.kill_at is not None and now >= pod.kill_at:
                self._signal(pod, signal.SIGKILL)
                pod.kill_at = None
        if now >= self._next_watchdog:
            self._next_watchdog = now + WATCHDOG_INTERVAL_S
            self._watchdog()
            self._bound_logs()
        if self._closed:
            return
        if self._admission_due:
            self._admission_due = False
            self._arrived.clear()
            self._admit(list(self._pending.values()), whole=True)
        elif self._arrived:
            considered = dict.fromkeys([*self._arrived, *self._claimed])
            self._arrived.clear()
            self._admit([self._pending[p] for p in considered if p in self._pending], whole=False)

    def _drop_forgotten(self) -> None:
        """Drops the pods of forgotten runs whose pods have all stopped (a stopping pod is still supervised)."""
        for run_id in list(self._forgotten):
            pod_ids = self._by_run.get(run_id, [])
            if any(self._pods[p].process is not None or not self._pods[p].status.phase.final for p in pod_ids):
                continue
            for pod_id in pod_ids:
                del self._pods[pod_id]
            self._by_run.pop(run_id, None)
            for key in [k for k in self._history if k[0] == run_id]:
                del self._history[key]
            self._forgotten.discard(run_id)

    def _admit(self, considered: list[_Pod], *, whole: bool) -> None:
        """One admission pass over `considered`: every pending pod (`whole`), or those arrived and claiming, which
        decide as the whole queue would (`decide_arrivals`)."""
        slots = [
            Slot(n.name, n.allocatable_cores, n.allocatable_memory_gb, self._reservations.get(n.name))
            for n in self._nodes
        ]
        running = [
            Placed(
                p.spec.pod_id,
                p.spec.run_id,
                p.status.node or "",
                p.spec.cores,
                p.status.memory_gb,
                p.priority,
                p.seq,
                terminating=p.stopping is not None,
            )
            for p in self._running.values()
            if p.process is not None
        ]
        pending = _waiting(considered)
        if not pending:
            return
        if whole:
            decisions = decide(slots, running, pending)
        else:
            decisions = decide_arrivals(slots, running, pending, lambda: _waiting(self._pending.values()))
        for pod_id, node in decisions.claims.items():
            self._pods[pod_id].claim = node
            if node is None:
                self._claimed.discard(pod_id)
            else:
                self._claimed.add(pod_id)
        for preemption in decisions.preempt:
            for victim in preemption.victims:
                self._terminate(self._pods[victim], "preempted")
        for pod_id in decisions.unschedulable:
            pod = self._pods[pod_id]
            need = f"needs {gib(pod.spec.cores)} cores and {gib(pod.status.memory_gb)} GiB"
            if pod.status.memory_kills:
                need = f"the retry after a kill for memory {need}"
            self._final(pod, PodPhase.FAILED, f"{need}; no node has that much")
        for pod_id, node in decisions.admit:
            self._launch(self._pods[pod_id], node)

    def _launch(self, pod: _Pod, node: str) -> None:
        spec, status = pod.spec, pod.status
        self._pending.pop(spec.pod_id, None)
        status.attempts += 1
        status.peak_memory_gb = status.peak_memory_gb or 0.0
        status.node = node
        status.phase = PodPhase.RUNNING
        status.message = ""
        pod.claim = None
        self._claimed.discard(spec.pod_id)
        pod.seq = self._next_seq()
        self._changed(pod)
        limit = int(status.memory_gb * GIB)
        processes = spec.processes_after(self._retried(status))
        run = self._store.run(spec.run_id)
        name = pod.attempt = f"{re.sub(r'[^A-Za-z0-9._-]', '_', spec.pod_id)}.{status.attempts}"
        try:
            command, env = self._attempt(pod, name, processes, limit)
            with os.fdopen(open_log(run.task(spec.task_id), spec.worker), "ab") as log:
                log.write(
                    f"=== simrun: attempt {status.attempts} of pod {spec.pod_id} on node {node}, "
                    f"memory limit {gib(status.memory_gb)} GiB "
                    f"({gib(spec.per_process_gb(status.memory_gb, processes))} GiB per process, {self._limit_by()}), "
                    f"cores {spec.cores}, nice +{self._niceness}, {self._contained(pod)}, "
                    f"{_now()} ===\n".encode()
                )
                log.flush()
                pod.log_fd, pod.log_start = os.dup(log.fileno()), log.tell()
                pod.process = subprocess.Popen(
                    [*self._nice, *command],
                    cwd=run.root,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
                pod.started_at = time.monotonic()
                self._running[spec.pod_id] = pod
        except (OSError, ValueError, subprocess.SubprocessError, FailedPrecondition, InvalidArgument) as exc:
            # A pod that cannot be started fails rather than staying "running" with no process.
            if pod.cgroup is not None:
                pod.cgroup.remove()
                pod.cgroup = None
            self._close_log(pod)
            self._remove_scratch(pod)
            self._final(pod, PodPhase.FAILED, f"cannot start: {exc}")

    def _attempt(self, pod: _Pod, name: str, processes: int, limit: int) -> tuple[list[str], dict[str, str]]:
        """The command line and environment of one attempt of a pod, with what it needs made (its scratch, its
        cgroup): a confined process of its environment's interpreter that enters its cgroup before the command.

        Raises:
            OSError, ValueError, FailedPrecondition, InvalidArgument: the attempt cannot be made (it then fails).
        """
        spec = pod.spec
        pod.scratch = self._scratch_root / name
        pod.scratch.mkdir(mode=0o700)
        env = self._variables(spec, processes, pod.scratch)
        command = list(self._launcher(spec))
        if self._cgroups is not None:
            pod.cgroup = self._cgroups.create(name, limit)
            env["SIMRUN_CGROUP"] = str(pod.cgroup.path)
        paths = PodPaths.of(
            self._store,
            spec.run_id,
            spec.task_id,
            _snapshots(self._store.run(spec.run_id).record),
            pod.scratch,
            pod.cgroup.path if pod.cgroup is not None else None,
        )
        command = self._confinement.command(command[0], command, paths)
        if pod.cgroup is not None:
            command = ["/bin/sh", "-c", _ENTER_CGROUP, str(pod.cgroup.procs_file), *command]
        return command, env

    def _failure(self, code: int, described: str) -> str:
        """The message of an attempt that failed with a non-zero exit code and nothing else to say of it."""
        return f"failed with {described}"

    def _limit_by(self) -> str:
        """How memory limits are held, for the attempt's first log line."""
        return f"cgroup v{self._cgroups.version}" if self._cgroups else "watchdog"

    def _contained(self, pod: _Pod) -> str:
        """How the pod is contained, for the attempt's first log line."""
        return self._confinement.describe()

    def _signal(self, pod: _Pod, sig: signal.Signals) -> None:
        """Sends `sig` to the pod's attempt: here, its process group."""
        if pod.process is not None:
            _signal_group(pod.process.pid, sig)

    def _ended(self, pod: _Pod) -> None:
        """What an attempt leaves dies with it: its process group, then its cgroup."""
        self._signal(pod, signal.SIGKILL)
        if pod.cgroup is not None:
            pod.cgroup.remove()

    def _variables(self, spec: PodSpec, processes: int, scratch: Path) -> dict[str, str]:
        """A pod's environment variables: the runtime contract with the store's paths here, a private HOME and
        TMPDIR, and of the server's only the allow-list (`pod_environment`), never its secrets or its home."""
        contract = {**spec.contract, "SIMRUN_PROCESSES": str(processes)}
        for name in STORE_PATH_VARIABLES & spec.contract.keys():
            contract[name] = str(self._store.root / spec.contract[name])
        contract.pop("SIMRUN_CGROUP", None)
        return pod_environment(contract, scratch, extra=self._pod_variables)

    def _remove_scratch(self, pod: _Pod) -> None:
        if pod.scratch is not None:
            shutil.rmtree(pod.scratch, ignore_errors=True)
            pod.scratch = None

    @staticmethod
    def _retried(status: PodStatus) -> bool:
        """Whether the pod was killed once (for memory, or by SIGKILL) and runs at its retry memory."""
        return bool(status.memory_kills) or status.sigkills > 0

    def _watchdog(self) -> None:
        """Samples the anonymous memory of every running pod: its cgroup's where it has one, else its process
        group's (and kills the group past its limit). The most seen is the pod's measured peak."""
        watched: dict[int, _Pod] = {}
        for pod in self._running.values():
            if pod.process is None:
                continue
            if pod.cgroup is None:
                watched[pod.process.pid] = pod
            elif (anon := pod.cgroup.anon_bytes()) is not None:
                self._measured(pod, anon)
        if not watched:
            return
        for pgid, anon in anon_memory_by_group(watched).items():
            pod = watched[pgid]
            self._measured(pod, anon)
            if pod.watchdog_bytes is None and anon > pod.status.memory_gb * GIB:
                pod.watchdog_bytes = anon
                _signal_group(pgid, signal.SIGKILL)

    def _measured(self, pod: _Pod, anon_bytes: int) -> None:
        """Raises the pod's measured peak to a sample of its anonymous memory, and tells the listeners of it once
        the pod has run a second (`PEAK_FIRST_TOLD_AFTER_S`) and whenever it has grown by a quarter (and 64 MiB)
        since they were told: a running pod's memory then shows while it runs, and a pod costs its run's record a
        bounded number of writes (about 20 from a small process to 64 GiB), none while its memory holds still.
        """
        peak = max(pod.status.peak_memory_gb or 0.0, anon_bytes / GIB)
        pod.status.peak_memory_gb = peak
        peak_bytes, told = int(peak * GIB), pod.told_peak_bytes
        if told == 0:
            settled = time.monotonic() - pod.started_at >= PEAK_FIRST_TOLD_AFTER_S
            due = peak_bytes > 0 and (settled or peak_bytes >= PEAK_GROWTH_TOLD_BYTES)
        else:
            due = peak_bytes >= told + max(told * PEAK_GROWTH_TOLD, PEAK_GROWTH_TOLD_BYTES)
        if due:
            pod.told_peak_bytes = peak_bytes
            self._changed(pod)

    def _bound_logs(self) -> None:
        """Kills the pods whose attempt printed more than the bound (their exit fails them, `_exited`)."""
        for pod in self._running.values():
            if pod.process is None or pod.log_fd is None or pod.log_over is not None:
                continue
            printed = os.fstat(pod.log_fd).st_size - pod.log_start
            if printed > self._log_bytes:
                pod.log_over = printed
                self._signal(pod, signal.SIGKILL)

    def _close_log(self, pod: _Pod) -> int | None:
        """Closes the executor's descriptor of the attempt's log; cuts the log back to its bound first if the pod
        was killed for printing past it. Returns what the attempt had printed then, or None."""
        over, pod.log_over = pod.log_over, None
        if pod.log_fd is None:
            return over
        try:
            if over is not None:
                os.ftruncate(pod.log_fd, pod.log_start + self._log_bytes)
                os.pwrite(pod.log_fd, b"\n", pod.log_start + self._log_bytes)  # simrun's line starts a line
        except OSError:
            logger.exception("cutting back the log of pod %s", pod.spec.pod_id)
        finally:
            os.close(pod.log_fd)
            pod.log_fd = None
        return over

    def _exited(self, pod: _Pod, returncode: int) -> None:
        """Records an exit and decides what follows, as Argo's retry strategy and Kueue's requeueing would."""
        assert pod.process is not None
        self._admission_due = True
        status = pod.status
        # Popen reports a signal N as -N; a container's exit code is 128 + N.
        code = 128 - returncode if returncode < 0 else returncode
        status.exit_code = code
        described = _describe(returncode)
        evidence = None
        if pod.watchdog_bytes is not None:
            evidence = "watchdog"
        elif pod.cgroup is not None and pod.cgroup.killed_for_memory(sigkilled=code == SIGKILL_EXIT):
            evidence = "cgroup"
        seen = ""
        if evidence == "watchdog" and pod.watchdog_bytes:
            seen = f", {gib(pod.watchdog_bytes / GIB)} GiB of anonymous memory sampled"
        elif evidence == "cgroup" and pod.cgroup is not None and (peak := pod.cgroup.peak_bytes()):
            seen = f", peak {gib(peak / GIB)} GiB"
        self._ended(pod)
        printed = self._close_log(pod)
        self._remove_scratch(pod)
        pod.process = None
        self._running.pop(pod.spec.pod_id, None)
        pod.cgroup = None
        stopping, pod.stopping, pod.kill_at = pod.stopping, None, None
        pod.watchdog_bytes = None
        sigkilled = code == SIGKILL_EXIT and stopping is None

        if printed is not None:
            self._final(
                pod,
                PodPhase.FAILED,
                f"printed more than the {self._log_bytes} bytes a pod may (executor.local.log_bytes_per_pod), "
                f"{printed} when it was killed; its log is cut back to them: print less, write results as outputs",
                described,
            )
        elif code == 0:
            self._final(pod, PodPhase.SUCCEEDED, "", described)
        elif stopping == STOPPED:
            self._final(pod, PodPhase.FAILED, STOPPED, described)
        elif evidence is not None or sigkilled:
            retried = self._retried(status)
            processes = pod.spec.processes_after(retried)
            per_process = gib(pod.spec.per_process_gb(status.memory_gb, processes))
            if evidence is not None:
                kill = MemoryKill(status.memory_gb, pod.spec.per_process_gb(status.memory_gb, processes), evidence)
                status.memory_kills.append(kill)
                what = (
                    f"killed for memory ({evidence}{seen}) with {gib(kill.memory_gb)} GiB "
                    f"({per_process} GiB per process)"
                )
            else:
                status.sigkills += 1
                what = f"killed (SIGKILL), not for memory, with {gib(status.memory_gb)} GiB"
            if not retried:
                retry = pod.spec
                self._requeue(
                    pod,
                    f"{what}; retried with {gib(retry.retry_memory_gb)} GiB "
                    f"({gib(retry.retry_per_worker_gb)} GiB per process)",
                    described,
                )
                status.memory_gb = pod.spec.retry_memory_gb
            elif evidence is not None:
                self._final(
                    pod,
                    PodPhase.FAILED,
                    f"killed for memory twice; the retry had {gib(status.memory_gb)} GiB "
                    f"({per_process} GiB per process)",
                    described,
                )
            else:
                self._final(pod, PodPhase.FAILED, f"{what} after its retry; not retried again", described)
        elif stopping is not None or code == SIGTERM_EXIT:
            status.preemptions += 1
            why = {"preempted": "preempted by a higher priority", "evicted": "evicted by a reservation"}
            self._requeue(pod, f"{why.get(stopping or '', 'stopped on SIGTERM')}; queued again", described)
        else:
            self._final(pod, PodPhase.FAILED, self._failure(code, described), described)

    def _requeue(self, pod: _Pod, message: str, described: str) -> None:
        self._log(pod, f"exited with {described}: {message}")
        pod.status.phase = PodPhase.PENDING
        pod.status.node = None
        pod.status.message = message
        pod.seq = self._next_seq()
        self._pending[pod.spec.pod_id] = pod
        self._changed(pod)

    def _final(self, pod: _Pod, phase: PodPhase, message: str, described: str | None = None) -> None:
        if described is not None:
            self._log(pod, f"exited with {described}: {phase.value}{'; ' + message if message else ''}")
        pod.status.phase = phase
        pod.status.message = message
        pod.claim = None
        self._claimed.discard(pod.spec.pod_id)
        self._pending.pop(pod.spec.pod_id, None)
        self._changed(pod)

    def _changed(self, pod: _Pod) -> None:
        for listener in self._listeners:
            try:
                listener(pod.spec.run_id)
            except Exception:
                logger.exception("a listener of the local executor failed")

    def _stop(self, pod: _Pod) -> None:
        if pod.status.phase is PodPhase.PENDING:
            self._final(pod, PodPhase.FAILED, STOPPED)
        elif pod.process is not None:
            self._terminate(pod, STOPPED)

    def _terminate(self, pod: _Pod, why: str) -> None:
        """SIGTERM to the pod's process group, SIGKILL after its grace; a stop overrides a preemption or eviction."""
        assert pod.process is not None
        if pod.stopping == STOPPED or pod.stopping == why:
            return
        first = pod.stopping is None
        pod.stopping = why
        if first:
            pod.kill_at = time.monotonic() + pod.spec.grace_s
            self._signal(pod, signal.SIGTERM)

    def _log(self, pod: _Pod, line: str) -> None:
        task = self._store.run(pod.spec.run_id).task(pod.spec.task_id)
        with contextlib.suppress(OSError, UnsafePath), os.fdopen(open_log(task, pod.spec.worker), "a") as log:
            log.write(f"=== simrun: attempt {pod.status.attempts} {line} ===\n")

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq


def _waiting(pods: Iterable[_Pod]) -> list[Waiting]:
    """The pending ones of `pods` as admission sees them."""
    return [
        Waiting(p.spec.pod_id, p.spec.run_id, p.spec.cores, p.status.memory_gb, p.priority, p.seq, p.claim)
        for p in pods
        if p.status.phase is PodPhase.PENDING
    ]


def _snapshots(record_path: Path) -> list[tuple[str, str]]:
    """The (name, snapshot id) pairs of a run's record, which its pods may read; none without a record."""
    try:
        record = RunRecord.model_validate_json(record_path.read_bytes())
    except FileNotFoundError:
        return []
    return [(snapshot.name, snapshot.snapshot_id) for snapshot in record.snapshots]


def _log_names(logs: Path, worker: str | None) -> list[str]:
    """The pod logs of a logs folder: `<worker>.log` for worker names only, sorted; one worker's when given."""
    if worker is not None:
        return [f"{worker}.log"]
    try:
        names = [entry.name for entry in os.scandir(logs) if entry.is_file(follow_symlinks=False)]
    except (FileNotFoundError, NotADirectoryError):
        return []
    return sorted(n for n in names if n.endswith(".log") and WORKER_NAME.fullmatch(n.removesuffix(".log")))


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _describe(returncode: int) -> str:
    """An exit as Popen reported it: `exit code N`, or `signal NAME` for a process a signal ended."""
    if returncode < 0:
        try:
            return f"signal {signal.Signals(-returncode).name}"
        except ValueError:
            return f"signal {-returncode}"
    return f"exit code {returncode}"


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _copy(status: PodStatus) -> PodStatus:
    return dataclasses.replace(status, memory_kills=[dataclasses.replace(k) for k in status.memory_kills])
