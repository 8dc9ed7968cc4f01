"""The resources a task is planned with, resolved by the learner and read by the planner, and the split modes."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class SplitMode(StrEnum):
    """How a split task is divided into pods."""

    FASTEST = "fastest"
    SINGLE_SERVER = "single-server"


class ResolutionRule(StrEnum):
    """The rule of the learner that decided a request's memory."""

    HINT = "hint"
    PERCENTILE = "percentile"
    OOM_FLOOR = "oom-floor"


@dataclass(frozen=True)
class ResolvedResources:
    """The resources of a task: memory in GiB, cores and GPUs, and the learned seconds of a unit."""

    base_memory_gb: float
    per_worker_gb: float
    cores_per_process: int = 1
    gpus: int = 0
    scratch_gb: float = 0
    unit_seconds: float | None = None
    rule: ResolutionRule = ResolutionRule.HINT
    reason: str = ""
