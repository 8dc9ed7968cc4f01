"""The README's Python code blocks run as written, in order, in one namespace."""

from __future__ import annotations

import contextlib
import io
import os
import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def _blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)


def test_readme_code_blocks_run(alibaba_sample: Path) -> None:
    blocks = _blocks()
    assert len(blocks) == 7
    namespace: dict[str, object] = {"online_action": 1, "batch_action": 3}
    output = io.StringIO()
    with contextlib.redirect_stdout(output):
        for block in blocks:
            # The README names the samples relative to the clone; the tests find them from this file.
            if "../shared" in block:
                block = block.replace('Path("../shared/data/alibaba-sample")', f"Path({os.fspath(alibaba_sample)!r})")
            exec(compile(block, str(README), "exec"), namespace)
    printed = output.getvalue()
    assert "ProcessStatus(name='process-a', state=<ProcessState.FINISHED" in printed
    assert "SimulationReport(" in printed
    assert namespace["joint_action"] == 9
    env = namespace["env"]
    assert env.agents == []  # type: ignore[attr-defined]
    assert namespace["truncated"] is True
    assert printed.strip().endswith("690940.0")
