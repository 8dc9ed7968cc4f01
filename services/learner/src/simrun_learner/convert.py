"""Conversions between the learner's protobuf messages and its domain objects."""

from __future__ import annotations

from google.protobuf.timestamp_pb2 import Timestamp
from simrun.v1 import common_pb2, learner_pb2
from simrun_core.messages import resources_from_proto, resources_to_proto

from simrun_learner.rules import Estimate, Observation, ObservationKey


def key_from_proto(message: common_pb2.ObservationKey) -> ObservationKey:
    """The key of a message."""
    return ObservationKey(message.task_type, message.model, message.cost_value)


def key_to_proto(key: ObservationKey) -> common_pb2.ObservationKey:
    """The message of a key."""
    return common_pb2.ObservationKey(task_type=key.task_type, model=key.model, cost_value=key.cost_value)


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
        source=message.source,
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
        source=observation.source,
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


__all__ = [
    "estimate_to_proto",
    "key_from_proto",
    "key_to_proto",
    "observation_from_proto",
    "observation_to_proto",
    "resources_from_proto",
    "resources_to_proto",
]
