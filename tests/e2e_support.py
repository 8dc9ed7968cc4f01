"""Helpers of the end-to-end tests: model repositories under git, test tokens, waiting for runs."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

from simrun_client.client import Client

REPO = Path(__file__).resolve().parents[1]
E2E_MODEL = Path(__file__).parent / "e2e_model"
EXAMPLE = REPO / "examples" / "montecarlo"

TOKENS = {
    "owner": "tok-alice",
    "owner-agent": "tok-alice-agent",
    "person": "tok-bob",
    "agent": "tok-bob-agent",
    "other-agent": "tok-carol-agent",
    "service": "tok-tracker-service",
}


def git_repo(source: Path, dest: Path, files: dict[str, str] | None = None) -> Path:
    """A git working tree at `dest` holding a copy of `source` (plus `files`, path -> text), committed once."""
    shutil.copytree(source, dest, ignore=shutil.ignore_patterns("__pycache__", ".pytest_cache", ".venv", "tests"))
    for path, text in (files or {}).items():
        (dest / path).write_text(text)
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    for args in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-q", "-m", "model"]):
        subprocess.run(["git", *args], cwd=dest, check=True, capture_output=True, env={**env, "PATH": "/usr/bin:/bin"})
    return dest


def research_tree(root: Path) -> Path:
    """The repository as a researcher has it: the example and the simulator it depends on by path, one git tree."""
    files = subprocess.run(
        ["git", "ls-files", "examples/clusterpolicy", "libs/cluster-sim"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    for name in files:
        dest = root / name
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes((REPO / name).read_bytes())
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    for args in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-q", "-m", "study"]):
        subprocess.run(["git", *args], cwd=root, check=True, capture_output=True, env={**env, "PATH": "/usr/bin:/bin"})
    return root / "examples" / "clusterpolicy"


def wait_final(client: Client, run_id: str, timeout_s: float = 90) -> object:
    """The run once it has ended; fails the test after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        run = client.get_run(run_id)
        if run.state >= 4:
            return run
        time.sleep(0.1)
    raise AssertionError(f"run {run_id} did not end within {timeout_s} s: {client.get_run(run_id)}")


def write_workflow(model: Path, text: str, name: str = "workflow.yaml") -> Path:
    """Writes a workflow into the model's working tree (uncommitted changes are snapshotted too)."""
    path = model / name
    path.write_text(text)
    return path


def expected_total(seed: int, units: int) -> int:
    """What a Slow task's merge computes, computed here from the model's own function."""
    sys.path.insert(0, str(E2E_MODEL))
    try:
        from e2etasks.tasks import unit_value
    finally:
        sys.path.remove(str(E2E_MODEL))
    return sum(unit_value(seed, i) for i in range(units))
