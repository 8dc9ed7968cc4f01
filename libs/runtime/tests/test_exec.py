"""Unsplit tasks through `simrun-exec` (a callable reading an upstream port, a command), and run dirs by hand."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from simrun_runtime.record import RunRecord
from simrun_runtime.reports import WorkerEnd

SCAN = "simrun_toymodel:Scan"


def test_a_callable_task_reads_its_upstream_port_and_writes_its_own(pods: Any, helpers: Any) -> None:
    run = pods.lay_out("chain", "scan", SCAN, {"points": 6})
    assert pods.run(pods.env(run, "scan", "w0", processes=2)).returncode == 0
    pods.lay_out("chain", "total", "simrun_toymodel:Total", {"scale": 2.0}, inputs={"table": "scan.table"})
    record = RunRecord.load(run)
    assert list(record.tasks) == ["scan", "total"] and record.tasks["total"].inputs == {"table": "scan.table"}
    done = pods.run(pods.env(run, "total", None, merge=False), module="execute")
    assert done.returncode == 0, done.stderr
    task = run.task("total")
    summary = json.loads(task.summary.read_text())
    scan_total = json.loads(run.task("scan").summary.read_text())["total"]
    assert summary["rows"] == 6 and abs(summary["total"] - 2 * scan_total) < 1e-9
    assert float((task.out / "report" / "total.txt").read_text()) == summary["total"]
    assert task.merge_marker.is_file()
    (report,) = helpers.reports_of(task)
    assert report.worker == "exec" and report.role == "exec" and report.ended == WorkerEnd.DONE
    assert report.memory_source == "process_tree" and report.unit_seconds is not None and report.unit_seconds.count == 1


def test_a_missing_upstream_output_is_bad_input(pods: Any) -> None:
    run = pods.lay_out("unconnected", "total", "simrun_toymodel:Total", {}, inputs={"table": "scan.table"})
    done = pods.run(pods.env(run, "total"), module="execute")
    assert done.returncode == 2 and "has 'scan' ended?" in done.stderr and done.stderr.count("\n") == 1


def test_a_command_gets_its_settings_and_directories_from_the_environment(pods: Any) -> None:
    run = pods.lay_out("shell", "say", "simrun_toymodel:Shell", {"message": "bonjour"})
    done = pods.run(pods.env(run, "say"), module="execute")
    assert done.returncode == 0, done.stderr
    task = run.task("say")
    text = (task.out / "result-files" / "message.txt").read_text()
    assert text == f"bonjour from {pods.model_root.resolve()}\n"
    assert json.loads(task.summary.read_text()) == {"length": 7, "outputs": ["result-files"]}


def test_a_failing_command_fails_the_task_with_its_exit_code(pods: Any, helpers: Any) -> None:
    run = pods.lay_out("shell-fails", "say", "simrun_toymodel:Shell", {"exit_code": 3})
    done = pods.run(pods.env(run, "say"), module="execute")
    assert done.returncode == 3 and "exited with status 3" in done.stderr
    (report,) = helpers.reports_of(run.task("say"))
    assert report.ended == WorkerEnd.FAILED and report.exit_code == 3
    assert not run.task("say").out.exists()
    assert not list(run.task("say").root.glob(".out.*"))


def test_sigterm_stops_an_unsplit_task_with_143(pods: Any, helpers: Any) -> None:
    run = pods.lay_out("shell-stopped", "say", "simrun_toymodel:Shell", {"sleep_s": 60})
    process = pods.start(pods.env(run, "say", grace_s=3), module="execute")
    helpers.wait_for(lambda: run.task("say").workers.is_dir() and list(run.task("say").workers.iterdir()))
    os.killpg(process.pid, signal.SIGTERM)
    assert helpers.finish(process, timeout=10)[0] == 143
    (report,) = helpers.reports_of(run.task("say"))
    assert report.ended == WorkerEnd.STOPPED and report.exit_code == 143
    assert not run.task("say").out.exists()


def test_exec_refuses_a_split_type(pods: Any) -> None:
    run = pods.lay_out("split-exec", "scan", SCAN, {})
    done = pods.run(pods.env(run, "scan"), module="execute")
    assert done.returncode == 2 and "is split: run task 'scan' with simrun-worker" in done.stderr


def test_a_run_dir_laid_out_by_the_cli_runs_with_the_installed_scripts(tmp_path: Path, helpers: Any) -> None:
    scripts = Path(sys.executable).parent
    laid = subprocess.run(
        [
            scripts / "simrun-rundir",
            str(tmp_path / "store"),
            "by-hand",
            "scan",
            "--type",
            SCAN,
            "--model-root",
            str(helpers.MODEL_ROOT),
            "--settings",
            '{"points": 5}',
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert laid.returncode == 0, laid.stderr
    variables = dict(item.split("=", 1) for item in laid.stdout.split())
    run_dir = Path(variables["SIMRUN_RUN_DIR"])
    assert run_dir == tmp_path / "store" / "runs" / "by-hand"
    assert json.loads((run_dir / "tasks" / "scan" / "settings.json").read_text()) == {"points": 5}
    assert (run_dir / "tasks" / "scan" / "provenance.json").is_file()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SIMRUN_")} | variables | {"SIMRUN_MERGE": "1"}
    done = subprocess.run([scripts / "simrun-worker"], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads((run_dir / "tasks" / "scan" / "out" / "summary.json").read_text())["points"] == 5


def test_a_child_that_dies_is_said_in_words() -> None:
    from simrun_runtime.pod import Stopper, death_of, run_in_child

    assert death_of(-11) == "died of SIGSEGV (exit code 139)"
    assert death_of(3) == "exited with status 3 (os._exit or a C library's exit)"
    # SIGUSR1, which pytest's faulthandler leaves alone in the forked child
    outcome = run_in_child(lambda: os.kill(os.getpid(), signal.SIGUSR1), Stopper())
    assert outcome.error == "the process died of SIGUSR1 (exit code 138)"


@pytest.mark.parametrize("kind", ["callable", "command"])
def test_an_unsplit_task_past_the_workflows_time_limit_is_killed_and_fails_naming_it(
    pods: Any, helpers: Any, kind: str
) -> None:
    if kind == "callable":
        run = pods.lay_out("slow-total", "scan", SCAN, {"points": 2})
        assert pods.run(pods.env(run, "scan")).returncode == 0
        pods.lay_out("slow-total", "t", "simrun_toymodel:Total", {"sleep_s": 120}, inputs={"table": "scan.table"})
    else:
        run = pods.lay_out("slow-shell", "t", "simrun_toymodel:Shell", {"sleep_s": 120})
    started = time.monotonic()
    done = pods.run(pods.env(run, "t", None, merge=False, SIMRUN_UNIT_TIMEOUT_S="1"), module="execute", timeout=60)
    assert time.monotonic() - started < 30
    assert done.returncode == 1, done.stderr
    failure = json.loads(run.task("t").failure.read_text())
    assert failure["exception"] == "UnitTimeout" and failure["unit"] is None
    assert failure["message"] == (
        "task 't' failed on worker exec: UnitTimeout: task 't' ran past its time limit of 1 s on worker exec "
        "and was killed"
    )
    (report,) = helpers.reports_of(run.task("t"))
    assert report.ended == WorkerEnd.FAILED and report.exit_code == 1
    assert not run.task("t").out.exists()
