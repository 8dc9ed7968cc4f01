"""Identities and priorities: who a bearer token belongs to, and the priority and priority classes of their runs."""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from simrun_core.errors import InvalidArgument, Unauthenticated
from simrun_core.validation import first_error


class Priority(StrEnum):
    """The priority of a run: the owner of the cluster, the other people, the agents of the other people."""

    OWNER = "owner"
    STANDARD = "standard"
    AGENT = "agent"


class PodRole(StrEnum):
    """Which priority class of its run a pod gets: base for coordinators and unsplit pods, extra otherwise."""

    BASE = "base"
    EXTRA = "extra"


PRIORITY_VALUES: dict[Priority, dict[PodRole, int]] = {
    Priority.OWNER: {PodRole.BASE: 1000, PodRole.EXTRA: 900},
    Priority.STANDARD: {PodRole.BASE: 500, PodRole.EXTRA: 400},
    Priority.AGENT: {PodRole.BASE: 200, PodRole.EXTRA: 100},
}


def priority_class(priority: Priority | str, role: PodRole | str) -> str:
    """The name of the WorkloadPriorityClass and PriorityClass, e.g. `simrun-agent-extra`."""
    return f"simrun-{Priority(priority).value}-{PodRole(role).value}"


def priority_value(priority_class_name: str) -> int:
    """The value of a priority class named by `priority_class`."""
    try:
        _, priority, role = priority_class_name.split("-")
        return PRIORITY_VALUES[Priority(priority)][PodRole(role)]
    except (ValueError, KeyError) as exc:
        raise InvalidArgument(f"unknown priority class {priority_class_name!r}") from exc


class IdentityKind(StrEnum):
    """What an identity is."""

    OWNER = "owner"
    PERSON = "person"
    AGENT = "agent"


@dataclass(frozen=True)
class Identity:
    """A person or an agent of one, with the priority of their runs."""

    name: str
    kind: IdentityKind
    priority: Priority
    on_behalf_of: str | None = None

    @property
    def is_owner(self) -> bool:
        """The cluster's owner in person (not the owner's agents): may cancel anyone's run."""
        return self.kind is IdentityKind.OWNER


class _TokenEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1)
    agent_of: str | None = None


class _TokensFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    owner: str = Field(min_length=1, description="The name of the cluster's owner.")
    tokens: dict[str, _TokenEntry]


class TokenRegistry:
    """Maps bearer tokens to identities, from a tokens file:

    ```yaml
    owner: alice            # the cluster's owner
    tokens:
      s3cret-alice: {name: alice}
      s3cret-bob: {name: bob}
      s3cret-alice-agent: {name: alice-agent, agent_of: alice}   # priority owner
      s3cret-bob-agent: {name: bob-agent, agent_of: bob}         # priority agent
    ```
    """

    def __init__(self, owner: str, tokens: dict[str, Identity]) -> None:
        self.owner = owner
        self._tokens = tokens

    @classmethod
    def from_mapping(cls, data: object, source: str = "tokens") -> TokenRegistry:
        try:
            parsed = _TokensFile.model_validate(data)
        except ValidationError as exc:
            raise InvalidArgument(f"{source}: {first_error(exc)}") from exc
        identities: dict[str, Identity] = {}
        for token, entry in parsed.tokens.items():
            identities[token] = _identity(parsed.owner, entry)
        return cls(parsed.owner, identities)

    @classmethod
    def load(cls, path: Path) -> TokenRegistry:
        try:
            data = yaml.safe_load(path.read_text())
        except OSError as exc:
            raise InvalidArgument(f"cannot read the tokens file {path}: {exc.strerror}") from exc
        except yaml.YAMLError as exc:
            raise InvalidArgument(f"the tokens file {path} is not valid YAML: {str(exc).splitlines()[0]}") from exc
        return cls.from_mapping(data, str(path))

    def authenticate(self, token: str | None) -> Identity:
        """The identity of a bearer token; `Unauthenticated` without one or for an unknown one."""
        if not token:
            raise Unauthenticated("no bearer token: pass --token or set SIMRUN_TOKEN")
        for known, identity in self._tokens.items():
            if hmac.compare_digest(known.encode(), token.encode()):
                return identity
        raise Unauthenticated("unknown bearer token: check --token or SIMRUN_TOKEN against the tokens file")


def _identity(owner: str, entry: _TokenEntry) -> Identity:
    if entry.agent_of is None:
        if entry.name == owner:
            return Identity(entry.name, IdentityKind.OWNER, Priority.OWNER)
        return Identity(entry.name, IdentityKind.PERSON, Priority.STANDARD)
    priority = Priority.OWNER if entry.agent_of == owner else Priority.AGENT
    return Identity(entry.name, IdentityKind.AGENT, priority, on_behalf_of=entry.agent_of)
