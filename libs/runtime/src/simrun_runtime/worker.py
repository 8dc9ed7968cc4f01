"""`simrun-worker`: a pod of a split task, the coordinator (`w0`) or an extra worker, claiming units from the ledger.

Every worker claims units into its local pool of SIMRUN_PROCESSES processes, marks them done and appends one
line per completed unit to progress.jsonl; it touches its heartbeat meanwhile. An extra worker exits when
nothing is pending. The coordinator creates the ledger if nobody has, returns only once the ledger is
complete (releasing and computing the claims of workers whose heartbeat went stale), then merges if
SIMRUN_MERGE=1. On SIGTERM a worker stops claiming, releases its claims, writes its report and exits 143.

`simrun-worker --unit I [--out DIR]` computes one unit into DIR with no ledger at all, for debugging a model.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from simrun_runtime.ledger import Ledger, LedgerError, create_ledger
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
    fail,
    signal_exit_code,
)
from simrun_runtime.pool import ProcessDied, UnitJob, UnitPool, UnitResult
from simrun_runtime.reports import ProgressLog, WorkerEnd
from simrun_runtime.tasktype import SplitTaskType, TaskTypeError, UnitContext, _Scratch

PROG = "simrun-worker"
COORDINATOR = "w0"
# Claims held beyond one per process: enough to keep every process fed, few enough that other pods get units.
PREFETCH = 2
HEARTBEAT_S = 5.0
STALE_CHECK_S = 2.0
REPORT_EVERY_S = 10.0


class Heartbeat:
    """Touches `heartbeats/<worker>` every few seconds from a daemon thread."""

    def __init__(self, ledger: Ledger, worker: str, interval_s: float = HEARTBEAT_S) -> None:
        self.ledger = ledger
        self.worker = worker
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="simrun-heartbeat", daemon=True)

    def start(self) -> Heartbeat:
        self.ledger.touch_heartbeat(self.worker)
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.ledger.touch_heartbeat(self.worker)
            except OSError:
                continue

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


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

    @property
    def coordinator(self) -> bool:
        return self.env.worker == COORDINATOR

    @property
    def task_type(self) -> SplitTaskType:
        assert isinstance(self.setup.task_type, SplitTaskType)
        return self.setup.task_type

    def run(self) -> int:
        try:
            return self._run()
        except Exception as exc:
            self.pool.kill()
            fail(PROG, f"{type(exc).__name__}: {exc}")
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
        heartbeat = Heartbeat(ledger, self.env.worker).start()
        progress = ProgressLog(self.setup.task.progress)
        try:
            code = self._claim_and_compute(ledger, self.pool, progress)
        finally:
            heartbeat.stop()
            progress.close()
        if code is not None:
            return code
        if self.coordinator and self.env.merge:
            return run_merge(self.setup, self.env, self.keeper, self.stopper, by=self.env.worker)
        return self.keeper.finish(WorkerEnd.DONE, EXIT_DONE)

    def _claim_and_compute(self, ledger: Ledger, pool: UnitPool, progress: ProgressLog) -> int | None:
        """The worker loop; returns an exit code if the worker must end without merging, else None."""
        worker = self.env.worker
        taken_back = deque(ledger.own_claims(worker))
        claimer = ledger.claimer(worker)
        max_in_flight = self.env.processes + min(self.env.processes, PREFETCH)
        exhausted = False
        last_stale_check = 0.0
        while True:
            if self.stopper.stopping:
                return self._stop(ledger, pool, list(taken_back))
            while pool.in_flight < max_in_flight and not exhausted:
                index = taken_back.popleft() if taken_back else claimer.claim()
                if index is None:
                    exhausted = True
                else:
                    pool.submit(index)
            if pool.in_flight == 0:
                # Listing claimed/ (small) first spares listing done/ (every unit) while others still compute.
                if not self.coordinator or (not ledger.has_claims() and ledger.is_complete()):
                    pool.close()
                    return None
                if not ledger.has_claims() and not ledger.has_pending():
                    raise LedgerError(f"units are missing from the ledger {ledger.layout.root}: {ledger.missing()}")
                if time.monotonic() - last_stale_check >= STALE_CHECK_S:
                    ledger.release_stale(self.env.grace_s, exclude=worker)
                    last_stale_check = time.monotonic()
                self.keeper.write_every(REPORT_EVERY_S)
                self.stopper.sleep(0.5)
                exhausted = False
                continue
            failure: tuple[list[int], str, int] | None = None
            # Every unit finished in this batch is marked done before a failure ends the worker.
            for event in pool.wait(timeout=1.0, also=[self.stopper]):
                if isinstance(event, UnitResult):
                    if event.error is not None:
                        failure = failure or ([event.index], event.error, EXIT_FAILED)
                        continue
                    if ledger.mark_done(event.index, worker):
                        progress.append(event.index, worker, event.seconds, time.time())
                    if event.seconds is not None:
                        self.keeper.add_unit(event.index, event.seconds)
                    exhausted = False
                elif isinstance(event, ProcessDied):
                    code = signal_exit_code(event.exitcode)
                    if code == EXIT_KILLED or self.keeper.oom_killed():
                        code = EXIT_KILLED
                    elif code in (EXIT_DONE, EXIT_STOPPED):
                        code = EXIT_FAILED
                    message = f"a worker process died (exit code {event.exitcode}) computing units {event.units}"
                    failure = failure or (event.units, message, code)
            if failure is not None:
                return self._fail(ledger, pool, list(taken_back), *failure)
            self.keeper.write_every(REPORT_EVERY_S)

    def _give_back(self, ledger: Ledger, pool: UnitPool, also: list[int]) -> list[int]:
        held = pool.units() + also
        pool.kill()
        released = [index for index in held if ledger.release(index, self.env.worker)]
        ledger.remove_tmp(self.env.worker)
        return released

    def _stop(self, ledger: Ledger, pool: UnitPool, taken_back: list[int]) -> int:
        released = self._give_back(ledger, pool, taken_back)
        ledger.remove_heartbeat(self.env.worker)
        return self.keeper.finish(
            WorkerEnd.STOPPED, EXIT_STOPPED, f"stopped on SIGTERM; released units {sorted(released)}"
        )

    def _fail(
        self, ledger: Ledger, pool: UnitPool, taken_back: list[int], units: list[int], error: str, code: int
    ) -> int:
        self._give_back(ledger, pool, taken_back + units)
        ledger.remove_heartbeat(self.env.worker)
        print(error.rstrip(), file=sys.stderr)
        last = error.strip().splitlines()[-1] if error.strip() else "failed"
        return self.keeper.finish(WorkerEnd.FAILED, code, f"units {units}: {last}")


def run_worker(env: PodEnv) -> int:
    """Runs one worker pod; bad input is refused (exit 2) before anything is written."""
    try:
        setup = TaskSetup.load(env.run_dir, env.task_id)
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
        setup = TaskSetup.load(env.run_dir, env.task_id)
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
        task_type.compute_unit(setup.settings, index, context)
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
