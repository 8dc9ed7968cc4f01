"""Configuration of a simrun server and of its clients: where the store is, who may call, which nodes exist."""

from __future__ import annotations

import grp
import ipaddress
import os
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from simrun_core.errors import InvalidArgument

# What clients need lives in `simrun_core.home`, which imports no pydantic, so that a command starts quickly.
from simrun_core.home import DEFAULT_ENDPOINT, DEFAULT_PORT, client_token, simrun_home  # noqa: F401
from simrun_core.identity import new_token, token_hash, write_private
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
    envbuilder: str = ""


class ImagesConfig(BaseModel):
    """Where the environment builder pushes images: the registry, the builder (BuildKit or buildah), the base images."""

    model_config = ConfigDict(extra="forbid")
    builder: Literal["buildkit", "buildah"] = Field(
        default="buildkit",
        description="buildkit: buildctl against buildkitd (a cluster); buildah: buildah on this machine, as root.",
    )
    registry: str = Field(min_length=1, description="host:port of the registry, e.g. zot.simrun.svc:5000.")
    repository: str = Field(default="simrun/environments", description="The repository of environments.")
    base_images: dict[str, str] = Field(description="Base image by digest (name@sha256:...) per Python, e.g. 3.11.")
    insecure: bool = Field(default=False, description="The registry speaks plain HTTP.")
    buildkit_addr: str = Field(default="", description="buildkitd's address, e.g. tcp://buildkitd:1234.")
    ca_bundle: Path | None = Field(default=None, description="A CA bundle the image needs to reach the index.")
    username: str = Field(default="", description="The registry's user, for a registry that asks for credentials.")
    password_file: Path | None = Field(
        default=None, description="A file holding the registry user's password (or token), read at start."
    )


class EnvironmentsConfig(BaseModel):
    """The environment builder: where its venvs live (local disk), which index uv locks against, when old ones go."""

    model_config = ConfigDict(extra="forbid")
    kind: Literal["venv", "image", "server"] = Field(
        default="venv",
        description="venv: a locked venv per model with a pyproject.toml; image: an image per lock (images:); "
        "server: every run in the server's Python.",
    )
    images: ImagesConfig | None = Field(default=None, description="Required for kind image.")
    root: Path | None = Field(default=None, description="None: <home>/environments; never on NFS.")
    index_url: str = Field(default="", description="The package index uv locks against; empty: uv's default (PyPI).")
    find_links: list[str] = Field(default_factory=list, description="Folders or pages of wheels uv also uses.")
    no_index: bool = Field(default=False, description="Use only find_links, no index.")
    local_git_roots: list[Path] = Field(
        default_factory=list,
        description="Folders whose git repositories a model may depend on by git+file:// (a lock reads them); "
        "none by default, so no submitter makes the server clone a repository of its own disk.",
    )
    constraints: Path | None = Field(default=None, description="Constraints file for build backends; None: built in.")
    interpreters: list[str] = Field(default_factory=list, description="Pythons to use besides those found here.")
    uv_cache_dir: Path | None = Field(default=None, description="uv's cache; None: uv's default.")
    max_age_days: float = Field(default=30.0, gt=0, description="An environment unused this long is removed.")
    max_total_gb: float = Field(default=50.0, gt=0, description="Beyond this, least recently used ones go, GiB.")
    compile_bytecode: bool = Field(default=True, description="Compile each new venv to bytecode once it is ready.")


class TlsConfig(BaseModel):
    """TLS of every server of the config (the gateway and each service alone), and of the gateway's calls to them."""

    model_config = ConfigDict(extra="forbid")
    cert: Path = Field(description="PEM certificate chain the servers present.")
    key: Path = Field(description="PEM private key of the certificate.")
    client_ca: Path | None = Field(
        default=None, description="PEM CA bundle: when set, clients must present a certificate it signed (mutual TLS)."
    )
    ca: Path | None = Field(
        default=None, description="PEM CA bundle the gateway and tracker verify the services apart with."
    )


class Limits(BaseModel):
    """Bounds on what one submission or upload may ask; each is refused with INVALID_ARGUMENT before any write."""

    model_config = ConfigDict(extra="forbid")
    units_per_task: int = Field(
        default=10_000_000,
        ge=1,
        le=2**31 - 1,
        description="Units a split task may count; at most 2^31-1, so every unit count fits the API's int32 fields.",
    )
    tasks_per_workflow: int = Field(default=200, ge=1, description="Tasks of one workflow.")
    workflow_bytes: int = Field(default=1 << 20, ge=1, description="Size of a workflow's text, bytes.")
    upload_bytes: int = Field(default=4 << 30, ge=1, description="Size of one snapshot upload (its tar), bytes.")
    files_per_snapshot: int = Field(default=200_000, ge=1, description="Files of one snapshot.")
    path_component_bytes: int = Field(
        default=255, ge=1, le=255, description="Bytes of one component of a snapshot path (255: the file systems')."
    )
    active_runs_per_identity: int = Field(default=50, ge=1, description="Runs not yet ended per identity.")
    calls_per_identity: int = Field(
        default=200,
        ge=1,
        description="Calls one identity (not the owner, not a service) has open at once, streams included; one "
        "more is RESOURCE_EXHAUSTED, so no identity holds all of max_concurrent_calls.",
    )
    output_bytes_per_task: int = Field(
        default=50 << 30, ge=1, description="Bytes of a task's outputs; a task past it fails with a message."
    )


class ReadPolicy(BaseModel):
    """Whose runs an identity sees (get, list, logs, compare, watch, snapshots' provenance).

    The owner sees every run; a person sees their own and their agents'; an agent sees its own.
    """

    model_config = ConfigDict(extra="forbid")
    agents_see_their_person: bool = Field(
        default=False, description="An agent also sees the runs of the person it acts for (and of their agents)."
    )
    people_see_all: bool = Field(default=False, description="Every person sees every run (a team that shares).")


class LocalExecutorConfig(BaseModel):
    """The local executor: pods as process groups on this machine."""

    model_config = ConfigDict(extra="forbid")
    nodes: list[NodeConfig] | None = Field(default=None, description="None: one node with this machine's size.")
    cgroup_root: Literal["auto"] | Path | None = Field(
        default="auto", description="Where pod memory cgroups go: auto-detected, a mount, or null (watchdog only)."
    )
    poll_s: float = Field(default=0.1, gt=0, description="Seconds between two passes of the local scheduler.")
    confinement: Literal["auto", "landlock", "off"] = Field(
        default="auto", description="How pods are confined: Landlock where the kernel has it, or not at all."
    )
    pod_variables: list[str] = Field(
        default_factory=list, description="More of the server's environment variables that reach pods."
    )
    log_bytes_per_pod: int = Field(
        default=1 << 30,
        ge=1,
        description="Bytes an attempt of a pod may print (stdout and stderr, its log); past it the pod is killed, "
        "its log cut back to this, and its task fails with a message.",
    )
    pod_nice: int = Field(
        default=10,
        ge=0,
        le=19,
        description="The niceness pods run at above the server's, so the server, its clients and this machine's "
        "other programs keep the cores they need while runs compute on them; 0: the server's own.",
    )
    pod_network: bool = Field(
        default=True,
        description="Whether pods (and the describer) reach the network: this machine's other services, the "
        "server's own API, other machines. false: each in a network namespace of its own with only its loopback "
        "(needs confined pods).",
    )

    @field_validator("nodes")
    @classmethod
    def _unique_names(cls, nodes: list[NodeConfig] | None) -> list[NodeConfig] | None:
        names = [n.name for n in nodes or []]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"node names must be unique: {', '.join(duplicates)}")
        return nodes


class ContainersConfig(BaseModel):
    """The containers executor: every pod as a container of its run's image (podman), on this machine's nodes and
    with the local executor's scheduler (`executor.local`: nodes, poll, log bound, niceness; its memory cgroups)."""

    model_config = ConfigDict(extra="forbid")
    podman: list[str] = Field(
        default_factory=lambda: ["podman", "--runtime", "runc", "--cgroup-manager", "cgroupfs"],
        min_length=1,
        description="The podman command and its global options (crun refuses hybrid cgroups: runc).",
    )
    default_image: str = Field(
        default="",
        description="The image (by digest) of a model without pyproject.toml; models with one get their lock's image "
        "(environments.kind: image).",
    )
    network: bool = Field(
        default=False, description="Whether pods reach the network (podman's default network); false: none at all."
    )
    python: str = Field(
        default="python", description="The interpreter of the image that runs the runtime (on its PATH)."
    )
    tls_verify: bool = Field(
        default=True, description="Whether a pull of a missing image checks the registry's TLS; false: plain HTTP."
    )
    run_as_user: int = Field(default=1000, ge=1, description="The uid (and gid) pods run as; never root.")
    ulimit_nofile: int = Field(default=4096, ge=64, description="Open files a pod may hold (within the hard limit).")
    ulimit_nproc: int = Field(default=4096, ge=16, description="Processes a pod's user may run (runc needs a value).")


class ExecutorConfig(BaseModel):
    """Which executor adapter runs the pods, and its settings."""

    model_config = ConfigDict(extra="forbid")
    kind: Literal["local", "containers", "kubernetes"] = Field(
        default="local",
        description="local: process groups on this machine; containers: the run's image with podman on this "
        "machine; kubernetes: k3s.",
    )
    local: LocalExecutorConfig = Field(default_factory=LocalExecutorConfig)
    containers: ContainersConfig = Field(default_factory=ContainersConfig)
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
    output_check_s: float = Field(
        default=10.0,
        gt=0,
        description="Seconds between two measurements of a running task's folder against "
        "limits.output_bytes_per_task (at least 20 times what the last one took); a task past it fails, its pods "
        "stopped. A task that writes fast may pass the bound by what it writes in that time.",
    )
    safety_visits_per_tick: int = Field(
        default=200,
        gt=0,
        description="The most runs the safety net visits in one tick; with more active runs it goes round them over "
        "several ticks, so an idle server's cost does not grow with its queue.",
    )


DEFAULT_WEB_ADDRESS = "127.0.0.1:50552"


class WebServing(BaseModel):
    """The web view (`simrun_web`) that `simrun server` serves beside the gateway: a client of it, like the CLI."""

    model_config = ConfigDict(extra="forbid")
    enabled: bool = Field(default=True, description="Serve the web view (`simrun server --no-web`: off).")
    address: str = Field(
        default=DEFAULT_WEB_ADDRESS,
        description="Where it listens; beyond loopback only with `tls` (its pages carry the session's cookie) or "
        "`insecure`.",
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
    environments: EnvironmentsConfig = Field(default_factory=EnvironmentsConfig)
    service_token: str = Field(default="", description="Token a service sends another (tracker to learner).")
    grace_s: float = Field(default=10.0, gt=0, description="Seconds a stopped pod has before SIGKILL.")
    merge_wait_s: float = Field(default=120.0, ge=0, description="Seconds to await the merge marker.")
    max_concurrent_calls: int = Field(
        default=1000, ge=8, description="Calls served at once (streams included); more are RESOURCE_EXHAUSTED."
    )
    tls: TlsConfig | None = Field(default=None, description="TLS of the servers; None: plaintext (loopback only).")
    web: WebServing = Field(default_factory=WebServing)
    insecure: bool = Field(
        default=False, description="Serve plaintext on an address beyond loopback (tokens travel in the clear)."
    )
    limits: Limits = Field(default_factory=Limits)
    read_policy: ReadPolicy = Field(default_factory=ReadPolicy)
    share_group: str = Field(
        default="", description="A group that may read the home and the store (0750); empty: the server's user only."
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


def private_dir(path: Path, group: str = "") -> Path:
    """Makes `path` (and missing parents) and narrows it to 0700, or 0750 with `group` as its group.

    The home and the store hold every token's hash, the owner's token, every run and every snapshot: no other
    local account may list or read them. An existing folder is narrowed too (older servers made them 0755).
    """
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    if group:
        try:
            gid = grp.getgrnam(group).gr_gid
        except KeyError:
            raise InvalidArgument(f"share_group: no group {group!r} on this machine") from None
        os.chown(path, -1, gid)
        path.chmod(0o750)
    else:
        path.chmod(0o700)
    return path


def ensure_local_tokens(home: Path, group: str = "") -> tuple[Path, str]:
    """The home's tokens file and the owner's token, made on first start so one person can begin at once.

    The file names this machine's user the cluster's owner and holds the token's hash; the token itself is
    written to `<home>/token` (0600 from its creation), where the CLI looks when neither --token nor
    SIMRUN_TOKEN is given.
    """
    private_dir(home, group)
    tokens_file = home / "tokens.yaml"
    token_file = home / "token"
    if not tokens_file.exists():
        owner = os.environ.get("USER") or "owner"
        token = new_token()
        write_private(token_file, token + "\n")
        write_private(tokens_file, yaml.safe_dump({"owner": owner, "tokens": {token_hash(token): {"name": owner}}}))
    return tokens_file, token_file.read_text().strip() if token_file.exists() else ""


def is_loopback(address: str) -> bool:
    """Whether a `host:port` address is reachable from this machine only."""
    host = address.rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
