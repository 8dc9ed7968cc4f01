"""The describer's time limit: a model whose import hangs is one clear error, soon, and not tried again."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
from simrun_core.errors import FailedPrecondition
from simrun_runtime.describe import DescribeRequest
from simrun_tracker.describer import SubprocessDescriber


def test_a_model_whose_import_hangs_fails_once_within_the_limit(tmp_path: Path) -> None:
    started = tmp_path / "started"
    (tmp_path / "hangs.py").write_text(
        f"import pathlib, time\nwith pathlib.Path({str(started)!r}).open('a') as f:\n"
        "    f.write('x')\ntime.sleep(600)\n"
    )
    describer = SubprocessDescriber(timeout_s=2)
    try:
        begun = time.monotonic()
        with pytest.raises(FailedPrecondition, match="no answer within 2 s: does importing the model hang"):
            describer.describe(sys.executable, tmp_path, [DescribeRequest(type="hangs:Task")])
        assert time.monotonic() - begun < 20
        time.sleep(0.5)
        assert started.read_text() == "x", "the describer started the hanging model a second time"
    finally:
        describer.close()
