"""Identities from bearer tokens, and the priorities and priority classes of their runs."""

from __future__ import annotations

from pathlib import Path

import pytest
from simrun_core.errors import InvalidArgument, Unauthenticated
from simrun_core.identity import (
    Identity,
    IdentityKind,
    PodRole,
    Priority,
    TokenRegistry,
    priority_class,
    priority_value,
)

TOKENS = {
    "owner": "alice",
    "tokens": {
        "t-alice": {"name": "alice"},
        "t-bob": {"name": "bob"},
        "t-alice-agent": {"name": "alice-agent", "agent_of": "alice"},
        "t-bob-agent": {"name": "bob-agent", "agent_of": "bob"},
    },
}


@pytest.fixture
def registry() -> TokenRegistry:
    return TokenRegistry.from_mapping(TOKENS)


def test_each_kind_of_identity_gets_its_priority(registry: TokenRegistry) -> None:
    assert registry.owner == "alice"
    assert registry.authenticate("t-alice") == Identity("alice", IdentityKind.OWNER, Priority.OWNER)
    assert registry.authenticate("t-bob") == Identity("bob", IdentityKind.PERSON, Priority.STANDARD)
    assert registry.authenticate("t-alice-agent") == Identity(
        "alice-agent", IdentityKind.AGENT, Priority.OWNER, on_behalf_of="alice"
    )
    assert registry.authenticate("t-bob-agent") == Identity(
        "bob-agent", IdentityKind.AGENT, Priority.AGENT, on_behalf_of="bob"
    )


def test_only_the_owner_in_person_is_owner(registry: TokenRegistry) -> None:
    assert registry.authenticate("t-alice").is_owner
    assert not registry.authenticate("t-alice-agent").is_owner
    assert not registry.authenticate("t-bob").is_owner


@pytest.mark.parametrize("token", [None, ""])
def test_no_token_is_unauthenticated(registry: TokenRegistry, token: str | None) -> None:
    with pytest.raises(Unauthenticated, match="no bearer token: pass --token or set SIMRUN_TOKEN"):
        registry.authenticate(token)


@pytest.mark.parametrize("token", ["t-carol", "t-alic", "t-alice ", "T-ALICE"])
def test_unknown_token_is_unauthenticated(registry: TokenRegistry, token: str) -> None:
    with pytest.raises(Unauthenticated, match="unknown bearer token"):
        registry.authenticate(token)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            {"owner": "alice", "tokens": {"t": {"name": "a", "agent": "b"}}},
            "tokens.t.agent: unknown field (misspelled?)",
        ),
        ({"tokens": {}}, "owner: required field is missing"),
        ({"owner": "", "tokens": {}}, "owner: "),
        ({"owner": "a", "tokens": {"t": {"name": ""}}}, "tokens.t.name: "),
        (["a"], "(top level): "),
    ],
)
def test_bad_mapping_is_one_line_invalid_argument(data: object, message: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        TokenRegistry.from_mapping(data, "tokens.yaml")
    assert str(info.value).startswith("tokens.yaml: ")
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_load_reads_a_tokens_file(tmp_path: Path) -> None:
    path = tmp_path / "tokens.yaml"
    path.write_text("owner: alice\ntokens:\n  t-bob: {name: bob}\n")
    assert TokenRegistry.load(path).authenticate("t-bob").name == "bob"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (None, "cannot read the tokens file"),
        ("owner: [alice\n", "is not valid YAML"),
        ("owner: alice\ntokens:\n  t: {name: bob, agnet_of: x}\n", "tokens.t.agnet_of: unknown field (misspelled?)"),
        ("", "(top level): "),
    ],
)
def test_bad_tokens_file_is_one_line_invalid_argument(tmp_path: Path, text: str | None, message: str) -> None:
    path = tmp_path / "tokens.yaml"
    if text is not None:
        path.write_text(text)
    with pytest.raises(InvalidArgument) as info:
        TokenRegistry.load(path)
    assert message in str(info.value)
    assert str(path) in str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("priority", "role", "name", "value"),
    [
        (Priority.OWNER, PodRole.BASE, "simrun-owner-base", 1000),
        (Priority.OWNER, PodRole.EXTRA, "simrun-owner-extra", 900),
        (Priority.STANDARD, PodRole.BASE, "simrun-standard-base", 500),
        (Priority.STANDARD, PodRole.EXTRA, "simrun-standard-extra", 400),
        (Priority.AGENT, PodRole.BASE, "simrun-agent-base", 200),
        (Priority.AGENT, PodRole.EXTRA, "simrun-agent-extra", 100),
    ],
)
def test_priority_classes_and_values(priority: Priority, role: PodRole, name: str, value: int) -> None:
    assert priority_class(priority, role) == name
    assert priority_class(priority.value, role.value) == name
    assert priority_value(name) == value


@pytest.mark.parametrize("name", ["simrun-boss-base", "simrun-owner-main", "simrun-owner", "owner-base", ""])
def test_unknown_priority_class_is_refused(name: str) -> None:
    with pytest.raises(InvalidArgument, match="unknown priority class"):
        priority_value(name)


def test_unknown_priority_is_refused_when_naming_a_class() -> None:
    with pytest.raises(ValueError):
        priority_class("boss", PodRole.BASE)
