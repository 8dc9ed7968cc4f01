"""Conversions between the messages several services share (simrun.v1 common) and core's domain types."""

from __future__ import annotations

from simrun.v1 import common_pb2
from simrun_runtime.record import Provenance

from simrun_core.errors import InvalidArgument
from simrun_core.identity import Identity, Priority
from simrun_core.resources import ResolutionRule, ResolvedResources, SplitMode

PRIORITY_TO_PROTO = {
    Priority.OWNER: common_pb2.PRIORITY_OWNER,
    Priority.STANDARD: common_pb2.PRIORITY_STANDARD,
    Priority.AGENT: common_pb2.PRIORITY_AGENT,
}
_PRIORITY_FROM_PROTO: dict[int, Priority] = {value: priority for priority, value in PRIORITY_TO_PROTO.items()}
_MODE_FROM_PROTO: dict[int, SplitMode] = {
    common_pb2.SPLIT_MODE_FASTEST: SplitMode.FASTEST,
    common_pb2.SPLIT_MODE_SINGLE_SERVER: SplitMode.SINGLE_SERVER,
}
_RULE_TO_PROTO = {
    ResolutionRule.HINT: common_pb2.RESOLUTION_RULE_HINT,
    ResolutionRule.PERCENTILE: common_pb2.RESOLUTION_RULE_PERCENTILE,
    ResolutionRule.OOM_FLOOR: common_pb2.RESOLUTION_RULE_OOM_FLOOR,
}
_RULE_FROM_PROTO = {value: rule for rule, value in _RULE_TO_PROTO.items()}


def priority_from_proto(value: int) -> Priority:
    """A run's priority; an unset one is refused (the gateway fills it in from the identity)."""
    try:
        return _PRIORITY_FROM_PROTO[value]
    except KeyError:
        raise InvalidArgument(f"priority must be owner, standard or agent, got {value}") from None


def mode_from_proto(value: int) -> SplitMode | None:
    """A split mode; None for an unset one, which leaves the choice to the workflow or the default."""
    if value == common_pb2.SPLIT_MODE_UNSPECIFIED:
        return None
    try:
        return _MODE_FROM_PROTO[value]
    except KeyError:
        raise InvalidArgument(f"unknown split mode {value}") from None


def resources_from_proto(message: common_pb2.ResolvedResources) -> ResolvedResources:
    """The domain resources of a message; unset cores per process are 1, an unset rule is the hint's."""
    return ResolvedResources(
        base_memory_gb=message.base_memory_gb,
        per_worker_gb=message.per_worker_gb,
        cores_per_process=message.cores_per_process or 1,
        gpus=message.gpus,
        scratch_gb=message.scratch_gb,
        unit_seconds=message.unit_seconds if message.HasField("unit_seconds") else None,
        rule=_RULE_FROM_PROTO.get(message.rule, ResolutionRule.HINT),
        reason=message.reason,
    )


def resources_to_proto(resources: ResolvedResources) -> common_pb2.ResolvedResources:
    """The message of resolved resources; unit seconds stay absent until learned."""
    message = common_pb2.ResolvedResources(
        base_memory_gb=resources.base_memory_gb,
        per_worker_gb=resources.per_worker_gb,
        cores_per_process=resources.cores_per_process,
        gpus=resources.gpus,
        scratch_gb=resources.scratch_gb,
        rule=_RULE_TO_PROTO[ResolutionRule(resources.rule)],
        reason=resources.reason,
    )
    if resources.unit_seconds is not None:
        message.unit_seconds = resources.unit_seconds
    return message


def identity_to_proto(identity: Identity) -> common_pb2.Identity:
    """The message of an identity."""
    return common_pb2.Identity(
        name=identity.name,
        kind=identity.kind.value,
        on_behalf_of=identity.on_behalf_of or "",
        priority=PRIORITY_TO_PROTO[identity.priority],
    )


def provenance_from_proto(message: common_pb2.Provenance) -> Provenance:
    """The provenance of a snapshot's sources from its message; empty strings are unknown."""
    return Provenance(
        branch=message.branch or None,
        commit=message.commit or None,
        changed_files=list(message.changed_files),
        dirty=message.dirty,
    )


def provenance_to_proto(provenance: Provenance) -> common_pb2.Provenance:
    """The message of a snapshot's provenance."""
    return common_pb2.Provenance(
        branch=provenance.branch or "",
        commit=provenance.commit or "",
        changed_files=provenance.changed_files,
        dirty=provenance.dirty,
    )
