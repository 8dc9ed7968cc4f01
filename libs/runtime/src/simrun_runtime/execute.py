"""`simrun-exec`: the pod of an unsplit task, running its type's `command` or `run`, with the worker's report and
exit codes (0 done, 137 killed, 143 stopped on SIGTERM, 2 bad input, any other a failure)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from simrun_runtime.memory import kill_tree
from simrun_runtime.merge import build_outputs, put_in_place
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
from simrun_runtime.tasktype import ExecContext, UnsplitTaskType, port_env_name

PROG = "simrun-exec"
EXEC_WORKER = "exec"


def command_environment(
    setup: TaskSetup, outputs: dict[str, Path], scratch: Path, settings_file: Path
) -> dict[str, str]:
    """The variables a type's `command` finds its settings and directories in (see `UnsplitTaskType`)."""
    env = dict(os.environ)
    env["SIMRUN_SETTINGS"] = str(settings_file)
    env["SIMRUN_OUTPUTS"] = json.dumps({port: str(path) for port, path in outputs.items()})
    env["SIMRUN_INPUTS"] = json.dumps({port: str(path) for port, path in setup.inputs.items()})
    for port, path in outputs.items():
        env[port_env_name("SIMRUN_OUTPUT", port)] = str(path)
    for port, path in setup.inputs.items():
        env[port_env_name("SIMRUN_INPUT", port)] = str(path)
    env["SIMRUN_SUMMARY"] = str(scratch / "summary.json")
    env["SIMRUN_SCRATCH"] = str(scratch / "work")
    return env


def time_limit(setup: TaskSetup, env: PodEnv) -> float | None:
    """The time limit of the task's run: the workflow's (SIMRUN_UNIT_TIMEOUT_S), else the type's; None: none."""
    return env.unit_timeout_s or getattr(type(setup.task_type), "unit_timeout_s", None)


def timeout_message(setup: TaskSetup, env: PodEnv, limit_s: float) -> str:
    return (
        f"UnitTimeout: task {setup.task.task_id!r} ran past its time limit of {limit_s:g} s on worker "
        f"{env.worker} and was killed"
    )


def run_command(
    setup: TaskSetup, env: PodEnv, outputs: dict[str, Path], scratch: Path, stopper: Stopper, keeper: ReportKeeper
) -> tuple[int, dict[str, Any] | None, str]:
    """Runs the type's command in the model root; returns (exit code, summary, message)."""
    task_type = setup.task_type
    assert isinstance(task_type, UnsplitTaskType) and task_type.command
    settings_file = scratch / "settings.json"
    settings_file.write_text(setup.settings.model_dump_json(indent=2))
    (scratch / "work").mkdir()
    cwd = setup.model_root or Path.cwd()
    try:
        process = subprocess.Popen(
            list(task_type.command), cwd=cwd, env=command_environment(setup, outputs, scratch, settings_file)
        )
    except OSError as exc:
        return EXIT_FAILED, None, f"cannot start {task_type.command[0]!r}: {exc}"
    limit_s = time_limit(setup, env)
    deadline = time.monotonic() + limit_s if limit_s is not None else None
    while True:
        try:
            returncode = process.wait(timeout=0.5)
            break
        except subprocess.TimeoutExpired:
            pass
        if deadline is not None and limit_s is not None and time.monotonic() >= deadline:
            kill_tree(process.pid)  # the command and what it started
            process.wait()
            return EXIT_FAILED, None, timeout_message(setup, env, limit_s)
        if stopper.stopping:
            process.terminate()
            try:
                process.wait(timeout=max(env.grace_s - 2.0, 0.5))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            return EXIT_STOPPED, None, "stopped on SIGTERM"
    if returncode != 0:
        code = signal_exit_code(returncode)
        return code, None, f"the command {task_type.command[0]!r} exited with status {code}"
    summary_file = scratch / "summary.json"
    if not summary_file.exists():
        return EXIT_DONE, {}, ""
    try:
        summary = json.loads(summary_file.read_text())
    except json.JSONDecodeError as exc:
        return EXIT_FAILED, None, f"the command wrote an invalid $SIMRUN_SUMMARY: {exc}"
    if not isinstance(summary, dict):
        return EXIT_FAILED, None, "the command's $SIMRUN_SUMMARY is not a JSON object"
    return EXIT_DONE, summary, ""


def run_callable(
    setup: TaskSetup, env: PodEnv, outputs: dict[str, Path], scratch: Path, stopper: Stopper, keeper: ReportKeeper
) -> tuple[int, dict[str, Any] | None, str]:
    """Runs the type's `run` in a child process; returns (exit code, summary, message)."""
    task_type = setup.task_type
    assert isinstance(task_type, UnsplitTaskType)
    context = ExecContext(
        inputs=setup.inputs,
        outputs=outputs,
        scratch_dir=scratch,
        model_root=setup.model_root or Path.cwd(),
        task_id=setup.task.task_id,
        provenance=env.provenance,
    )
    limit_s = time_limit(setup, env)
    outcome = run_in_child(lambda: task_type.run(setup.settings, context), stopper, limit_s=limit_s)
    if outcome.stopped:
        return EXIT_STOPPED, None, "stopped on SIGTERM"
    if outcome.timed_out and limit_s is not None:
        return EXIT_FAILED, None, timeout_message(setup, env, limit_s)
    if outcome.error is not None:
        print(outcome.error.rstrip(), file=sys.stderr)
        code = signal_exit_code(outcome.exitcode) if outcome.exitcode not in (0, None) else EXIT_FAILED
        last = outcome.error.strip().splitlines()[-1] if outcome.error.strip() else "failed"
        return (code if code not in (EXIT_DONE, EXIT_STOPPED) else EXIT_FAILED), None, last
    summary = outcome.value if outcome.value is not None else {}
    if not isinstance(summary, dict):
        return (
            EXIT_FAILED,
            None,
            f"run of {setup.type_name} returned {type(summary).__name__}, not a dict (the summary)",
        )
    return EXIT_DONE, summary, ""


def run_exec(env: PodEnv) -> int:
    try:
        setup = TaskSetup.load(env.run_dir, env.task_id, env.worker, env.editables_into)
        if not isinstance(setup.task_type, UnsplitTaskType):
            raise UsageError(f"task type {setup.type_name} is split: run task {env.task_id!r} with simrun-worker")
    except UsageError as exc:
        fail(PROG, str(exc))
        return EXIT_USAGE
    stopper = Stopper().install()
    worker = env.worker
    keeper = ReportKeeper.start(setup, env, role="exec", processes=1, worker=worker)
    token = f"{worker}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    build, outputs = build_outputs(setup.task, type(setup.task_type).outputs, token)
    scratch = Path(tempfile.mkdtemp(prefix="simrun-exec-", dir=env.scratch))
    start = time.perf_counter()
    try:
        runner = run_command if setup.task_type.command else run_callable
        code, summary, message = runner(setup, env, outputs, scratch, stopper, keeper)
        if code == EXIT_DONE and summary is not None:
            put_in_place(setup.task, build, summary, token, worker)
    except Exception as exc:
        code, summary, message = EXIT_FAILED, None, f"{type(exc).__name__}: {exc}"
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if code != EXIT_DONE:
        shutil.rmtree(build, ignore_errors=True)
    if code == EXIT_DONE:
        keeper.add_unit(0, time.perf_counter() - start)
        return keeper.finish(WorkerEnd.DONE, EXIT_DONE)
    if code == EXIT_STOPPED:
        return keeper.finish(WorkerEnd.STOPPED, EXIT_STOPPED, message)
    if keeper.oom_killed():
        code = EXIT_KILLED
    fail(PROG, message)
    if code != EXIT_KILLED:
        write_failure(
            setup.task,
            f"task {setup.task.task_id!r} failed on worker {worker}: {message}",
            unit=None,
            worker=worker,
            exception=exception_of(message)[0],
            detail=message,
        )
    return keeper.finish(WorkerEnd.FAILED, code, message)


def main() -> int:
    """`simrun-exec`: runs the unsplit task SIMRUN_TASK of SIMRUN_RUN_DIR."""
    try:
        env = PodEnv.from_environ(os.environ, default_worker=EXEC_WORKER)
    except UsageError as exc:
        fail(PROG, str(exc))
        return EXIT_USAGE
    return run_exec(env)


if __name__ == "__main__":
    sys.exit(main())
