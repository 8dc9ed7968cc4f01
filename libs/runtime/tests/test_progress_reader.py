"""The progress reader follows progress.jsonl: distinct units, each line read once, partial lines left for later."""

from __future__ import annotations

import json
import os

from simrun_runtime.reports import ProgressLog, ProgressReader


def test_units_done_are_distinct_and_read_on_from_the_last_offset(tmp_path):
    path = tmp_path / "progress.jsonl"
    reader = ProgressReader(path)
    assert reader.units_done() == 0  # no file yet
    log = ProgressLog(path)
    for unit in (0, 1, 1, 2):  # unit 1 computed twice: two lines, one unit
        log.append(unit, "w0", 0.01, 1.0)
    assert reader.units_done() == 3
    line = json.dumps({"unit": 3, "worker": "w1", "seconds": 0.01, "time": 2.0})
    with open(path, "a") as f:
        f.write(line[:10])  # a line still being written
    assert reader.units_done() == 3
    with open(path, "a") as f:
        f.write(line[10:] + "\n")
    assert reader.units_done() == 4
    log.close()


def test_what_a_task_leaves_in_place_of_its_progress_is_no_progress(tmp_path):
    """The task writes its folder: a link (to another run's progress, /dev/zero), a FIFO or a folder is not read."""
    other = tmp_path / "other.jsonl"
    log = ProgressLog(other)
    for unit in range(5):
        log.append(unit, "w0", 0.01, 1.0)
    log.close()
    for plant in (lambda p: p.symlink_to(other), lambda p: p.symlink_to("/dev/zero"), os.mkfifo, os.mkdir):
        path = tmp_path / "task" / "progress.jsonl"
        path.parent.mkdir(exist_ok=True)
        plant(path)
        assert ProgressReader(path).units_done() == 0
        (path.rmdir if path.is_dir() and not path.is_symlink() else path.unlink)()


def test_lines_that_are_not_progress_are_skipped_and_reads_are_bounded(tmp_path, monkeypatch):
    monkeypatch.setattr(ProgressReader, "PIECE_BYTES", 1024)
    monkeypatch.setattr(ProgressReader, "READ_BYTES", 8 * 1024)
    path = tmp_path / "progress.jsonl"
    line = json.dumps({"unit": 0, "worker": "w0", "seconds": 0.01, "time": 1.0}) + "\n"
    path.write_text("not json\n" + "{" * 5000 + "\n" + line + "[1, 2]\n")
    reader = ProgressReader(path)
    assert reader.units_done() == 1
    with open(path, "a") as f:
        f.write("x" * 20_000 + "\n")  # more than one call reads: the next calls go on from where it stopped
        for unit in range(1, 4):
            f.write(json.dumps({"unit": unit, "worker": "w0", "seconds": 0.01, "time": 1.0}) + "\n")
    assert reader.units_done() == 1
    assert reader.units_done() == 1
    assert reader.units_done() == 4


def test_a_progress_file_that_did_not_grow_is_not_opened_again(tmp_path, monkeypatch):
    import simrun_runtime.reports as reports

    path = tmp_path / "progress.jsonl"
    log = ProgressLog(path)
    log.append(0, "w0", 0.01, 1.0)
    reader = ProgressReader(path)
    opened = []
    real = reports.open_beneath
    monkeypatch.setattr(reports, "open_beneath", lambda *args: opened.append(args) or real(*args))
    assert [reader.units_done() for _ in range(5)] == [1] * 5
    assert len(opened) == 1  # read once; four times it only looked at its size
    log.append(1, "w0", 0.01, 1.0)
    assert reader.units_done() == 2 and len(opened) == 2
    log.close()
