"""The merge of a split task's units, safe to repeat, and `simrun-merge`, which merges a complete ledger alone.

Outputs are built aside (`.out.building-<token>/`), put in place as `out/` by renames and marked last
(`out/.merged`), so a coordinator restarted mid-merge merges again from scratch and a reader that sees the
marker sees complete outputs.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from simrun_runtime.files import write_bytes_atomic, write_json_atomic
from simrun_runtime.layout import SUMMARY, TaskLayout
from simrun_runtime.ledger import Ledger, LedgerError
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
    exception_of,
    fail,
    run_in_child,
    signal_exit_code,
    write_failure,
)
from simrun_runtime.reports import WorkerEnd
from simrun_runtime.tasktype import MergeContext, SplitTaskType

# Leftovers of merges that died are removed once they are this old; a younger one may still be in progress.
LEFTOVER_AGE_S = 600.0


def is_merged(task: TaskLayout) -> bool:
    return task.merge_marker.is_file()


def build_outputs(task: TaskLayout, ports: tuple[str, ...], token: str) -> tuple[Path, dict[str, Path]]:
    """A fresh directory beside `out/` with an empty directory per output port."""
    build = task.out_building(token)
    if build.exists():
        shutil.rmtree(build)
    build.mkdir(parents=True)
    outputs = {port: build / port for port in ports}
    for path in outputs.values():
        path.mkdir()
    return build, outputs


def put_in_place(task: TaskLayout, build: Path, summary: dict[str, Any], token: str, by: str) -> None:
    """Writes the summary into `build`, makes it `out/` (moving an unmarked earlier `out/` aside) and writes the
    merge marker last."""
    write_json_atomic(build / SUMMARY, summary)
    aside = task.out_replaced(token)
    if task.out.exists():
        os.rename(task.out, aside)
    try:
        os.rename(build, task.out)
    except OSError:
        # Another incarnation put identical outputs in place between our two renames; ours are a duplicate.
        if not task.out.is_dir():
            raise
        shutil.rmtree(build, ignore_errors=True)
    shutil.rmtree(aside, ignore_errors=True)
    marker = {"by": by, "time": round(time.time(), 3)}
    write_bytes_atomic(task.merge_marker, (json.dumps(marker, sort_keys=True) + "\n").encode())
    _remove_leftovers(task)


def _remove_leftovers(task: TaskLayout) -> None:
    now = time.time()
    for path in task.root.glob(".out.*-*"):
        try:
            if now - path.stat().st_mtime > LEFTOVER_AGE_S:
                shutil.rmtree(path, ignore_errors=True)
        except FileNotFoundError:
            continue


def check_complete(setup: TaskSetup) -> tuple[Ledger, list[Any]]:
    """The task's ledger, checked to be complete with every unit's results in place (its value in a log of
    values, or its `results/<i>/`), and what every unit returned."""
    ledger = Ledger.of(setup.task)
    if not ledger.exists():
        raise LedgerError(f"task {setup.task.task_id!r} has no ledger at {ledger.layout.root}")
    done = ledger.done()
    if done.total < ledger.count:
        raise LedgerError(
            f"the ledger of task {setup.task.task_id!r} is not complete: {done.total} of {ledger.count} units done"
        )
    values, covered = ledger.values()
    missing: list[int] = []
    expected = 0
    for first, last in [*covered.ranges(), (ledger.count, ledger.count)]:
        # Units no log covers must have their files (one stat each; none for units that returned values).
        missing.extend(index for index in range(expected, min(first, ledger.count)) if not ledger.has_result(index))
        if len(missing) >= 10:
            break
        expected = last + 1
    if missing:
        raise LedgerError(f"units {missing[:10]} of task {setup.task.task_id!r} are done but have no results")
    return ledger, values


def merge_task(setup: TaskSetup, by: str, scratch_root: Path | None = None) -> dict[str, Any]:
    """Merges a complete ledger into `out/` and returns the summary; runs the type's `merge` (user code)."""
    task_type = setup.task_type
    if not isinstance(task_type, SplitTaskType):
        raise UsageError(f"task type {setup.type_name} is not split; it has nothing to merge")
    ledger, values = check_complete(setup)
    token = f"{by}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    build, outputs = build_outputs(setup.task, type(task_type).outputs, token)
    with tempfile.TemporaryDirectory(prefix="simrun-merge-", dir=scratch_root) as scratch:
        context = MergeContext(
            count=ledger.count,
            results=ledger.layout.results,
            outputs=outputs,
            inputs=setup.inputs,
            scratch_dir=Path(scratch),
            _load_values=lambda: values,
        )
        summary = task_type.merge(setup.settings, context)
    if summary is None:
        summary = {}
    if not isinstance(summary, dict):
        shutil.rmtree(build, ignore_errors=True)
        raise TypeError(f"merge of {setup.type_name} returned {type(summary).__name__}, not a dict (the summary)")
    put_in_place(setup.task, build, summary, token, by)
    return summary


def run_merge(setup: TaskSetup, env: PodEnv, keeper: ReportKeeper, stopper: Stopper, by: str) -> int:
    """Merges in a child process (so SIGTERM can stop it at once) and ends the report; returns the exit code."""
    if is_merged(setup.task):
        return keeper.finish(WorkerEnd.DONE, EXIT_DONE, "already merged")
    outcome = run_in_child(lambda: merge_task(setup, by, env.scratch), stopper)
    if outcome.stopped:
        return keeper.finish(WorkerEnd.STOPPED, EXIT_STOPPED, "stopped on SIGTERM during the merge")
    if outcome.error is not None:
        print(outcome.error, file=sys.stderr, end="")
        code = signal_exit_code(outcome.exitcode) if outcome.exitcode not in (0, None) else EXIT_FAILED
        if code == EXIT_KILLED or keeper.oom_killed():
            code = EXIT_KILLED
        elif code in (EXIT_DONE, EXIT_STOPPED):
            code = EXIT_FAILED
        exception, last = exception_of(outcome.error)
        message = f"the merge of task {setup.task.task_id!r} failed on worker {by}: {last}"
        write_failure(setup.task, message, unit=None, worker=by, exception=exception, detail=outcome.error)
        return keeper.finish(WorkerEnd.FAILED, code, message)
    keeper.report.merged = True
    return keeper.finish(WorkerEnd.DONE, EXIT_DONE)


def main() -> int:
    """`simrun-merge`: merges the complete ledger of SIMRUN_TASK in SIMRUN_RUN_DIR (the legacy `<task>-merge`)."""
    prog = "simrun-merge"
    try:
        env = PodEnv.from_environ(os.environ, default_worker="merge")
        setup = TaskSetup.load(env.run_dir, env.task_id, env.worker, env.editables_into)
        if not isinstance(setup.task_type, SplitTaskType):
            raise UsageError(f"task type {setup.type_name} is not split; it has nothing to merge")
        check_complete(setup)
    except (UsageError, LedgerError) as exc:
        fail(prog, str(exc))
        return EXIT_USAGE
    stopper = Stopper().install()
    keeper = ReportKeeper.start(setup, env, role="merge", processes=1)
    return run_merge(setup, env, keeper, stopper, by=env.worker)


if __name__ == "__main__":
    sys.exit(main())
