"""Configuration of a simrun server and of its clients: where the store is, who may call, which nodes exist."""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from simrun_core.errors import InvalidArgument

# What clients need lives in `simrun_core.home`, which imports no pydantic, so that a command starts quickly.
from simrun_core.home import DEFAULT_ENDPOINT, DEFAULT_PORT, client_token, simrun_home  # noqa: F401
from simrun_core.validation import first_error


class NodeConfig(BaseModel):
    """A node of the local executor: a share of this machine."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$", description="The node's name.")
    cores: int = Field(ge=1, description="Cores, whole.")
    memory_gb: float = Field(gt=0, description="Memory, GiB.")
    gpus: int = Field(default=0, ge=0, description="GPUs.")


class ServiceAddresses(BaseModel):
    """Where the gateway finds each service when they run apart; empty means served in this process."""

    model_config = ConfigDict(extra="forbid")
    planner: str = ""
    learner: str = ""
    snapshot: str = ""
    tracker: str = ""


class LocalExecutorConfig(BaseModel):
    """The local executor: pods as process groups on this machine."""

    model_config = ConfigDict(extra="forbid")
    nodes: list[NodeConfig] | None = Field(default=None, description="None: one node with this machine's size.")
    cgroup_root: Literal["auto"] | Path | None = Field(
        default="auto", description="Where pod memory cgroups go: auto-detected, a mount, or null (watchdog only)."
    )
    poll_s: float = Field(default=0.1, gt=0, description="Seconds between two passes of the local scheduler.")

    @field_validator("nodes")
    @classmethod
    def _unique_names(cls, nodes: list[NodeConfig] | None) -> list[NodeConfig] | None:
        names = [n.name for n in nodes or []]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"node names must be unique: {', '.join(duplicates)}")
        return nodes


class ExecutorConfig(BaseModel):
    """Which executor adapter runs the pods, and its settings."""

    model_config = ConfigDict(extra="forbid")
    kind: Literal["local", "kubernetes"] = Field(default="local", description="local: this machine; kubernetes: k3s.")
    local: LocalExecutorConfig = Field(default_factory=LocalExecutorConfig)
    kubernetes: dict[str, Any] | None = Field(
        default=None, description="The kubernetes adapter's settings, checked by its own model when chosen."
    )


class DriverConfig(BaseModel):
    """How the tracker's driver retries a step that failed for a transient reason."""

    model_config = ConfigDict(extra="forbid")
    backoff_initial_s: float = Field(default=0.5, gt=0, description="Seconds before the first retry of a step.")
    backoff_max_s: float = Field(default=30.0, gt=0, description="The longest wait between two retries, seconds.")
    give_up_s: float = Field(
        default=600.0, gt=0, description="Seconds of failing steps after which a run fails with the last error."
    )
    tick_s: float = Field(
        default=30.0,
        gt=0,
        description="Seconds between two visits of a run nothing woke: a safety net, since pod changes, "
        "submissions and cancellations wake the driver and it sets timers for what it awaits.",
    )


class ServerConfig(BaseModel):
    """Everything `simrun server` and each service's `__main__` need."""

    model_config = ConfigDict(extra="forbid")
    home: Path = Field(default_factory=simrun_home, description="Holds the default store, tokens and token.")
    store: Path = Field(default_factory=lambda: simrun_home() / "store")
    index: Path | None = Field(
        default=None, description="The run index (a cache): None for beside the store; on a cluster, local disk."
    )
    address: str = f"127.0.0.1:{DEFAULT_PORT}"
    tokens_file: Path | None = Field(default=None, description="None: the home's tokens.yaml, made if missing.")
    executor: ExecutorConfig = Field(default_factory=ExecutorConfig)
    driver: DriverConfig = Field(default_factory=DriverConfig)
    services: ServiceAddresses = Field(default_factory=ServiceAddresses)
    service_token: str = Field(default="", description="Token a service sends another (tracker to learner).")
    grace_s: float = Field(default=10.0, gt=0, description="Seconds a stopped pod has before SIGKILL.")
    merge_wait_s: float = Field(default=120.0, ge=0, description="Seconds to await the merge marker.")
    max_concurrent_calls: int = Field(
        default=1000, ge=8, description="Calls served at once (streams included); more are RESOURCE_EXHAUSTED."
    )

    @model_validator(mode="before")
    @classmethod
    def _local_settings_at_the_top(cls, data: Any) -> Any:
        """Configs written before the `executor:` section name the local executor's settings at the top."""
        if isinstance(data, dict) and any(k in data for k in ("nodes", "cgroup_root", "poll_s")):
            data = dict(data)
            executor = dict(data.get("executor") or {})
            local = dict(executor.get("local") or {})
            for key in ("nodes", "cgroup_root", "poll_s"):
                if key in data:
                    local[key] = data.pop(key)
            executor["local"] = local
            data["executor"] = executor
        return data

    @classmethod
    def load(cls, path: Path) -> ServerConfig:
        try:
            data = yaml.safe_load(path.read_text()) or {}
            return cls.model_validate(data)
        except OSError as exc:
            raise InvalidArgument(f"cannot read the server config {path}: {exc.strerror}") from exc
        except (yaml.YAMLError, ValidationError) as exc:
            raise InvalidArgument(f"bad server config {path}: {_first_error(exc)}") from exc


def _first_error(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        return first_error(exc)
    return str(exc).splitlines()[0]


def ensure_local_tokens(home: Path) -> tuple[Path, str]:
    """The home's tokens file and the owner's token, made on first start so one person can begin at once.

    The file names this machine's user the cluster's owner; the token is also written to `<home>/token`
    (mode 0600), where the CLI looks when neither --token nor SIMRUN_TOKEN is given.
    """
    home.mkdir(parents=True, exist_ok=True)
    tokens_file = home / "tokens.yaml"
    token_file = home / "token"
    if not tokens_file.exists():
        owner = os.environ.get("USER") or "owner"
        token = secrets.token_urlsafe(24)
        tmp = tokens_file.with_suffix(".tmp")
        tmp.write_text(yaml.safe_dump({"owner": owner, "tokens": {token: {"name": owner}}}))
        tmp.chmod(0o600)
        tmp.replace(tokens_file)
        token_file.write_text(token + "\n")
        token_file.chmod(0o600)
    return tokens_file, token_file.read_text().strip() if token_file.exists() else ""
