"""The progress reader follows progress.jsonl: distinct units, each line read once, partial lines left for later."""

from __future__ import annotations

import json

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
