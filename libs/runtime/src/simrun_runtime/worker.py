"""`simrun-worker`: a pod of a split task, the coordinator (`w0`) or an extra worker, claiming units from the ledger.

Every worker claims ranges of units into its local pool of SIMRUN_PROCESSES processes, marks them done and
appends one line per claim to progress.jsonl; it touches its heartbeat meanwhile. It claims one unit at a time
until it has measured the units' seconds, then as many consecutive units as take about `CLAIM_TARGET_S`, so
short units cost one claim, one line of values, one done rename and one progress line per claim rather than
per unit. A unit past its time limit is killed and counts as failed; a failed unit is given back for another
try (on another worker when there is one) as often as its type retries, and then fails the task: the worker
writes `failure.json`, naming the unit, the exception and the worker, and exits 1. An extra worker exits when
nothing is pending. The coordinator creates the ledger if nobody has, returns only once the ledger is complete
(releasing and computing the claims of workers whose heartbeat went stale, or that hold a unit past its time
limit), then merges if SIMRUN_MERGE=1. On SIGTERM a worker stops claiming, releases its claims, writes its
report and exits 143.

`simrun-worker --unit I [--out DIR]` computes one unit into DIR with no ledger at all, for debugging a model.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from simrun_runtime.ledger import Ledger, LedgerError, UnitRange, create_ledger
from simrun_runtime.loading import count_units
from simrun_runtime.merge import run_merge
from simrun_runtime.pod import (
    EXIT_DONE,
    EXIT_FAILED,
    EXIT_KILLED,
    EXIT_STOPPED,
    EXIT_USAGE,
    PodEnv,
    ReportKeeper,
    Stopper,
    TaskSetup,
    UsageError,
    death_of,
    exception_of,
    fail,
    signal_exit_code,
    write_failure,
)
from simrun_runtime.pool import ClaimResult, ProcessDied, UnitJob, UnitPool
from simrun_runtime.reports import ProgressLog, WorkerEnd
from simrun_runtime.tasktype import SplitTaskType, TaskTypeError, UnitContext, _Scratch

PROG = "simrun-worker"
COORDINATOR = "w0"
# Claims held beyond one per process: enough to keep every process fed, few enough that other pods get units.
PREFETCH = 2
HEARTBEAT_S = 5.0
STALE_CHECK_S = 2.0
# A claim of short units is sized to take about this long: its fixed cost (a few renames, one file, one line,
# two messages) is then well under 1% of it, and the last claims of a task still end close together.
CLAIM_TARGET_S = 0.05
# ... and at most this much wall time.
CLAIM_WALL_S = 0.25
# A claim grows at most this much from one to the next, so one fast unit does not claim a whole range at once.
CLAIM_GROWTH = 4
# Short claims are queued to each process for about this long, at most this many.
QUEUED_S = 0.2
MAX_QUEUED = 8
# The time limit of a unit when neither the workflow nor the type sets one: a day.
DEFAULT_UNIT_TIMEOUT_S = 86_400.0


class Heartbeat:
    """Touches `heartbeats/<worker>` every few seconds from a daemon thread while the worker's loop is alive: a
    loop that has not come round for longer than a unit's time limit stops the heartbeat, so a stuck worker's
    claims go stale instead of being kept alive by this thread."""

    def __init__(self, ledger: Ledger, worker: str, stuck_after_s: float, interval_s: float = HEARTBEAT_S) -> None:
        self.ledger = ledger
        self.worker = worker
        self.interval_s = interval_s
        self.stuck_after_s = max(stuck_after_s, 2 * interval_s)
        self.alive_at = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="simrun-heartbeat", daemon=True)

    def start(self) -> Heartbeat:
        self.ledger.touch_heartbeat(self.worker)
        self._thread.start()
        return self

    def tick(self) -> None:
        """The worker's loop came round."""
        self.alive_at = time.monotonic()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            if time.monotonic() - self.alive_at > self.stuck_after_s:
                continue
            try:
                self.ledger.touch_heartbeat(self.worker)
            except OSError:
                continue

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


@dataclass(frozen=True)
class TaskFailed:
    """Why the task failed (already in failure.json): the worker ends with exit code 1 and this message."""

    message: str


@dataclass
class Worker:
    """One incarnation of a worker pod on one task."""

    env: PodEnv
    setup: TaskSetup
    count: int
    stopper: Stopper
    keeper: ReportKeeper
    pool: UnitPool
    scratch_root: Path
    avoid: dict[int, float] = field(default_factory=dict)
    unit_estimate_s: float | None = None  # CPU seconds of a unit: what a claim's fixed cost is weighed against
    unit_wall_s: float | None = None
    last_want: int = 1

    @property
    def coordinator(self) -> bool:
        return self.env.worker == COORDINATOR

    @property
    def task_type(self) -> SplitTaskType:
        assert isinstance(self.setup.task_type, SplitTaskType)
        return self.setup.task_type

    @property
    def unit_timeout_s(self) -> float:
        """The workflow's limit (SIMRUN_UNIT_TIMEOUT_S), else the type's, else a day."""
        return self.env.unit_timeout_s or self.task_type.unit_timeout_s or DEFAULT_UNIT_TIMEOUT_S

    def run(self) -> int:
        try:
            return self._run()
        except Exception as exc:
            self.pool.kill()
            message = f"worker {self.env.worker} failed: {type(exc).__name__}: {exc}"
            fail(PROG, message)
            if self.coordinator:
                write_failure(
                    self.setup.task,
                    message,
                    unit=None,
                    worker=self.env.worker,
                    exception=type(exc).__name__,
                    detail=str(exc),
                )
            return self.keeper.finish(WorkerEnd.FAILED, EXIT_FAILED, f"{type(exc).__name__}: {exc}")
        finally:
            shutil.rmtree(self.scratch_root, ignore_errors=True)

    def _run(self) -> int:
        ledger = Ledger.of(self.setup.task)
        if not ledger.exists():
            if self.coordinator:
                create_ledger(self.setup.task, self.count)
            elif not ledger.wait(lambda: self.stopper.stopping):
                self.pool.kill()
                return self.keeper.finish(WorkerEnd.STOPPED, EXIT_STOPPED, "stopped on SIGTERM waiting for the ledger")
        if ledger.count != self.count:
            message = (
                f"the ledger of task {self.setup.task.task_id!r} has {ledger.count} units but its settings give "
                f"{self.count}: the settings changed after the ledger was created"
            )
            fail(PROG, message)
            self.pool.kill()
            return self.keeper.finish(WorkerEnd.FAILED, EXIT_USAGE, message)
        if self.coordinator and not ledger.has_failed():
            # An account of an earlier incarnation's failure (a merge that failed) is not this one's.
            self.setup.task.failure.unlink(missing_ok=True)
        heartbeat = Heartbeat(ledger, self.env.worker, stuck_after_s=self.unit_timeout_s).start()
        progress = ProgressLog(self.setup.task.progress)
        try:
            code = self._claim_and_compute(ledger, self.pool, progress, heartbeat)
        finally:
            heartbeat.stop()
            progress.close()
        if code is not None:
            return code
        if self.coordinator and self.env.merge:
            return run_merge(self.setup, self.env, self.keeper, self.stopper, by=self.env.worker)
        return self.keeper.finish(WorkerEnd.DONE, EXIT_DONE)

    def want(self) -> int:
        """How many consecutive units to claim next: one until units were measured, then about `CLAIM_TARGET_S`
        of CPU of them (CPU, so a machine busy with other work does not make units look long and claims short),
        at most `CLAIM_WALL_S` of wall time (so units that wait rather than compute stay one a claim), growing by
        at most `CLAIM_GROWTH` a claim."""
        if self.unit_estimate_s is None or self.unit_wall_s is None:
            return 1
        target = int(min(CLAIM_TARGET_S / max(self.unit_estimate_s, 1e-7), CLAIM_WALL_S / max(self.unit_wall_s, 1e-7)))
        self.last_want = max(1, min(target, self.last_want * CLAIM_GROWTH))
        return self.last_want

    def max_in_flight(self) -> int:
        """Claims sent to the pool at most: one per process plus `PREFETCH`; for claims shorter than `QUEUED_S`,
        as many per process as take `QUEUED_S`, so a process never waits for this loop, which on a busy machine
        may be scheduled tens of milliseconds late (at most `MAX_QUEUED` a process, a fraction of a second)."""
        processes = self.env.processes
        base = processes + min(processes, PREFETCH)
        if self.unit_estimate_s is None:
            return base
        claim_s = max(self.last_want * (self.unit_wall_s or self.unit_estimate_s), 1e-6)
        if claim_s >= QUEUED_S:
            return base
        return max(base, processes * (1 + min(MAX_QUEUED, math.ceil(QUEUED_S / claim_s))))

    def _learn(self, result: ClaimResult) -> None:
        if result.seconds.count:
            wall = result.seconds.total / result.seconds.count
            cpu = result.cpu_s / result.seconds.count
            previous, previous_wall = self.unit_estimate_s, self.unit_wall_s
            self.unit_estimate_s = cpu if previous is None else 0.5 * previous + 0.5 * cpu
            self.unit_wall_s = wall if previous_wall is None else 0.5 * previous_wall + 0.5 * wall

    def _claim_and_compute(
        self, ledger: Ledger, pool: UnitPool, progress: ProgressLog, heartbeat: Heartbeat
    ) -> int | None:
        """The worker loop; returns an exit code if the worker must end without merging, else None."""
        worker = self.env.worker
        taken_back = deque(ledger.take_back(worker))
        claimer = ledger.claimer(worker, self.avoid, lambda: ledger.others_alive(worker, 3 * HEARTBEAT_S))
        limit_s = self.unit_timeout_s
        exhausted = False
        last_check = time.monotonic()
        while True:
            heartbeat.tick()
            if self.stopper.stopping:
                return self._stop(ledger, pool, list(taken_back))
            if time.monotonic() - last_check >= STALE_CHECK_S:
                last_check = time.monotonic()
                if ledger.has_failed():
                    return self._end_failed(ledger, pool, list(taken_back), self._failure_message(ledger))
                if self.coordinator:
                    ledger.release_stale(self.env.grace_s, exclude=worker)
                    ledger.release_overdue(limit_s, exclude=worker)
            while pool.in_flight < self.max_in_flight() and not exhausted:
                claim = taken_back.popleft() if taken_back else claimer.claim(self.want())
                if claim is None:
                    exhausted = True
                else:
                    pool.submit(claim)
            if pool.in_flight == 0:
                # Listing claimed/ (small) first spares listing done/ while others still compute.
                if not self.coordinator or (not ledger.has_claims() and ledger.is_complete()):
                    if ledger.has_failed():
                        return self._end_failed(ledger, pool, [], self._failure_message(ledger))
                    pool.close()
                    return None
                if not ledger.has_claims() and not ledger.has_pending():
                    if ledger.has_failed():
                        return self._end_failed(ledger, pool, [], self._failure_message(ledger))
                    raise LedgerError(f"units are missing from the ledger {ledger.layout.root}: {ledger.missing()}")
                last_check = 0.0  # idle: look for stale and overdue claims at once
                self.stopper.sleep(0.5)
                exhausted = False
                continue
            failure: tuple[list[UnitRange], str, int] | None = None
            failed: TaskFailed | None = None
            interrupted: list[UnitRange] = []
            # Every claim finished in this batch is settled before a failure ends the worker.
            for event in pool.wait(timeout=1.0, also=[self.stopper], limit_s=limit_s):
                if self.stopper.stopping and not (isinstance(event, ClaimResult) and event.complete):
                    # Stopping: the pod's SIGTERM also reached the programs its units started, so a unit that
                    # failed or died now failed of the stop, not of itself; given back whole, no failure counted.
                    interrupted += [event.claim] if isinstance(event, ClaimResult) else event.claims
                    continue
                if isinstance(event, ClaimResult):
                    self._learn(event)
                    failed = self._settle(ledger, progress, event) or failed
                    exhausted = False
                elif event.timed_out:
                    failed = self._timed_out(ledger, pool, event, limit_s) or failed
                    exhausted = False
                elif (crash := self._crash(event)) is not None:
                    failed = self._unit_killed(ledger, pool, event, crash, "UnitCrashed") or failed
                    exhausted = False
                else:
                    code = signal_exit_code(event.exitcode)
                    if code == EXIT_KILLED or self.keeper.oom_killed():
                        code = EXIT_KILLED
                    elif code in (EXIT_DONE, EXIT_STOPPED):
                        code = EXIT_FAILED
                    names = [claim.name for claim in event.claims]
                    message = f"a worker process died (exit code {event.exitcode}) computing units {names}"
                    failure = failure or (event.claims, message, code)
            if interrupted:
                return self._stop(ledger, pool, list(taken_back) + interrupted)
            if failed is not None:
                return self._end_failed(ledger, pool, list(taken_back), failed.message)
            if failure is not None:
                return self._fail(ledger, pool, list(taken_back), *failure)

    def _settle(self, ledger: Ledger, progress: ProgressLog, result: ClaimResult) -> TaskFailed | None:
        """Marks the computed part of a claim done; a unit that raised is retried or fails the task."""
        worker = self.env.worker
        claim = result.claim
        self.keeper.add_seconds(result.seconds)
        computed = result.seconds.total if result.seconds.count else None
        if result.complete:
            # The progress line first: a worker killed between the two leaves a line for units another worker
            # computes again (counted once, as distinct units), never done units that no line counts.
            progress.append(claim, worker, computed, time.time())
            ledger.mark_done(claim, worker)
            return None
        assert result.error is not None
        index = result.done_until
        rest: UnitRange | None = claim
        if index > claim.first:
            halves = ledger.split(claim, worker, index)
            if halves is None:
                return None  # released meanwhile (taken for dead): someone else has it now
            done, rest = halves
            progress.append(done, worker, computed, time.time())
            ledger.mark_done(done, worker)
        assert rest is not None
        if index < rest.last:
            halves = ledger.split(rest, worker, index + 1)
            if halves is None:
                return None
            rest, after = halves
            ledger.release(after, worker)
        return self._unit_failed(ledger, rest, result.error)

    def _crash(self, died: ProcessDied) -> str | None:
        """Why a pool process died of its unit's own doing (a signal other than SIGKILL, as a C extension's
        segfault or abort, or an exit from `os._exit`), or None: a SIGKILL or a kill the cgroup counted is the
        pod's (memory, or an operator), and a process that was computing no unit fails the pod as before."""
        if died.unit is None or died.exitcode is None or died.exitcode == -signal.SIGKILL:
            return None
        if self.keeper.oom_killed():
            return None
        return f"the process computing unit {_killed_unit(died)} on worker {self.env.worker} {death_of(died.exitcode)}"

    def _timed_out(self, ledger: Ledger, pool: UnitPool, died: ProcessDied, limit_s: float) -> TaskFailed | None:
        """A unit ran past its limit and its process was killed: the unit counts as failed (`_unit_killed`)."""
        index = _killed_unit(died)
        detail = f"unit {index} ran past its time limit of {limit_s:g} s on worker {self.env.worker} and was killed"
        return self._unit_killed(ledger, pool, died, detail, "UnitTimeout")

    def _unit_killed(
        self, ledger: Ledger, pool: UnitPool, died: ProcessDied, detail: str, exception: str
    ) -> TaskFailed | None:
        """A unit's process died (killed at the unit's time limit, or crashed): the unit counts as failed, the
        rest of its claim (whose values died with the process) is given back, the claims queued behind it go to a
        new process."""
        worker = self.env.worker
        pool.replace_dead()
        current, *queued = died.claims
        for claim in queued:
            pool.submit(claim)
        index = _killed_unit(died)
        rest = current
        if index > current.first:
            halves = ledger.split(current, worker, index)
            if halves is None:
                return None
            before, rest = halves
            ledger.release(before, worker)
        if index < rest.last:
            halves = ledger.split(rest, worker, index + 1)
            if halves is None:
                return None
            rest, after = halves
            ledger.release(after, worker)
        ledger.remove_tmp_of(worker, index)
        return self._unit_failed(ledger, rest, f"{detail}\n{exception}: {detail}\n")

    def _unit_failed(self, ledger: Ledger, unit: UnitRange, error: str) -> TaskFailed | None:
        """Gives a failed unit back for another try, or, past its retries, fails the task (failure.json)."""
        worker = self.env.worker
        index = unit.first
        failures = unit.failures + 1
        attempts = self.task_type.unit_retries + 1
        exception, last = exception_of(error)
        for line in error.rstrip().splitlines():
            print(f"[unit {index}] {line}", file=sys.stderr)
        if failures < attempts:
            ledger.retry(unit, worker, failures)
            self.avoid[index] = time.monotonic()
            print(
                f"{PROG}: unit {index} failed on worker {worker} (attempt {failures} of {attempts}), "
                f"given back for another try: {last}",
                file=sys.stderr,
            )
            return None
        message = f"unit {index} failed on worker {worker} (attempt {failures} of {attempts}): {last}"
        write_failure(self.setup.task, message, unit=index, worker=worker, exception=exception, detail=error)
        ledger.mark_failed(unit, worker, failures)
        return TaskFailed(message)

    def _failure_message(self, ledger: Ledger) -> str:
        try:
            return str(json.loads(self.setup.task.failure.read_text())["message"])
        except (OSError, ValueError, KeyError, TypeError):
            names = [unit.name for unit in ledger.failed()]
            return f"units {names} of task {self.setup.task.task_id!r} failed"

    def _give_back(self, ledger: Ledger, pool: UnitPool, also: list[UnitRange]) -> list[UnitRange]:
        held = pool.units() + also
        pool.kill()
        released = ledger.release_all(self.env.worker, held)
        ledger.remove_tmp(self.env.worker)
        return released

    def _stop(self, ledger: Ledger, pool: UnitPool, taken_back: list[UnitRange]) -> int:
        released = self._give_back(ledger, pool, taken_back)
        ledger.remove_heartbeat(self.env.worker)
        names = [claim.name for claim in released]
        return self.keeper.finish(WorkerEnd.STOPPED, EXIT_STOPPED, f"stopped on SIGTERM; released units {names}")

    def _end_failed(self, ledger: Ledger, pool: UnitPool, taken_back: list[UnitRange], message: str) -> int:
        self._give_back(ledger, pool, taken_back)
        ledger.remove_heartbeat(self.env.worker)
        fail(PROG, message)
        return self.keeper.finish(WorkerEnd.FAILED, EXIT_FAILED, message)

    def _fail(
        self, ledger: Ledger, pool: UnitPool, taken_back: list[UnitRange], units: list[UnitRange], error: str, code: int
    ) -> int:
        self._give_back(ledger, pool, taken_back + units)
        ledger.remove_heartbeat(self.env.worker)
        print(error.rstrip(), file=sys.stderr)
        last = error.strip().splitlines()[-1] if error.strip() else "failed"
        return self.keeper.finish(WorkerEnd.FAILED, code, f"units {[u.name for u in units]}: {last}")


def _killed_unit(died: ProcessDied) -> int:
    """The unit a dead pool process was computing: the one it said, else its first claim's first."""
    current = died.claims[0]
    return died.unit if died.unit is not None and died.unit in current.indices() else current.first


def run_worker(env: PodEnv) -> int:
    """Runs one worker pod; bad input is refused (exit 2) before anything but its task's files is written."""
    try:
        setup = TaskSetup.load(env.run_dir, env.task_id, env.worker, env.editables_into)
        if not isinstance(setup.task_type, SplitTaskType):
            raise UsageError(f"task type {setup.type_name} is not split: run task {env.task_id!r} with simrun-exec")
        count = count_units(setup.task_type, setup.settings, setup.type_name)
    except (UsageError, TaskTypeError, LedgerError) as exc:
        fail(PROG, str(exc))
        return EXIT_USAGE
    stopper = Stopper().install()
    # The pool is forked before any thread of this process starts (the sampler, the heartbeat).
    scratch_root = Path(tempfile.mkdtemp(prefix="simrun-scratch-", dir=env.scratch))
    job = UnitJob(
        setup.task_type, setup.settings, Ledger.of(setup.task), env.worker, setup.inputs, env.provenance, scratch_root
    )
    pool = UnitPool(job, env.processes)
    role = "coordinator" if env.worker == COORDINATOR else "extra"
    keeper = ReportKeeper.start(setup, env, role=role, processes=env.processes)
    return Worker(env, setup, count, stopper, keeper, pool, scratch_root).run()


def compute_unit_alone(env: PodEnv, index: int, out: Path) -> int:
    """Computes unit `index` in this process into `out`, with no ledger (for debugging a model)."""
    try:
        setup = TaskSetup.load(env.run_dir, env.task_id, env.worker, env.editables_into)
        task_type = setup.task_type
        if not isinstance(task_type, SplitTaskType):
            raise UsageError(f"task type {setup.type_name} is not split; it has no units")
        count = count_units(task_type, setup.settings, setup.type_name)
        if not 0 <= index < count:
            raise UsageError(f"unit {index} is out of range: task {env.task_id!r} has units 0..{count - 1}")
        if out.exists() and any(out.iterdir()):
            raise UsageError(f"{out} is not empty: give --out an empty or new directory")
    except (UsageError, TaskTypeError) as exc:
        fail(PROG, str(exc))
        return EXIT_USAGE
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="simrun-scratch-") as scratch:
        context = UnitContext(index, out, setup.inputs, env.worker, env.provenance, _Scratch(Path(scratch) / "unit"))
        start = time.perf_counter()
        value = task_type.compute_unit(setup.settings, index, context)
    if value is not None:
        (out / "value.json").write_text(json.dumps(value, indent=2) + "\n")
    print(f"unit {index} computed in {time.perf_counter() - start:.3f} s into {out}")
    return EXIT_DONE


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--unit", type=int, help="compute only this unit, with no ledger (debugging)")
    parser.add_argument("--out", type=Path, help="with --unit: the directory to write the unit's results into")
    args = parser.parse_args(argv)
    try:
        env = PodEnv.from_environ(os.environ)
    except UsageError as exc:
        fail(PROG, str(exc))
        return EXIT_USAGE
    if args.unit is not None:
        return compute_unit_alone(env, args.unit, args.out or Path(f"unit-{args.unit}"))
    return run_worker(env)


if __name__ == "__main__":
    sys.exit(main())
