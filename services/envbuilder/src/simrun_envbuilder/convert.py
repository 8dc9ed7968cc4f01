"""Converts between the environment builder's messages and its domain values."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from pathlib import Path

from google.protobuf.timestamp_pb2 import Timestamp
from simrun.v1 import common_pb2
from simrun_core.config import ServerConfig
from simrun_core.errors import InvalidArgument
from simrun_core.messages import provenance_from_proto
from simrun_runtime.layout import StoreLayout
from simrun_runtime.record import SnapshotRef

from simrun_envbuilder.builder import BuilderSettings, Environment, EnvironmentState
from simrun_envbuilder.image import ImageSettings
from simrun_envbuilder.lock import UvSettings, default_uv_command
from simrun_envbuilder.model_names import check_snapshot_name

_STATES = {
    EnvironmentState.BUILDING: common_pb2.ENVIRONMENT_STATE_BUILDING,
    EnvironmentState.READY: common_pb2.ENVIRONMENT_STATE_READY,
    EnvironmentState.FAILED: common_pb2.ENVIRONMENT_STATE_FAILED,
}
STATE_FROM_PROTO = {v: k for k, v in _STATES.items()}


def snapshots_from_proto(store: StoreLayout, messages: Iterable[common_pb2.Snapshot]) -> list[SnapshotRef]:
    """The snapshots of a request, each at its place in the store (a client's `path` is never trusted)."""
    refs = []
    for message in messages:
        check_snapshot_name(message.name, message.snapshot_id)
        path = store.snapshot(message.name, message.snapshot_id).relative_to(store.root).as_posix()
        refs.append(
            SnapshotRef(
                name=message.name,
                snapshot_id=message.snapshot_id,
                path=path,
                provenance=provenance_from_proto(message.provenance),
            )
        )
    if not refs:
        raise InvalidArgument("an environment needs the snapshot of its model: snapshot the working tree first")
    return refs


def environment_to_proto(environment: Environment) -> common_pb2.Environment:
    message = common_pb2.Environment(
        environment_id=environment.environment_id,
        lock_sha256=environment.lock_sha256,
        python_version=environment.python_version,
        image=environment.image,
        interpreter=environment.interpreter,
        state=_STATES[environment.state],
        message=environment.message,
        inputs_digest=environment.inputs_digest,
        package_count=len(environment.packages),
        packages=sorted(environment.packages),
        size_bytes=environment.size_bytes,
        system_packages=environment.system_packages,
        note=environment.note,
    )
    if environment.create_time is not None:
        message.create_time.CopyFrom(_timestamp(environment.create_time))
    if environment.last_use_time is not None:
        message.last_use_time.CopyFrom(_timestamp(environment.last_use_time))
    return message


def _password(path: Path | None) -> str:
    """The registry password from its file (its first line), or "" without one; `InvalidArgument` if unreadable."""
    if path is None:
        return ""
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise InvalidArgument(f"environments.images.password_file: cannot read {path}: {exc.strerror}") from None
    return lines[0].strip() if lines else ""


def settings_from_config(config: ServerConfig) -> BuilderSettings:
    """The builder's settings from a server's configuration (`environments:`)."""
    envs = config.environments
    uv = UvSettings(
        default_uv_command(),
        cache_dir=envs.uv_cache_dir,
        index_url=envs.index_url,
        find_links=tuple(envs.find_links),
        local_git_roots=tuple(envs.local_git_roots),
        no_index=envs.no_index,
        confine=config.executor.local.confinement != "off",
    )
    images = None
    if envs.kind == "image":
        if envs.images is None:
            raise InvalidArgument("environments.kind image needs environments.images (registry, base_images)")
        images = ImageSettings(
            registry=envs.images.registry,
            repository=envs.images.repository,
            base_images=dict(envs.images.base_images),
            insecure=envs.images.insecure,
            buildkit_addr=envs.images.buildkit_addr,
            builder=envs.images.builder,
            ca_bundle=envs.images.ca_bundle,
            index_url=envs.index_url,
            username=envs.images.username,
            password=_password(envs.images.password_file),
        )
    return BuilderSettings(
        root=Path(envs.root or config.home / "environments"),
        store=config.store,
        uv=uv,
        constraints=envs.constraints,
        interpreters=tuple(envs.interpreters),
        max_age_s=envs.max_age_days * 86400.0,
        max_total_bytes=int(envs.max_total_gb * 2**30),
        compile_bytecode=envs.compile_bytecode,
        images=images,
    )


def _timestamp(value: datetime) -> Timestamp:
    stamp = Timestamp()
    stamp.FromDatetime(value)
    return stamp
