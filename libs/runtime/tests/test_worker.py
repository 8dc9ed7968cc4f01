"""Worker pods as real processes on one task: elastic, deterministic, killed and stopped mid-unit, restarted."""

from __future__ import annotations

import json
import os
import signal
import time
from typing import Any

import pytest
from simrun_runtime.ledger import Ledger, create_ledger
from simrun_runtime.reports import WorkerEnd

SCAN = "simrun_toymodel:Scan"
SETTINGS = {"points": 30, "steps": 3000, "seed": 0.25}


def baseline(pods: Any, helpers: Any) -> dict[str, bytes]:
    run = pods.lay_out("one-pod", "scan", SCAN, SETTINGS)
    done = pods.run(pods.env(run, "scan", "w0", processes=2))
    assert done.returncode == 0, done.stderr
    return helpers.merged_output(run.task("scan"))


def assert_complete(task: Any, helpers: Any, count: int) -> None:
    ledger = Ledger.of(task)
    assert ledger.done_count() == count and ledger.pending_indices() == [] and ledger.claims() == {}
    assert sorted(helpers.progress_units(task)) == list(range(count))
    merged = [r for r in helpers.reports_of(task) if r.merged]
    assert [r.worker for r in merged] == ["w0"]
    assert task.merge_marker.is_file()


def test_the_merged_output_is_the_same_on_one_two_and_five_pods_with_kills(pods: Any, helpers: Any) -> None:
    expected = baseline(pods, helpers)
    assert set(expected) == {"summary.json", "table/table.csv"}
    assert json.loads(expected["summary.json"])["points"] == 30

    two = pods.lay_out("two-pods", "scan", SCAN, SETTINGS | {"sleep_s": 0.02})
    first = [pods.start(pods.env(two, "scan", w)) for w in ("w0", "w1")]
    finished = [helpers.finish(p) for p in first]
    assert [f[0] for f in finished] == [0, 0], [f[2][-2000:] for f in finished]
    assert helpers.merged_output(two.task("scan")) == expected
    assert_complete(two.task("scan"), helpers, 30)
    assert {line.split('"worker": "')[1][:2] for line in two.task("scan").progress.read_text().splitlines()} == {
        "w0",
        "w1",
    }

    five = pods.lay_out("five-pods", "scan", SCAN, SETTINGS | {"sleep_s": 0.25})
    task = five.task("scan")
    started = {w: pods.start(pods.env(five, "scan", w, grace_s=1)) for w in ("w0", "w1", "w2", "w3", "w4")}

    def computing(worker: str) -> bool:
        return task.units.claimed.is_dir() and any(p.name.endswith(f"@{worker}") for p in task.units.claimed.iterdir())

    helpers.wait_for(lambda: computing("w2"), message="w2 computing a unit")
    os.killpg(started["w2"].pid, signal.SIGKILL)
    helpers.wait_for(lambda: computing("w3"), message="w3 computing a unit")
    stop_sent = time.monotonic()
    os.killpg(started["w3"].pid, signal.SIGTERM)
    code, _, err = helpers.finish(started["w3"], timeout=10)
    assert code == 143, err
    assert time.monotonic() - stop_sent < 1  # well within SIMRUN_GRACE_S=1
    assert "w3" not in Ledger.of(task).claims()
    (stopped,) = helpers.reports_of(task, "w3")
    assert stopped.ended == WorkerEnd.STOPPED and stopped.exit_code == 143 and "released units" in stopped.message

    assert helpers.finish(started["w2"])[0] == -signal.SIGKILL
    (killed,) = helpers.reports_of(task, "w2")
    assert killed.ended == WorkerEnd.RUNNING  # the report a SIGKILLed pod leaves behind
    # The dead worker's heartbeat stops; make it older than grace + a minute instead of waiting.
    old = time.time() - 120
    os.utime(task.units.heartbeat("w2"), (old, old))

    assert [helpers.finish(started[w])[0] for w in ("w0", "w1", "w4")] == [0, 0, 0]
    assert_complete(task, helpers, 30)
    assert helpers.merged_output(task) == expected
    coordinator = helpers.reports_of(task, "w0")[0]
    assert coordinator.role == "coordinator" and coordinator.ended == WorkerEnd.DONE and coordinator.unit_seconds.count


def test_a_stale_claim_of_a_dead_worker_is_computed_by_the_coordinator(pods: Any, helpers: Any) -> None:
    run = pods.lay_out("stale", "scan", SCAN, {"points": 4})
    task = run.task("scan")
    create_ledger(task, 4)
    ledger = Ledger.of(task)
    assert ledger.claim(3, "w7")
    ledger.touch_heartbeat("w7")
    old = time.time() - 66
    os.utime(task.units.heartbeat("w7"), (old, old))
    done = pods.run(pods.env(run, "scan", "w0", grace_s=5), timeout=30)
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in task.progress.read_text().splitlines()]
    assert {(line["unit"], line["worker"]) for line in lines} == {(i, "w0") for i in range(4)}
    assert_complete(task, helpers, 4)


def test_a_restarted_worker_takes_back_its_claims_and_keeps_results_in_place(pods: Any, helpers: Any) -> None:
    run = pods.lay_out("restart", "scan", SCAN, {"points": 6})
    task = run.task("scan")
    create_ledger(task, 6)
    ledger = Ledger.of(task)
    for index in range(6):
        assert ledger.claim(index, "w1")
    # The earlier incarnation had finished unit 2's result but died before marking it done.
    done = pods.run(pods.env(run, "scan", "w1"), args=("--unit", "2", "--out", str(task.units.result(2))))
    assert done.returncode == 0, done.stderr
    done = pods.run(pods.env(run, "scan", "w1", processes=2))
    assert done.returncode == 0, done.stderr
    assert ledger.done_count() == 6
    (report,) = helpers.reports_of(task, "w1")
    # Unit 2's result was in place: five units computed, unit 2 only marked done.
    assert report.unit_seconds.count == 5 and len(report.unit_seconds.exact) == 5 and report.role == "extra"
    lines = {json.loads(line)["unit"]: json.loads(line)["seconds"] for line in task.progress.read_text().splitlines()}
    assert lines[2] is None and all(lines[i] is not None for i in (0, 1, 3, 4, 5))
    assert not task.out.exists()  # an extra worker never merges
    done = pods.run(pods.env(run, "scan", "w0"))
    assert done.returncode == 0, done.stderr
    assert json.loads(task.summary.read_text())["points"] == 6


def test_a_worker_started_before_the_ledger_waits_for_it(pods: Any, helpers: Any) -> None:
    run = pods.lay_out("waiting", "scan", SCAN, {"points": 8, "sleep_s": 0.1})
    task = run.task("scan")
    extra = pods.start(pods.env(run, "scan", "w1"))
    time.sleep(1.0)
    assert extra.poll() is None and not task.units.root.exists()
    assert helpers.finish(pods.start(pods.env(run, "scan", "w0")))[0] == 0
    assert helpers.finish(extra)[0] == 0
    assert_complete(task, helpers, 8)
    assert [r.ended for r in helpers.reports_of(task, "w1")] == [WorkerEnd.DONE]

    other = pods.lay_out("waiting-stopped", "scan", SCAN, {"points": 2})
    waiting = pods.start(pods.env(other, "scan", "w1"))
    helpers.wait_for(lambda: other.task("scan").workers.is_dir(), message="the waiting worker's report")
    os.kill(waiting.pid, signal.SIGTERM)
    assert helpers.finish(waiting, timeout=10)[0] == 143
    assert not other.task("scan").units.root.exists()
    assert [r.ended for r in helpers.reports_of(other.task("scan"))] == [WorkerEnd.STOPPED]


def test_a_failing_unit_is_retried_then_fails_the_task_naming_unit_exception_and_worker(
    pods: Any, helpers: Any
) -> None:
    run = pods.lay_out("failing", "scan", SCAN, {"points": 6, "fail_unit": 4})
    task = run.task("scan")
    done = pods.run(pods.env(run, "scan", "w0", processes=2))
    assert done.returncode == 1
    assert "[unit 4] RuntimeError: unit 4 fails on purpose" in done.stderr
    assert "unit 4 failed on worker w0 (attempt 1 of 2), given back for another try" in done.stderr
    failure = json.loads(task.failure.read_text())
    assert failure["message"] == "unit 4 failed on worker w0 (attempt 2 of 2): RuntimeError: unit 4 fails on purpose"
    assert (failure["unit"], failure["worker"], failure["exception"]) == (4, "w0", "RuntimeError")
    assert "Traceback" in failure["detail"] and "compute_unit" in failure["detail"]
    (report,) = helpers.reports_of(task)
    assert report.ended == WorkerEnd.FAILED and report.exit_code == 1 and report.message == failure["message"]
    ledger = Ledger.of(task)
    assert [unit.name for unit in ledger.failed()] == ["4~2"] and ledger.claims() == {} and not task.out.exists()
    assert ledger.done_count() < 6 and not task.merge_marker.exists()
    # A coordinator started again finds the task failed: it does not compute, merge or look done.
    again = pods.run(pods.env(run, "scan", "w0"))
    assert again.returncode == 1 and "unit 4 failed on worker w0" in again.stderr and not task.out.exists()


def test_merge_is_safe_to_repeat_after_an_interrupted_merge(pods: Any, helpers: Any) -> None:
    run = pods.lay_out("remerge", "scan", SCAN, {"points": 5})
    task = run.task("scan")
    done = pods.run(pods.env(run, "scan", "w0", merge=False))
    assert done.returncode == 0 and not task.out.exists()
    # A coordinator killed mid-merge left a half-built output aside and an unmarked out/ in place.
    task.out_building("w0-1-dead").mkdir()
    (task.out / "table").mkdir(parents=True)
    (task.out / "table" / "partial.csv").write_text("index\n0")
    done = pods.run(pods.env(run, "scan", "merge", merge=False), module="merge")
    assert done.returncode == 0, done.stderr
    assert sorted(helpers.merged_output(task)) == ["summary.json", "table/table.csv"]
    first = helpers.merged_output(task)
    assert json.loads(task.merge_marker.read_text())["by"] == "merge"
    again = pods.run(pods.env(run, "scan", None, merge=False), module="merge")
    assert again.returncode == 0 and helpers.merged_output(task) == first
    assert [r.merged for r in helpers.reports_of(task) if r.role == "merge"] == [True, False]


BAD_INPUTS = [
    ("unknown setting", {"pionts": 3}, {}, r"unknown setting 'pionts' \(did you mean 'points'\?\)"),
    ("missing task", {}, {"SIMRUN_TASK": "scna"}, r"no task directory .*scna.*tasks: scan"),
    ("unknown type", {}, {"type": "simrun_toymodel:Scna"}, r"module 'simrun_toymodel' has no 'Scna'"),
    ("settings allow extras", {}, {"type": "simrun_toymodel:Loose"}, r"must forbid unknown fields"),
    ("unsplit type", {}, {"type": "simrun_toymodel:Shell"}, r"is not split: run task 'scan' with simrun-exec"),
    ("no run dir", {}, {"SIMRUN_RUN_DIR": ""}, r"SIMRUN_RUN_DIR is not set"),
    ("bad processes", {}, {"SIMRUN_PROCESSES": "two"}, r"SIMRUN_PROCESSES='two' is not a number"),
    ("zero unit timeout", {}, {"SIMRUN_UNIT_TIMEOUT_S": "0"}, r"SIMRUN_UNIT_TIMEOUT_S='0' must be .* > 0"),
    ("bad unit timeout", {}, {"SIMRUN_UNIT_TIMEOUT_S": "soon"}, r"SIMRUN_UNIT_TIMEOUT_S='soon' is not a number"),
]


@pytest.mark.parametrize(("case", "settings", "change", "message"), BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS])
def test_bad_input_exits_2_with_one_line_and_touches_nothing(
    pods: Any, case: str, settings: dict[str, Any], change: dict[str, str], message: str
) -> None:
    import re

    run = pods.lay_out("bad", "scan", change.pop("type", SCAN), settings)
    task = run.task("scan")
    before = sorted(p.name for p in task.root.iterdir())
    done = pods.run(pods.env(run, "scan", "w0") | change)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("simrun-worker: error: ")
    assert re.search(message, done.stderr), done.stderr
    assert sorted(p.name for p in task.root.iterdir()) == before  # no ledger, no report, no progress


def test_debugging_one_unit_refuses_an_index_out_of_range(pods: Any, tmp_path: Any) -> None:
    run = pods.lay_out("debug", "scan", SCAN, {"points": 3})
    done = pods.run(pods.env(run, "scan"), args=("--unit", "3", "--out", str(tmp_path / "u3")))
    assert done.returncode == 2 and "unit 3 is out of range: task 'scan' has units 0..2" in done.stderr
    done = pods.run(pods.env(run, "scan"), args=("--unit", "2", "--out", str(tmp_path / "u2")))
    assert done.returncode == 0 and json.loads((tmp_path / "u2" / "value.json").read_text())["index"] == 2
    assert not run.task("scan").units.root.exists()


def test_merge_refuses_an_incomplete_ledger(pods: Any) -> None:
    run = pods.lay_out("incomplete", "scan", SCAN, {"points": 3})
    create_ledger(run.task("scan"), 3)
    done = pods.run(pods.env(run, "scan", "merge"), module="merge")
    assert done.returncode == 2 and "is not complete: 0 of 3 units done" in done.stderr
    assert not run.task("scan").workers.exists()
