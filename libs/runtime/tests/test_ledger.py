"""The ledger: atomic creation, one-rename transitions, claiming at a flat cost, stale claims, unit results."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest
from simrun_runtime import ledger as ledger_module
from simrun_runtime.layout import TaskLayout
from simrun_runtime.ledger import Ledger, LedgerError, create_ledger, worker_offset
from simrun_runtime.reports import ProgressLog, read_progress


@pytest.fixture
def task(tmp_path: Path) -> TaskLayout:
    task = TaskLayout(tmp_path / "runs" / "r1" / "tasks" / "scan")
    task.root.mkdir(parents=True)
    return task


def test_the_ledger_appears_whole_once_and_losers_discard_their_build(task: TaskLayout) -> None:
    barrier = threading.Barrier(6)
    outcomes: list[bool] = []

    def create() -> None:
        barrier.wait()
        outcomes.append(create_ledger(task, 500))

    threads = [threading.Thread(target=create) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert outcomes.count(True) == 1
    ledger = Ledger.of(task)
    assert ledger.count == 500 and ledger.pending_indices() == list(range(500))
    assert sorted(p.name for p in task.root.iterdir()) == ["units"]
    assert not create_ledger(task, 500)


def test_units_that_exist_but_are_no_ledger_are_refused(task: TaskLayout) -> None:
    (task.units.root / "pending").mkdir(parents=True)
    with pytest.raises(LedgerError, match="is not a ledger"):
        create_ledger(task, 3)


def test_transitions_are_single_renames(task: TaskLayout) -> None:
    create_ledger(task, 3)
    ledger = Ledger.of(task)
    assert ledger.claim(1, "w1") and not ledger.claim(1, "w2")
    assert (task.units.claimed / "1@w1").exists() and not (task.units.pending / "1").exists()
    assert ledger.own_claims("w1") == [1] and ledger.claims() == {"w1": [1]}
    assert ledger.release(1, "w1") and not ledger.release(1, "w1")
    assert ledger.claim(1, "w2") and ledger.mark_done(1, "w2") and not ledger.mark_done(1, "w2")
    assert ledger.done_count() == 1 and not ledger.is_complete()


def test_one_claimer_lists_pending_once_however_many_units(task: TaskLayout, monkeypatch: pytest.MonkeyPatch) -> None:
    listings = []
    real_scandir = os.scandir

    def counting_scandir(path: str | Path) -> os._ScandirIterator:  # type: ignore[name-defined]
        listings.append(Path(path).name)
        return real_scandir(path)

    create_ledger(task, 2000)
    monkeypatch.setattr(ledger_module.os, "scandir", counting_scandir)
    claimer = Ledger.of(task).claimer("w3")
    claimed = [claimer.claim() for _ in range(2000)]
    assert sorted(claimed) == list(range(2000))  # type: ignore[type-var]
    assert claimed[0] == worker_offset("w3", 2000) and listings == []
    assert claimer.claim() is None and listings == ["pending"]


def test_competing_claimers_take_each_unit_once_and_see_released_units(task: TaskLayout) -> None:
    create_ledger(task, 3000)
    ledger = Ledger.of(task)
    claimers = [ledger.claimer(f"w{k}") for k in range(4)]
    taken: dict[str, list[int]] = {}

    def claim_all(claimer: ledger_module.Claimer) -> None:
        mine = taken.setdefault(claimer.worker, [])
        while (index := claimer.claim()) is not None:
            mine.append(index)

    threads = [threading.Thread(target=claim_all, args=(c,)) for c in claimers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    everything = sorted(i for indices in taken.values() for i in indices)
    assert everything == list(range(3000))
    assert all(c.scans <= 2 for c in claimers)
    assert ledger.release(taken["w2"][0], "w2")
    assert claimers[0].claim() == taken["w2"][0]


def test_stale_claims_are_released_by_heartbeat_age(task: TaskLayout) -> None:
    create_ledger(task, 6)
    ledger = Ledger.of(task)
    for index, worker in [(0, "w1"), (1, "w1"), (2, "w2"), (3, "w3"), (4, "w0")]:
        assert ledger.claim(index, worker)
    for worker in ("w0", "w1", "w2"):
        ledger.touch_heartbeat(worker)
    old = time.time() - 100
    os.utime(task.units.heartbeat("w1"), (old, old))
    # w1's heartbeat is 100 s old (> 30 + 60), w2's is fresh, w3 never had one; the caller's own are kept.
    released = ledger.release_stale(grace_s=30, exclude="w0")
    assert sorted(released) == [(0, "w1"), (1, "w1"), (3, "w3")]
    assert ledger.pending_indices() == [0, 1, 3, 5]
    assert ledger.claims() == {"w0": [4], "w2": [2]}
    assert ledger.release_stale(grace_s=50, exclude="w0") == []


def test_a_duplicate_unit_result_is_discarded(task: TaskLayout) -> None:
    create_ledger(task, 2)
    ledger = Ledger.of(task)
    assert ledger.write_result(0, "w1", lambda d: (d / "value.txt").write_text("first"))
    assert not ledger.write_result(0, "w2", lambda d: (d / "value.txt").write_text("second"))
    assert (task.units.result(0) / "value.txt").read_text() == "first"
    assert list(task.units.tmp.iterdir()) == []
    with pytest.raises(ZeroDivisionError):
        ledger.write_result(1, "w1", lambda d: (d / "half").write_text(str(1 / 0)))
    assert not ledger.has_result(1) and list(task.units.tmp.iterdir()) == []


def test_progress_lines_are_whole_with_several_writers(task: TaskLayout) -> None:
    logs = [ProgressLog(task.progress) for _ in range(3)]

    def write(log: ProgressLog, worker: str) -> None:
        for unit in range(300):
            log.append(unit, worker, 0.001, time.time())

    threads = [threading.Thread(target=write, args=(log, f"w{k}")) for k, log in enumerate(logs)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for log in logs:
        log.close()
    lines = read_progress(task.progress)
    assert len(lines) == 900 and {line.worker for line in lines} == {"w0", "w1", "w2"}


def test_pending_units_are_links_to_a_few_seeds_that_do_not_remain(
    task: TaskLayout, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ledger_module, "LINKS_PER_SEED", 7)
    create_ledger(task, 20)
    ledger = Ledger.of(task)
    assert ledger.pending_indices() == list(range(20))
    assert sorted(p.name for p in task.units.root.iterdir()) == [
        "claimed",
        "count",
        "done",
        "heartbeats",
        "pending",
        "results",
        "tmp",
    ]
    assert {(task.units.pending / str(i)).stat().st_nlink for i in range(20)} == {7, 6}


def test_units_lost_from_the_ledger_are_found(task: TaskLayout) -> None:
    create_ledger(task, 4)
    ledger = Ledger.of(task)
    assert ledger.claim(0, "w1") and ledger.claim(1, "w1") and ledger.mark_done(1, "w1")
    assert ledger.has_claims() and ledger.has_pending() and ledger.missing() == []
    (task.units.pending / "3").unlink()
    assert ledger.missing() == [3]
