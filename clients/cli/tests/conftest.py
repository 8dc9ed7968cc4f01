"""Fixtures of the CLI tests: a real embedded simrun on loopback, a git copy of the montecarlo example, a runner."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from e2e_support import EXAMPLE, git_repo
from simrun_cli.main import cli
from simrun_core.config import EnvironmentsConfig, ServerConfig
from simrun_gateway.embedded import EmbeddedServer, start_embedded

SLOW_WORKFLOW = """\
name: slow
tasks:
  estimate:
    type: montecarlo.tasks:EstimatePi
    settings: {units: 400, samples_per_unit: 20000000}
"""


def copy_example(dest: Path) -> Path:
    """The montecarlo example as its own git repository (one commit), plus `slow.yaml` to cancel."""
    return git_repo(EXAMPLE, dest, {"slow.yaml": SLOW_WORKFLOW})


@pytest.fixture(scope="session")
def model_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return copy_example(tmp_path_factory.mktemp("model") / "montecarlo")


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedServer]:
    home = tmp_path_factory.mktemp("home")
    config = ServerConfig(
        home=home,
        store=home / "store",
        address="127.0.0.1:0",
        grace_s=2,
        environments=EnvironmentsConfig(kind="server"),  # the example's numpy is the server's; no PyPI in tests
    )
    embedded = start_embedded(config)
    try:
        yield embedded
    finally:
        embedded.stop()


@pytest.fixture(scope="session")
def invoke(server: EmbeddedServer) -> Callable[..., Result]:
    """Runs `simrun ARGS…` in process against the embedded server (found through SIMRUN_ENDPOINT and SIMRUN_TOKEN)."""
    env = {"SIMRUN_ENDPOINT": server.address, "SIMRUN_TOKEN": server.token, "COLUMNS": "160"}

    def run(*args: str | Path) -> Result:
        return CliRunner().invoke(cli, [str(a) for a in args], env=env, catch_exceptions=False)

    return run
