"""Fixtures of the end-to-end tests: model repositories under git, tokens, embedded servers, clients."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml
from e2e_support import E2E_MODEL, EXAMPLE, TOKENS, git_repo
from images import base_image, oci_registry  # noqa: F401  (session fixtures: tests/images.py)
from simrun_client.client import Client
from simrun_core.config import EnvironmentsConfig, NodeConfig, ServerConfig
from simrun_gateway.embedded import EmbeddedServer, start_embedded


@pytest.fixture
def e2e_model(tmp_path: Path) -> Path:
    return git_repo(E2E_MODEL, tmp_path / "e2e-model")


@pytest.fixture
def example_model(tmp_path: Path) -> Path:
    return git_repo(EXAMPLE, tmp_path / "montecarlo")


@pytest.fixture
def tokens_file(tmp_path: Path) -> Path:
    path = tmp_path / "tokens.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "owner": "alice",
                "tokens": {
                    TOKENS["owner"]: {"name": "alice"},
                    TOKENS["owner-agent"]: {"name": "alice-agent", "agent_of": "alice"},
                    TOKENS["person"]: {"name": "bob"},
                    TOKENS["agent"]: {"name": "bob-agent", "agent_of": "bob"},
                    TOKENS["other-agent"]: {"name": "carol-agent", "agent_of": "carol"},
                    TOKENS["service"]: {"name": "tracker", "service": True},
                },
            }
        )
    )
    return path


ServerFactory = Callable[..., EmbeddedServer]


@pytest.fixture
def start_server(tmp_path: Path, tokens_file: Path) -> Iterator[ServerFactory]:
    """Starts embedded servers on a free port with the test tokens; stops them at the end."""
    servers: list[EmbeddedServer] = []

    def start(nodes: list[dict] | None = None, home: Path | None = None, **settings: object) -> EmbeddedServer:
        home = home or tmp_path / "home"
        config = ServerConfig(
            home=home,
            store=home / "store",
            address="127.0.0.1:0",
            tokens_file=tokens_file,
            nodes=[NodeConfig(**n) for n in nodes] if nodes else [NodeConfig(name="node-a", cores=2, memory_gb=8)],
            grace_s=5,
            # The examples' dependencies come from PyPI: runs here use the server's Python unless a test
            # (test_e2e_environments) asks for the environment builder.
            **{"environments": EnvironmentsConfig(kind="server"), **settings},
        )
        server = start_embedded(config)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture
def client_for() -> Iterator[Callable[[EmbeddedServer, str], Client]]:
    clients: list[Client] = []

    def make(server: EmbeddedServer, who: str = "owner") -> Client:
        client = Client(server.address, TOKENS[who])
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()
