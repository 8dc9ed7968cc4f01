"""The server's configuration file, the home's tokens made on first start, and the token a client sends."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from simrun_core.config import ServerConfig, client_token, ensure_local_tokens, simrun_home
from simrun_core.errors import InvalidArgument
from simrun_core.identity import IdentityKind, TokenRegistry


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    monkeypatch.setenv("SIMRUN_HOME", str(home))
    monkeypatch.delenv("SIMRUN_TOKEN", raising=False)
    return home


def test_load_a_good_config(tmp_path: Path, home: Path) -> None:
    path = tmp_path / "server.yaml"
    path.write_text(
        f"store: {tmp_path / 'store'}\n"
        "address: 127.0.0.1:6000\n"
        "nodes:\n"
        "  - {name: small, cores: 2, memory_gb: 4}\n"
        "  - {name: big.1, cores: 32, memory_gb: 256, gpus: 2}\n"
        "cgroup_root: null\n"
        "services: {planner: 127.0.0.1:7000}\n"
    )
    config = ServerConfig.load(path)
    assert config.store == tmp_path / "store"
    assert config.address == "127.0.0.1:6000"
    assert [(n.name, n.cores, n.memory_gb, n.gpus) for n in config.executor.local.nodes or []] == [
        ("small", 2, 4.0, 0),
        ("big.1", 32, 256.0, 2),
    ]
    assert config.executor.local.cgroup_root is None
    assert (config.services.planner, config.services.tracker) == ("127.0.0.1:7000", "")


def test_an_empty_config_takes_the_defaults_under_the_home(tmp_path: Path, home: Path) -> None:
    path = tmp_path / "server.yaml"
    path.write_text("")
    config = ServerConfig.load(path)
    assert simrun_home() == home
    assert (config.home, config.store, config.tokens_file) == (home, home / "store", None)
    assert (config.executor.kind, config.executor.local.nodes) == ("local", None)
    assert config.executor.local.cgroup_root == "auto"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("adress: 127.0.0.1:1\n", "adress: unknown field (misspelled?)"),
        ("nodes: [{name: a, cores: 1, memory_gb: 1, gpu: 1}]\n", "nodes.0.gpu: unknown field (misspelled?)"),
        ("nodes: [{name: a, cores: 0, memory_gb: 1}]\n", "nodes.0.cores: "),
        ("nodes: [{name: a b, cores: 1, memory_gb: 1}]\n", "nodes.0.name: "),
        ("nodes: [{name: a, memory_gb: 1}]\n", "nodes.0.cores: required field is missing"),
        ("poll_s: 0\n", "poll_s: "),
        ("nodes: [\n", "bad server config"),
        ("- a\n", "(top level): "),
        (
            "nodes:\n"
            "  - {name: b, cores: 1, memory_gb: 1}\n  - {name: a, cores: 1, memory_gb: 1}\n"
            "  - {name: b, cores: 2, memory_gb: 1}\n  - {name: a, cores: 2, memory_gb: 1}\n",
            "node names must be unique: a, b",
        ),
    ],
)
def test_bad_config_is_one_line_invalid_argument(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "server.yaml"
    path.write_text(text)
    with pytest.raises(InvalidArgument) as info:
        ServerConfig.load(path)
    assert str(info.value).startswith(f"bad server config {path}: ")
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_missing_config_is_invalid_argument(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument, match=r"cannot read the server config .*No such file"):
        ServerConfig.load(tmp_path / "absent.yaml")


def test_ensure_local_tokens_makes_private_files_naming_the_user_owner(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("USER", "carol")
    home = tmp_path / "new-home"
    tokens_file, token = ensure_local_tokens(home)
    assert tokens_file == home / "tokens.yaml"
    assert (home / "token").read_text() == token + "\n"
    for path in (tokens_file, home / "token"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    identity = TokenRegistry.load(tokens_file).authenticate(token)
    assert (identity.name, identity.kind) == ("carol", IdentityKind.OWNER)


def test_ensure_local_tokens_keeps_existing_files(tmp_path: Path) -> None:
    first = ensure_local_tokens(tmp_path)
    before = (tmp_path / "tokens.yaml").read_text()
    assert ensure_local_tokens(tmp_path) == first
    assert (tmp_path / "tokens.yaml").read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["token", "tokens.yaml"]


def test_client_token_precedence(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert client_token(None) is None
    home.mkdir()
    (home / "token").write_text("from-file\n")
    assert client_token(None) == "from-file"
    monkeypatch.setenv("SIMRUN_TOKEN", "from-env")
    assert client_token(None) == "from-env"
    assert client_token("") == "from-env"
    assert client_token("explicit") == "explicit"
