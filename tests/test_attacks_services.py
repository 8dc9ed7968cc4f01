"""A service served alone needs tokens: without them every local process, a task's pods too (they may open
connections to loopback), would call it as the server itself, which every check lets through."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SERVICES = {
    "simrun_learner": ["--db", "{tmp}/observations.sqlite"],
    "simrun_planner": [],
    "simrun_snapshot": ["--store", "{tmp}/store"],
    "simrun_envbuilder": ["--store", "{tmp}/store"],
    "simrun_tracker": ["--config", "{tmp}/server.yaml"],
}


@pytest.mark.parametrize("module", sorted(SERVICES))
def test_a_service_alone_without_tokens_is_refused_with_what_to_do(module: str, tmp_path: Path) -> None:
    (tmp_path / "server.yaml").write_text(f"store: {tmp_path / 'store'}\naddress: 127.0.0.1:0\n")
    args = [a.format(tmp=tmp_path) for a in SERVICES[module]]
    done = subprocess.run(
        [sys.executable, "-m", module, "--address", "127.0.0.1:0", *args]
        if module != "simrun_tracker"
        else [sys.executable, "-m", module, *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert "serving without tokens lets every process of this machine call it as the server itself" in done.stderr
    assert "--no-auth" in done.stderr and "Traceback" not in done.stderr
