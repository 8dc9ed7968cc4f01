"""Identities and priorities: who a bearer token belongs to, and the priority and priority classes of their runs."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import hmac
import logging
import os
import secrets
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from simrun_core.errors import InvalidArgument, Unauthenticated
from simrun_core.validation import first_error

log = logging.getLogger(__name__)


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
    SERVICE = "service"
    """A part of simrun calling another (the tracker recording observations at the learner); submits no runs."""


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

    @property
    def is_service(self) -> bool:
        """A service identity: the only one that may write the learner."""
        return self.kind is IdentityKind.SERVICE

    @property
    def person(self) -> str:
        """The person this identity stands for: itself, or the person an agent acts for."""
        return self.on_behalf_of or self.name


HASH_PREFIX = "sha256:"


def token_hash(token: str) -> str:
    """What the tokens file stores of a token: `sha256:<hex>`.

    Tokens are 32 random bytes (`new_token`), so a fast unsalted hash is enough: nobody can search that space,
    and a hash read from the file cannot be sent as a token.
    """
    return HASH_PREFIX + hashlib.sha256(token.encode()).hexdigest()


def new_token() -> str:
    """A new bearer token: 32 random bytes, URL-safe."""
    return secrets.token_urlsafe(32)


def is_hashed(key: str) -> bool:
    """Whether a key of the tokens file is a token's hash (not a plaintext token of an older file)."""
    return key.startswith(HASH_PREFIX) and len(key) == len(HASH_PREFIX) + 64


class _TokenEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9._@-]*$")
    agent_of: str | None = None
    service: bool = False


class _TokensFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    owner: str = Field(min_length=1, description="The name of the cluster's owner.")
    tokens: dict[str, _TokenEntry]


class TokenRegistry:
    """Maps bearer tokens to identities, from a tokens file that holds each token's hash, never the token:

    ```yaml
    owner: alice            # the cluster's owner
    tokens:
      sha256:9f86d0…: {name: alice}
      sha256:60303a…: {name: bob}
      sha256:fd61a0…: {name: alice-agent, agent_of: alice}   # priority owner
      sha256:a4e624…: {name: bob-agent, agent_of: bob}       # priority agent
      sha256:3c9909…: {name: tracker, service: true}         # the tracker, writing the learner
    ```

    `simrun tokens add NAME [--agent-of PERSON]` adds one and prints the token once. A file of an older simrun
    with plaintext tokens as keys is rewritten with their hashes when it is loaded (`load`), so a token that
    worked keeps working and the plaintext leaves the disk.
    """

    def __init__(self, owner: str, tokens: dict[str, Identity], path: Path | None = None) -> None:
        self.owner = owner
        self._tokens = tokens
        self._path = path
        self._stamp = _stamp(path) if path else None
        self._reload_lock = threading.Lock()

    @classmethod
    def from_mapping(cls, data: object, source: str = "tokens", path: Path | None = None) -> TokenRegistry:
        """A registry of a parsed tokens file; a key that is not a hash is taken as a plaintext token."""
        parsed = _parse(data, source)
        identities = {
            (key if is_hashed(key) else token_hash(key)): _identity(parsed.owner, entry)
            for key, entry in parsed.tokens.items()
        }
        return cls(parsed.owner, identities, path)

    @classmethod
    def load(cls, path: Path) -> TokenRegistry:
        """Reads a tokens file, migrating plaintext tokens to hashes in place; it is re-read when it changes."""
        data = _read(path)
        parsed = _parse(data, str(path))
        plaintext = [key for key in parsed.tokens if not is_hashed(key)]
        if plaintext:
            migrated = {(k if is_hashed(k) else token_hash(k)): v for k, v in data["tokens"].items()}
            try:
                write_private(path, yaml.safe_dump({**data, "tokens": migrated}, sort_keys=False))
            except OSError as exc:
                raise InvalidArgument(
                    f"the tokens file {path} holds {len(plaintext)} plaintext tokens and cannot be rewritten with "
                    f"their hashes ({exc.strerror}): make it writable, or replace each token with `sha256:` and "
                    "its SHA-256 hex digest"
                ) from exc
            log.warning("tokens file %s: replaced %d plaintext tokens by their hashes", path, len(plaintext))
        return cls.from_mapping(_read(path) if plaintext else data, str(path), path)

    def authenticate(self, token: str | None) -> Identity:
        """The identity of a bearer token; `Unauthenticated` without one or for an unknown one."""
        if not token:
            raise Unauthenticated("no bearer token: pass --token or set SIMRUN_TOKEN")
        self._reload_if_changed()
        digest = token_hash(token)
        tokens = self._tokens
        for known, identity in tokens.items():
            if hmac.compare_digest(known.encode(), digest.encode()):
                return identity
        raise Unauthenticated("unknown bearer token: check --token or SIMRUN_TOKEN against the tokens file")

    def _reload_if_changed(self) -> None:
        """Picks up tokens added or removed (`simrun tokens add`) without a restart; a broken file keeps the last."""
        if self._path is None or _stamp(self._path) == self._stamp:
            return
        with self._reload_lock:
            stamp = _stamp(self._path)
            if stamp == self._stamp:
                return
            try:
                fresh = TokenRegistry.load(self._path)
            except InvalidArgument as exc:
                log.error("keeping the tokens loaded before: %s", exc)
                self._stamp = stamp
                return
            self.owner, self._tokens, self._stamp = fresh.owner, fresh._tokens, fresh._stamp

    def names(self) -> list[Identity]:
        """The identities of the file, one per token."""
        self._reload_if_changed()
        return list(self._tokens.values())


def _stamp(path: Path) -> tuple[int, int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


def _read(path: Path) -> Any:
    try:
        return yaml.safe_load(path.read_text())
    except OSError as exc:
        raise InvalidArgument(f"cannot read the tokens file {path}: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise InvalidArgument(f"the tokens file {path} is not valid YAML: {str(exc).splitlines()[0]}") from exc


def _parse(data: object, source: str) -> _TokensFile:
    try:
        return _TokensFile.model_validate(data)
    except ValidationError as exc:
        raise InvalidArgument(f"{source}: {first_error(exc)}") from exc


def write_private(path: Path, text: str) -> None:
    """Writes a file only its owner can read (0600 from its creation: no moment with wider rights), atomically."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def add_token(path: Path, name: str, agent_of: str | None = None, service: bool = False) -> tuple[str, Identity]:
    """Adds a new token for `name` to a tokens file and returns the token (shown once, stored as its hash).

    Raises:
        InvalidArgument: a bad name, an agent of an agent or of a service, or a name already used by another kind.
    """
    with _file_lock(path):
        data = _read(path)
        parsed = _parse(data, str(path))
        entry = _parse(
            {"owner": parsed.owner, "tokens": {"new": {"name": name, "agent_of": agent_of, "service": service}}},
            "the new token",
        ).tokens["new"]
        if entry.service and entry.agent_of:
            raise InvalidArgument("a service token acts for nobody: drop --agent-of")
        known = {e.name: e for e in parsed.tokens.values()}
        if agent_of is not None and agent_of in known and (known[agent_of].agent_of or known[agent_of].service):
            raise InvalidArgument(f"{agent_of} is not a person: an agent acts for a person")
        if name in known and (known[name].agent_of, known[name].service) != (entry.agent_of, entry.service):
            raise InvalidArgument(f"{name} exists already as another kind of identity: pick another name")
        token = new_token()
        tokens = {**data["tokens"], token_hash(token): entry.model_dump(exclude_defaults=True)}
        write_private(path, yaml.safe_dump({**data, "tokens": tokens}, sort_keys=False))
    return token, _identity(parsed.owner, entry)


def remove_tokens(path: Path, name: str) -> int:
    """Removes every token of `name` from a tokens file; the number removed (0: no such name)."""
    with _file_lock(path):
        data = _read(path)
        parsed = _parse(data, str(path))
        keep = {k: v for k, v in data["tokens"].items() if parsed.tokens[k].name != name}
        removed = len(data["tokens"]) - len(keep)
        if removed:
            write_private(path, yaml.safe_dump({**data, "tokens": keep}, sort_keys=False))
    return removed


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    fd = os.open(path.with_name(f".{path.name}.lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _identity(owner: str, entry: _TokenEntry) -> Identity:
    if entry.service:
        return Identity(entry.name, IdentityKind.SERVICE, Priority.STANDARD)
    if entry.agent_of is None:
        if entry.name == owner:
            return Identity(entry.name, IdentityKind.OWNER, Priority.OWNER)
        return Identity(entry.name, IdentityKind.PERSON, Priority.STANDARD)
    priority = Priority.OWNER if entry.agent_of == owner else Priority.AGENT
    return Identity(entry.name, IdentityKind.AGENT, priority, on_behalf_of=entry.agent_of)
