"""Robustness of units as real processes: time limits, retries, failure.json, failing merges, unit output, short
units claimed several at a time, ledgers written before ranges, and the fault tests at 100,000 units."""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from simrun_runtime.ledger import Ledger, UnitRange, create_ledger
from simrun_runtime.reports import ProgressReader, WorkerEnd, read_progress

SCAN = "simrun_toymodel:Scan"
TINY = "simrun_toymodel:Tiny"


def tiny_sum(units: int, seed: int = 0) -> int:
    return sum((seed * 7919 + i * i) % 1_000_003 for i in range(units))


def test_a_hanging_unit_is_killed_at_its_limit_and_the_task_goes_on(pods: Any, helpers: Any, tmp_path: Path) -> None:
    expected = pods.lay_out("expected", "scan", SCAN, {"points": 6})
    assert pods.run(pods.env(expected, "scan")).returncode == 0
    run = pods.lay_out("hang", "scan", SCAN, {"points": 6, "hang_unit": 2, "hang_once": str(tmp_path / "hung")})
    task = run.task("scan")
    started = time.monotonic()
    done = pods.run(pods.env(run, "scan", processes=2, SIMRUN_UNIT_TIMEOUT_S="1"), timeout=30)
    assert done.returncode == 0, done.stderr
    assert time.monotonic() - started < 15
    assert "unit 2 ran past its time limit of 1 s on worker w0 and was killed" in done.stderr
    assert "unit 2 failed on worker w0 (attempt 1 of 2), given back for another try" in done.stderr
    assert json.loads(task.summary.read_text()) == json.loads(expected.task("scan").summary.read_text())
    assert not task.failure.exists() and Ledger.of(task).failed() == []


def test_a_unit_whose_process_crashes_is_retried_and_the_task_goes_on(pods: Any, tmp_path: Path) -> None:
    """A unit that kills its own process (a C extension's segfault) fails that unit alone, not the pod."""
    expected = pods.lay_out("expected", "scan", SCAN, {"points": 6})
    assert pods.run(pods.env(expected, "scan")).returncode == 0
    run = pods.lay_out("crash", "scan", SCAN, {"points": 6, "crash_unit": 2, "crash_once": str(tmp_path / "crashed")})
    task = run.task("scan")
    done = pods.run(pods.env(run, "scan", processes=2), timeout=60)
    assert done.returncode == 0, done.stderr
    said = "the process computing unit 2 on worker w0 died of SIGSEGV (exit code 139)"
    retried = "unit 2 failed on worker w0 (attempt 1 of 2), given back for another try"
    assert f"{retried}: UnitCrashed: {said}" in done.stderr
    assert json.loads(task.summary.read_text()) == json.loads(expected.task("scan").summary.read_text())
    assert not task.failure.exists() and Ledger.of(task).failed() == []


@pytest.mark.parametrize(
    ("how", "said"),
    [("abort", "died of SIGABRT (exit code 134)"), ("exit", "exited with status 3 (os._exit or a C library's exit)")],
)
def test_a_unit_crashing_every_time_fails_the_task_naming_the_unit_and_how(pods: Any, how: str, said: str) -> None:
    run = pods.lay_out(f"crash-{how}", "scan", SCAN, {"points": 4, "crash_unit": 1, "crash_how": how})
    task = run.task("scan")
    done = pods.run(pods.env(run, "scan", processes=2), timeout=60)
    assert done.returncode == 1, done.stderr
    failure = json.loads(task.failure.read_text())
    assert failure["unit"] == 1 and failure["worker"] == "w0" and failure["exception"] == "UnitCrashed"
    assert failure["message"] == (
        f"unit 1 failed on worker w0 (attempt 2 of 2): UnitCrashed: the process computing unit 1 on worker w0 {said}"
    )
    assert not task.merge_marker.exists() and not task.out.exists()


def test_a_unit_killed_at_its_limit_takes_its_subprocesses_with_it(pods: Any, tmp_path: Path) -> None:
    """A unit hanging in a program it started (a solver, a simulator binary): killing the pool process alone
    would leave that program computing, orphaned, for as long as the pod lives and beyond."""
    child_pid = tmp_path / "child.pid"
    settings = {"points": 4, "hang_unit": 1, "hang_once": str(tmp_path / "hung"), "hang_child": str(child_pid)}
    run = pods.lay_out("hang-child", "scan", SCAN, settings)
    done = pods.run(pods.env(run, "scan", processes=2, SIMRUN_UNIT_TIMEOUT_S="1"), timeout=60)
    assert done.returncode == 0, done.stderr
    assert "unit 1 ran past its time limit of 1 s on worker w0 and was killed" in done.stderr
    pid = int(child_pid.read_text())
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(pid), "the unit's `sleep` outlived the unit killed at its time limit"


def test_a_units_subprocesses_get_sigterm_and_sigint_as_programs_expect(pods: Any, tmp_path: Path) -> None:
    """The pool ignores SIGTERM (the pod's main process decides how it stops), but a program a unit starts must not
    inherit that: `timeout 60 solver`, an MPI launcher, a solver's own clean-up all rely on SIGTERM."""
    seen = tmp_path / "signals"
    run = pods.lay_out("signals", "scan", SCAN, {"points": 2, "signals_to": str(seen)})
    done = pods.run(pods.env(run, "scan"), timeout=60)
    assert done.returncode == 0, done.stderr
    assert seen.read_text() == "True True"  # the defaults, as in any program started from a shell


def test_a_unit_whose_program_dies_of_the_pods_sigterm_is_given_back_without_a_failure(
    pods: Any, helpers: Any, tmp_path: Path
) -> None:
    """Stopping a pod sends SIGTERM to its process group, which now reaches the programs units started: such a unit
    fails of the stop, not of itself, and must be given back untouched (no failure counted against its retries)."""
    child_pid = tmp_path / "child.pid"
    settings = {"points": 3, "hang_unit": 1, "hang_once": str(tmp_path / "hung"), "hang_child": str(child_pid)}
    settings["sleep_s"] = 0.2
    run = pods.lay_out("stop-child", "scan", SCAN, settings)
    task = run.task("scan")
    process = pods.start(pods.env(run, "scan", processes=2, grace_s=5))
    helpers.wait_for(child_pid.exists, message="the unit's program started")
    os.killpg(process.pid, signal.SIGTERM)
    code, _, err = helpers.finish(process, timeout=30)
    assert code == 143, err
    ledger = Ledger.of(task)
    assert ledger.failed() == [] and not task.failure.exists()
    assert all(unit.failures == 0 for unit in ledger._entries(ledger.layout.pending)), err
    assert "given back for another try" not in err
    done = pods.run(pods.env(run, "scan"), timeout=60)
    assert done.returncode == 0, done.stderr
    assert sorted(helpers.progress_units(task)) == [0, 1, 2]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_unit_hanging_every_time_fails_the_task_at_the_types_own_limit(pods: Any) -> None:
    run = pods.lay_out("hang-always", "scan", "simrun_toymodel:QuickHang", {"points": 3, "hang_unit": 1})
    task = run.task("scan")
    done = pods.run(pods.env(run, "scan"), timeout=30)
    assert done.returncode == 1
    failure = json.loads(task.failure.read_text())
    assert failure["unit"] == 1 and failure["worker"] == "w0" and failure["exception"] == "UnitTimeout"
    assert failure["message"] == (
        "unit 1 failed on worker w0 (attempt 3 of 3): "
        "UnitTimeout: unit 1 ran past its time limit of 1 s on worker w0 and was killed"
    )
    assert not task.merge_marker.exists() and not task.out.exists()


def test_the_coordinator_releases_a_claim_held_past_the_limit_by_a_live_worker(pods: Any, helpers: Any) -> None:
    run = pods.lay_out("overdue", "scan", SCAN, {"points": 4, "sleep_s": 0.3})
    task = run.task("scan")
    create_ledger(task, 4)
    ledger = Ledger.of(task)
    assert ledger.claim(3, "w5")
    ledger.touch_heartbeat("w5")  # alive: never stale within this test
    done = pods.run(pods.env(run, "scan", grace_s=30, SIMRUN_UNIT_TIMEOUT_S="1"), timeout=30)
    assert done.returncode == 0, done.stderr
    assert sorted(helpers.progress_units(task)) == [0, 1, 2, 3]
    assert {line.worker for line in read_progress(task.progress)} == {"w0"}


def test_a_merge_that_raises_or_returns_no_dict_fails_the_task_with_its_message(pods: Any, helpers: Any) -> None:
    for how, exception, last in [
        ("raise", "ValueError", "ValueError: the merge fails on purpose"),
        ("list", "TypeError", "TypeError: merge of simrun_toymodel:Scan returned list, not a dict (the summary)"),
    ]:
        run = pods.lay_out(f"merge-{how}", "scan", SCAN, {"points": 3, "merge_fails": how})
        task = run.task("scan")
        done = pods.run(pods.env(run, "scan"))
        assert done.returncode == 1, done.stderr
        failure = json.loads(task.failure.read_text())
        assert failure["message"] == f"the merge of task 'scan' failed on worker w0: {last}"
        assert (failure["unit"], failure["worker"], failure["exception"]) == (None, "w0", exception)
        assert "Traceback" in failure["detail"]
        assert not task.merge_marker.exists()
        (report,) = helpers.reports_of(task)
        assert report.ended == WorkerEnd.FAILED and report.message == failure["message"]


def test_a_units_output_reaches_the_pods_log_with_every_line_prefixed(pods: Any) -> None:
    run = pods.lay_out("say", "scan", SCAN, {"points": 4, "say": True, "sleep_s": 0.1})
    done = pods.run(pods.env(run, "scan", processes=2))
    assert done.returncode == 0, done.stderr
    for index in range(4):
        assert f"[unit {index}] hello from {index}\n" in done.stdout
        assert f"[unit {index}] working on {index}...\n" in done.stderr
        assert f"[unit {index}] from a subprocess of {index}\n" in done.stdout
    assert all(line.startswith("[unit ") for line in done.stdout.splitlines())


def test_a_raising_short_unit_in_a_claim_of_many_is_retried_alone_and_named(pods: Any) -> None:
    run = pods.lay_out("tiny-fail", "tiny", TINY, {"units": 3000, "fail_unit": 2500})
    task = run.task("tiny")
    done = pods.run(pods.env(run, "tiny", processes=2))
    assert done.returncode == 1
    failure = json.loads(task.failure.read_text())
    assert failure["unit"] == 2500 and failure["exception"] == "ArithmeticError"
    assert failure["message"].endswith("(attempt 2 of 2): ArithmeticError: unit 2500 cannot be computed")
    ledger = Ledger.of(task)
    assert ledger.failed() == [UnitRange(2500, 2500, 2)] and ledger.claims() == {}
    assert 2500 not in ledger.done()


def test_short_units_are_claimed_several_at_a_time_with_one_file_per_claim(pods: Any, helpers: Any) -> None:
    run = pods.lay_out("tiny", "tiny", TINY, {"units": 20_000, "seed": 3})
    task = run.task("tiny")
    done = pods.run(pods.env(run, "tiny", processes=2))
    assert done.returncode == 0, done.stderr
    summary = json.loads(task.summary.read_text())
    assert summary == {
        "units": 20_000,
        "sum": tiny_sum(20_000, 3),
        "first": 7919 * 3,
        "last": tiny_sum(20_000, 3) - tiny_sum(19_999, 3),
    }
    ledger = Ledger.of(task)
    claims = ledger.done_ranges()
    assert ledger.done_count() == 20_000 and len(claims) < 1000
    files = sum(1 for _ in task.units.root.rglob("*"))
    assert files < 2 * len(claims) + 300  # no file per unit: a done entry and a file of values per claim
    assert sorted(helpers.progress_units(task)) == list(range(20_000))
    assert ProgressReader(task.progress).units_done() == 20_000
    (report,) = helpers.reports_of(task)
    seconds = report.unit_seconds
    assert seconds.count == 20_000 and seconds.exact is None and sum(seconds.bins.values()) == 20_000
    assert len(report.model_dump_json()) < 20_000  # of constant size, not a line per unit


def test_a_ledger_written_before_ranges_completes_and_merges(pods: Any, helpers: Any) -> None:
    expected = pods.lay_out("new", "scan", SCAN, {"points": 8})
    assert pods.run(pods.env(expected, "scan")).returncode == 0
    run = pods.lay_out("old", "scan", SCAN, {"points": 8})
    task = run.task("scan")
    units = task.units
    # The layout before ranges: one hard-linked entry per pending unit, done/<i>, results/<i>/, no failed/.
    for directory in (units.pending, units.claimed, units.done, units.heartbeats, units.results, units.tmp):
        directory.mkdir(parents=True)
    seed = units.root / "seed-0"
    seed.touch()
    for index in range(8):
        os.link(seed, units.pending / str(index))
    seed.unlink()
    (units.root / "count").write_text("8\n")
    for index in (0, 1, 2):
        os.rename(units.pending / str(index), units.done / str(index))
        shutil.copytree(expected.task("scan").units.result(index), units.result(index))
    os.rename(units.pending / "5", units.claimed / "5@w3")  # a dead worker's claim, no heartbeat
    (task.progress).write_text(
        "".join(json.dumps({"unit": i, "worker": "w1", "seconds": 0.01, "time": 1.0}) + "\n" for i in (0, 1, 2))
    )
    done = pods.run(pods.env(run, "scan", processes=2), timeout=60)
    assert done.returncode == 0, done.stderr
    assert helpers.merged_output(task) == helpers.merged_output(expected.task("scan"))
    assert sorted(helpers.progress_units(task)) == list(range(8))
    assert ProgressReader(task.progress).units_done() == 8


def test_faults_at_100000_units_lose_nothing_and_change_nothing(pods: Any, helpers: Any) -> None:
    """Three pods on 100,000 short units: an extra worker killed (SIGKILL), another stopped (SIGTERM), the
    coordinator killed and started again; the merge is the one of one pod."""
    units = 100_000
    run = pods.lay_out("faults", "tiny", TINY, {"units": units, "seed": 5, "spin_us": 20})
    task = run.task("tiny")
    reader = ProgressReader(task.progress)
    started = {w: pods.start(pods.env(run, "tiny", w, grace_s=1)) for w in ("w0", "w1", "w2")}
    # Every worker under way (its heartbeat made) before the faults: on a loaded machine one still importing could
    # otherwise be killed holding nothing, with no heartbeat to age.
    helpers.wait_for(
        lambda: reader.units_done() > 10_000 and all(task.units.heartbeat(w).exists() for w in started),
        timeout=60,
        message="10,000 units done and every worker under way",
    )
    os.killpg(started["w1"].pid, signal.SIGKILL)
    os.killpg(started["w2"].pid, signal.SIGTERM)
    assert helpers.finish(started["w2"], timeout=10)[0] == 143
    assert helpers.finish(started["w1"])[0] == -signal.SIGKILL
    old = time.time() - 120
    os.utime(task.units.heartbeat("w1"), (old, old))
    helpers.wait_for(lambda: reader.units_done() > 40_000, timeout=60, message="40,000 units done")
    os.killpg(started["w0"].pid, signal.SIGKILL)
    assert helpers.finish(started["w0"])[0] == -signal.SIGKILL
    assert not task.merge_marker.exists()
    again = pods.run(pods.env(run, "tiny", "w0", processes=2, grace_s=1), timeout=90)
    assert again.returncode == 0, again.stderr
    summary = json.loads(task.summary.read_text())
    assert summary["units"] == units and summary["sum"] == tiny_sum(units, 5)
    ledger = Ledger.of(task)
    assert ledger.done_count() == units and ledger.claims() == {} and ledger.pending_ranges() == []
    assert reader.units_done() == units
    assert sum(1 for _ in task.units.root.rglob("*")) < 2_000  # per claim, not per unit


def test_a_failed_unit_is_retried_on_another_worker(pods: Any, helpers: Any) -> None:
    run = pods.lay_out("elsewhere", "scan", SCAN, {"points": 8, "sleep_s": 0.3, "fail_unit": 2})
    task = run.task("scan")
    started = {w: pods.start(pods.env(run, "scan", w)) for w in ("w0", "w1")}
    outcomes = {w: helpers.finish(process) for w, process in started.items()}
    assert {w: outcome[0] for w, outcome in outcomes.items()} == {"w0": 1, "w1": 1}
    failure = json.loads(task.failure.read_text())
    first = next(
        w for w, outcome in outcomes.items() if "unit 2 failed on worker" in outcome[2] and "attempt 1" in outcome[2]
    )
    assert failure["unit"] == 2 and failure["message"].startswith("unit 2 failed on worker ")
    assert failure["worker"] != first  # the second attempt ran on the other worker
    assert not task.merge_marker.exists()


def test_a_worker_dying_between_its_progress_line_and_its_done_rename_leaves_the_line(tmp_path: Path) -> None:
    """The crash window of a claim: the line is written first, so done units are never missing from progress."""
    from types import SimpleNamespace

    from simrun_runtime.pool import ClaimResult
    from simrun_runtime.reports import ProgressLog, SecondsSketch
    from simrun_runtime.worker import Worker

    class Died(BaseException):
        pass

    class DiesAtTheRename:
        def mark_done(self, claim: UnitRange, worker: str) -> bool:
            raise Died

    worker = Worker.__new__(Worker)
    worker.env = SimpleNamespace(worker="w1")  # type: ignore[assignment]
    worker.keeper = SimpleNamespace(add_seconds=lambda seconds: None)  # type: ignore[assignment]
    progress = ProgressLog(tmp_path / "progress.jsonl")
    done = ClaimResult(claim=UnitRange(10, 19), done_until=20, seconds=SecondsSketch())
    try:
        with pytest.raises(Died):
            worker._settle(DiesAtTheRename(), progress, done)  # type: ignore[arg-type]
    finally:
        progress.close()
    assert ProgressReader(tmp_path / "progress.jsonl").units_done() == 10
