"""Fixtures of the client tests: a real embedded simrun on loopback and a git copy of the montecarlo example."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from simrun_core.config import NodeConfig, ServerConfig, ensure_local_tokens
from simrun_gateway.embedded import EmbeddedServer, start_embedded

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "montecarlo"
SLOW_WORKFLOW = """\
name: slow
tasks:
  estimate:
    type: montecarlo.tasks:EstimatePi
    settings: {units: 400, samples_per_unit: 20000000}
"""


def git(repo: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.name=simrun test", "-c", "user.email=test@simrun.invalid", *args],
        cwd=repo,
        check=True,
        capture_output=True,
    )


def copy_example(dest: Path) -> Path:
    """The montecarlo example as its own git repository (one commit), plus `slow.yaml` for cancelling."""
    shutil.copytree(EXAMPLE, dest, ignore=shutil.ignore_patterns("__pycache__", "tests", ".venv", ".pytest_cache"))
    (dest / "slow.yaml").write_text(SLOW_WORKFLOW)
    git(dest, "init", "-q", "-b", "main")
    git(dest, "add", ".")
    git(dest, "commit", "-q", "-m", "montecarlo")
    return dest


@pytest.fixture(scope="session")
def model_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return copy_example(tmp_path_factory.mktemp("model") / "montecarlo")


@dataclass(frozen=True)
class Served:
    """A running embedded simrun: where it listens, the owner's token, its store."""

    embedded: EmbeddedServer
    store: Path

    @property
    def endpoint(self) -> str:
        return self.embedded.address

    @property
    def token(self) -> str:
        return self.embedded.token


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    home = tmp_path_factory.mktemp("home")
    tokens_file, _ = ensure_local_tokens(home)
    config = ServerConfig(
        store=home / "store",
        address="127.0.0.1:0",
        tokens_file=tokens_file,
        nodes=[NodeConfig(name="node-1", cores=4, memory_gb=8)],
        grace_s=2,
    )
    embedded = start_embedded(config)
    try:
        yield Served(embedded, config.store)
    finally:
        embedded.stop()
