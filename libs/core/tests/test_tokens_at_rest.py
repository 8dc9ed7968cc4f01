"""Tokens at rest: hashes in the tokens file, plaintext files migrated, files private from their creation."""

from __future__ import annotations

import contextlib
import os
import stat
import threading
from pathlib import Path

import pytest
import yaml
from simrun_core.config import ensure_local_tokens, private_dir
from simrun_core.errors import FailedPrecondition, InvalidArgument, Unauthenticated
from simrun_core.homelock import HomeLock
from simrun_core.identity import IdentityKind, TokenRegistry, add_token, is_hashed, remove_tokens, token_hash


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_first_start_writes_hashes_and_private_files(tmp_path: Path) -> None:
    home = tmp_path / "home"
    tokens_file, token = ensure_local_tokens(home)
    data = yaml.safe_load(tokens_file.read_text())
    assert token not in tokens_file.read_text()
    assert list(data["tokens"]) == [token_hash(token)]
    assert (home / "token").read_text().strip() == token
    assert (mode(home), mode(tokens_file), mode(home / "token")) == (0o700, 0o600, 0o600)
    assert TokenRegistry.load(tokens_file).authenticate(token).kind is IdentityKind.OWNER


def test_files_are_private_with_no_window(tmp_path: Path) -> None:
    """Even with a permissive umask, the file never exists with wider rights than 0600."""
    seen: list[int] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            for path in (tmp_path / "home").glob("*"):
                with contextlib.suppress(FileNotFoundError):
                    seen.append(mode(path) if path.is_file() else 0o600)

    old = os.umask(0)
    thread = threading.Thread(target=watch)
    thread.start()
    try:
        for _i in range(20):
            ensure_local_tokens(tmp_path / "home")
            (tmp_path / "home" / "tokens.yaml").unlink()
    finally:
        stop.set()
        thread.join()
        os.umask(old)
    assert seen and set(seen) == {0o600}


def test_a_plaintext_tokens_file_is_migrated_on_load(tmp_path: Path) -> None:
    path = tmp_path / "tokens.yaml"
    path.write_text("owner: alice\ntokens:\n  t-alice: {name: alice}\n  t-bob: {name: bob}\n")
    registry = TokenRegistry.load(path)
    assert registry.authenticate("t-bob").name == "bob"
    text = path.read_text()
    assert "t-alice" not in text and "t-bob" not in text
    assert all(is_hashed(k) for k in yaml.safe_load(text)["tokens"])
    assert mode(path) == 0o600
    assert TokenRegistry.load(path).authenticate("t-alice").name == "alice"


def test_a_hash_is_not_a_token(tmp_path: Path) -> None:
    path = tmp_path / "tokens.yaml"
    path.write_text(f"owner: alice\ntokens:\n  {token_hash('t-alice')}: {{name: alice}}\n")
    with pytest.raises(Unauthenticated):
        TokenRegistry.load(path).authenticate(token_hash("t-alice"))


def test_an_unwritable_plaintext_file_is_refused_with_what_to_do(tmp_path: Path) -> None:
    folder = tmp_path / "ro"
    folder.mkdir()
    path = folder / "tokens.yaml"
    path.write_text("owner: alice\ntokens:\n  t-alice: {name: alice}\n")
    folder.chmod(0o500)
    try:
        if os.access(folder, os.W_OK):
            pytest.skip("root writes anyway")
        with pytest.raises(InvalidArgument, match="plaintext tokens and cannot be rewritten"):
            TokenRegistry.load(path)
    finally:
        folder.chmod(0o700)


def test_add_prints_once_and_a_running_registry_picks_it_up(tmp_path: Path) -> None:
    tokens_file, owner_token = ensure_local_tokens(tmp_path / "home")
    registry = TokenRegistry.load(tokens_file)
    token, identity = add_token(tokens_file, "bob")
    agent_token, _agent = add_token(tokens_file, "bob-agent", agent_of="bob")
    service_token, service = add_token(tokens_file, "tracker", service=True)
    assert token not in tokens_file.read_text() and agent_token not in tokens_file.read_text()
    assert registry.authenticate(token) == identity and identity.kind is IdentityKind.PERSON
    assert registry.authenticate(agent_token).on_behalf_of == "bob"
    assert registry.authenticate(service_token).is_service and service.is_service
    assert mode(tokens_file) == 0o600
    assert remove_tokens(tokens_file, "bob") == 1
    with pytest.raises(Unauthenticated):
        registry.authenticate(token)
    assert registry.authenticate(owner_token).is_owner


@pytest.mark.parametrize(
    ("name", "agent_of", "service", "message"),
    [
        ("bob agent", None, False, "name"),
        ("x", "bob-agent", False, "is not a person"),
        ("y", "bob", True, "acts for nobody"),
        ("bob", "alice", False, "exists already as another kind"),
    ],
)
def test_bad_additions_are_refused(
    tmp_path: Path, name: str, agent_of: str | None, service: bool, message: str
) -> None:
    tokens_file, _ = ensure_local_tokens(tmp_path / "home")
    add_token(tokens_file, "bob")
    add_token(tokens_file, "bob-agent", agent_of="bob")
    before = tokens_file.read_text()
    with pytest.raises(InvalidArgument, match=message):
        add_token(tokens_file, name, agent_of, service)
    assert tokens_file.read_text() == before


def test_private_dir_narrows_an_old_home(tmp_path: Path) -> None:
    home = tmp_path / "old"
    home.mkdir(mode=0o755)
    home.chmod(0o755)
    assert mode(private_dir(home)) == 0o700
    with pytest.raises(InvalidArgument, match="no group"):
        private_dir(home, "no-such-group-here")


def test_a_second_lock_on_a_home_is_refused_naming_the_first(tmp_path: Path) -> None:
    first = HomeLock(tmp_path)
    try:
        with pytest.raises(FailedPrecondition, match=rf"another simrun server \(pid {os.getpid()}\) uses the home"):
            HomeLock(tmp_path)
    finally:
        first.release()
    HomeLock(tmp_path).release()
