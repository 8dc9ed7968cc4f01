"""The ledger: atomic creation, one-rename transitions, claiming at a flat cost, stale claims, unit results."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest
from simrun_runtime import ledger as ledger_module
from simrun_runtime.layout import TaskLayout
from simrun_runtime.ledger import IntervalSet, Ledger, LedgerError, UnitRange, create_ledger, worker_offset
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
    assert ledger.own_claims("w1") == [UnitRange.one(1)] and ledger.claims() == {"w1": [UnitRange.one(1)]}
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
    assert len(Ledger.of(task).pending_ranges()) == 65  # ranges of 2000 // 64 = 31 units
    monkeypatch.setattr(ledger_module.os, "scandir", counting_scandir)
    claimer = Ledger.of(task).claimer("w3")
    claimed = [claimer.claim() for _ in range(2000)]
    assert all(unit is not None and unit.size == 1 for unit in claimed)
    assert sorted(unit.first for unit in claimed) == list(range(2000))  # type: ignore[union-attr]
    assert claimed[0].first // 31 == worker_offset("w3", 2000) // 31 and listings == ["pending"]  # type: ignore[union-attr]
    assert claimer.claim() is None and listings == ["pending", "pending"]


def test_claims_of_several_units_are_one_rename_and_split_the_rest_back(task: TaskLayout) -> None:
    create_ledger(task, 100, block=10)
    ledger = Ledger.of(task)
    claimer = ledger.claimer("w0")
    assert claimer.claim(4) == UnitRange(0, 3)
    assert ledger.claims() == {"w0": [UnitRange(0, 3)]} and UnitRange(4, 9) in ledger.pending_ranges()
    assert claimer.claim(50) == UnitRange(4, 9)  # a claim never spans two ranges
    assert claimer.claim(10) == UnitRange(10, 19)
    assert ledger.mark_done(UnitRange(0, 3), "w0") and (task.units.done / "0-3").exists()
    assert ledger.done_count() == 4 and ledger.missing() == []


def test_competing_claimers_take_each_unit_once_and_see_released_units(task: TaskLayout) -> None:
    create_ledger(task, 3000)
    ledger = Ledger.of(task)
    claimers = [ledger.claimer(f"w{k}") for k in range(4)]
    taken: dict[str, list[UnitRange]] = {}

    def claim_all(claimer: ledger_module.Claimer, want: int) -> None:
        mine = taken.setdefault(claimer.worker, [])
        while (unit := claimer.claim(want)) is not None:
            mine.append(unit)

    threads = [threading.Thread(target=claim_all, args=(c, 1 + 3 * k)) for k, c in enumerate(claimers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    everything = sorted(i for units in taken.values() for unit in units for i in unit.indices())
    assert everything == list(range(3000))
    assert sum(len(ledger.own_claims(f"w{k}")) for k in range(4)) == sum(len(units) for units in taken.values())
    assert ledger.release(taken["w2"][0], "w2")
    assert claimers[0].claim(100) == taken["w2"][0]


def test_a_split_that_died_half_way_gives_each_unit_back_once(task: TaskLayout) -> None:
    create_ledger(task, 20, block=20)
    ledger = Ledger.of(task)
    assert ledger.claim(UnitRange(0, 19), "w1")
    # The worker linked the second name of a split of 0-19 at 5 and died before renaming the first.
    os.link(task.units.claimed_entry("0-19", "w1"), task.units.claimed_entry("5-19", "w1"))
    assert ledger.claims() == {"w1": [UnitRange(0, 19), UnitRange(5, 19)]}
    assert ledger.release_stale(grace_s=0, exclude="w0") == [(UnitRange(0, 19), "w1")]
    assert ledger.pending_ranges() == [UnitRange(0, 19)] and ledger.claims() == {}
    # A restarted incarnation takes back the outermost claim only.
    assert ledger.claim(UnitRange(0, 19), "w2")
    os.link(task.units.claimed_entry("0-19", "w2"), task.units.claimed_entry("5-19", "w2"))
    assert ledger.take_back("w2") == [UnitRange(0, 19)] and ledger.own_claims("w2") == [UnitRange(0, 19)]


def test_a_failed_unit_carries_its_failures_and_is_tried_last_by_the_worker_it_failed_on(task: TaskLayout) -> None:
    create_ledger(task, 3)
    ledger = Ledger.of(task)
    assert ledger.claim(1, "w1") and ledger.retry(UnitRange.one(1), "w1", 1)
    assert (task.units.pending / "1~1").exists() and ledger.pending_ranges()[1] == UnitRange(1, 1, 1)
    claimer = ledger.claimer("w1", avoid={1: time.monotonic() - 60})
    assert sorted(unit.name for unit in (claimer.claim(), claimer.claim(), claimer.claim())) == ["0", "1~1", "2"]
    assert ledger.own_claims("w1")[1] == UnitRange(1, 1, 1)
    assert ledger.mark_failed(UnitRange(1, 1, 1), "w1", 2) and ledger.failed() == [UnitRange(1, 1, 2)]
    assert ledger.has_failed() and ledger.missing() == []


def test_claims_held_past_their_time_limit_are_released(task: TaskLayout) -> None:
    create_ledger(task, 4)
    ledger = Ledger.of(task)
    assert ledger.claim(0, "w1") and ledger.claim(1, "w0")
    later = time.time() + 10
    assert ledger.release_overdue(limit_s=100, exclude="w0", now=later) == []
    assert ledger.release_overdue(limit_s=4, exclude="w0", now=later) == [(UnitRange.one(0), "w1")]
    assert ledger.claims() == {"w0": [UnitRange.one(1)]}


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
    assert sorted(released) == [(UnitRange.one(0), "w1"), (UnitRange.one(1), "w1"), (UnitRange.one(3), "w3")]
    assert ledger.pending_indices() == [0, 1, 3, 5]
    assert ledger.claims() == {"w0": [UnitRange.one(4)], "w2": [UnitRange.one(2)]}
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


def test_a_new_ledger_is_a_few_hundred_ranges_however_many_units(task: TaskLayout) -> None:
    create_ledger(task, 100_000)
    ledger = Ledger.of(task)
    ranges = ledger.pending_ranges()
    assert len(ranges) == 98 and ranges[0] == UnitRange(0, 1023) and ranges[-1].last == 99_999
    assert sum(unit.size for unit in ranges) == 100_000
    assert sorted(p.name for p in task.units.root.iterdir()) == [
        "claimed",
        "count",
        "done",
        "failed",
        "heartbeats",
        "pending",
        "results",
        "tmp",
    ]


def test_the_interval_set_counts_distinct_units_of_overlapping_ranges() -> None:
    units = IntervalSet()
    for first, last in [(5, 9), (0, 2), (3, 4), (8, 12), (20, 20), (0, 0)]:
        units.add(first, last)
    assert units.total == 14 and list(units.ranges()) == [(0, 12), (20, 20)]
    assert 12 in units and 13 not in units and 20 in units


def test_units_lost_from_the_ledger_are_found(task: TaskLayout) -> None:
    create_ledger(task, 4)
    ledger = Ledger.of(task)
    assert ledger.claim(0, "w1") and ledger.claim(1, "w1") and ledger.mark_done(1, "w1")
    assert ledger.has_claims() and ledger.has_pending() and ledger.missing() == []
    (task.units.pending / "3").unlink()
    assert ledger.missing() == [3]
