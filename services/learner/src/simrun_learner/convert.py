"""Conversions between the learner's protobuf messages and its domain objects."""

from __future__ import annotations

from google.protobuf.timestamp_pb2 import Timestamp
from simrun.v1 import common_pb2, learner_pb2
from simrun_core.resources import ResolutionRule, ResolvedResources

from simrun_learner.rules import Estimate, Observation, ObservationKey

_RULES_FROM_PROTO = {
    common_pb2.RESOLUTION_RULE_UNSPECIFIED: ResolutionRule.HINT,
    common_pb2.RESOLUTION_RULE_HINT: ResolutionRule.HINT,
    common_pb2.RESOLUTION_RULE_PERCENTILE: ResolutionRule.PERCENTILE,
    common_pb2.RESOLUTION_RULE_OOM_FLOOR: ResolutionRule.OOM_FLOOR,
}
_RULES_TO_PROTO = {
    ResolutionRule.HINT: common_pb2.RESOLUTION_RULE_HINT,
    ResolutionRule.PERCENTILE: common_pb2.RESOLUTION_RULE_PERCENTILE,
    ResolutionRule.OOM_FLOOR: common_pb2.RESOLUTION_RULE_OOM_FLOOR,
}


def key_from_proto(message: common_pb2.ObservationKey) -> ObservationKey:
    """The key of a message."""
    return ObservationKey(message.task_type, message.model, message.cost_value)


def key_to_proto(key: ObservationKey) -> common_pb2.ObservationKey:
    """The message of a key."""
    return common_pb2.ObservationKey(task_type=key.task_type, model=key.model, cost_value=key.cost_value)


def resources_from_proto(message: common_pb2.ResolvedResources) -> ResolvedResources:
    """The domain resources of a message (a hint); an unset rule is the hint's."""
    return ResolvedResources(
        base_memory_gb=message.base_memory_gb,
        per_worker_gb=message.per_worker_gb,
        cores_per_process=message.cores_per_process or 1,
        gpus=message.gpus,
        scratch_gb=message.scratch_gb,
        unit_seconds=message.unit_seconds if message.HasField("unit_seconds") else None,
        rule=_RULES_FROM_PROTO.get(message.rule, ResolutionRule.HINT),
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
        rule=_RULES_TO_PROTO[ResolutionRule(resources.rule)],
        reason=resources.reason,
    )
    if resources.unit_seconds is not None:
        message.unit_seconds = resources.unit_seconds
    return message


def observation_from_proto(message: common_pb2.Observation) -> Observation:
    """An observation to record; a zero memory stands for not measured, id and time are the learner's."""
    return Observation(
        key=key_from_proto(message.key),
        per_worker_gb=message.per_worker_gb or None,
        oom_killed=message.oom_killed,
        oom_per_worker_gb=message.oom_per_worker_gb or None,
        succeeded=message.succeeded,
        unit_seconds=tuple(message.unit_seconds),
        run_id=message.run_id,
    )


def observation_to_proto(observation: Observation) -> common_pb2.Observation:
    """The message of a recorded observation."""
    message = common_pb2.Observation(
        observation_id=observation.observation_id or "",
        key=key_to_proto(observation.key),
        per_worker_gb=observation.per_worker_gb or 0.0,
        oom_killed=observation.oom_killed,
        oom_per_worker_gb=observation.oom_per_worker_gb or 0.0,
        succeeded=observation.succeeded,
        unit_seconds=list(observation.unit_seconds),
        run_id=observation.run_id,
    )
    if observation.observed_at is not None:
        stamp = Timestamp()
        stamp.FromDatetime(observation.observed_at)
        message.observe_time.CopyFrom(stamp)
    return message


def estimate_to_proto(estimate: Estimate) -> learner_pb2.EstimateTaskResponse:
    """The response of an estimate."""
    return learner_pb2.EstimateTaskResponse(
        unit_seconds=estimate.unit_seconds, rounds=estimate.rounds, seconds=estimate.seconds
    )
