"""The resources a task is planned with, resolved by the learner and read by the planner, and the split modes."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from simrun_core.errors import InvalidArgument


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


@dataclass(frozen=True)
class ObservationKey:
    """What observations are learned for: the task type, the model and the value of the type's cost_setting.

    Attributes:
        task_type: The task type's name.
        model: The model: the name of the run's first snapshot.
        cost_value: The value of the type's cost_setting as a string (JSON but for a string); empty if none.
    """

    task_type: str
    model: str
    cost_value: str = ""

    def check(self) -> None:
        """Refuses a key without its task type or model (`InvalidArgument`)."""
        if not self.task_type or not self.model:
            raise InvalidArgument(f"an observation key needs a task type and a model, got {self}")
