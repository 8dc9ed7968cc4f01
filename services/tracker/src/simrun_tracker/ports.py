"""The tracker's other ports: where it resolves resources, records observations and finds a run's interpreter."""

from __future__ import annotations

import sys
from typing import Protocol

from simrun_core.resources import ResolvedResources
from simrun_learner.rules import ObservationKey
from simrun_runtime.record import RunRecord


class LearnerPort(Protocol):
    """The resource learner as the tracker uses it (in process, or a gRPC client of the learner service)."""

    def resolve(self, key: ObservationKey, hint: ResolvedResources) -> ResolvedResources:
        """The resources of a key (task type, model, cost value) from its observations, else the hint."""
        ...

    def record_reports(self, record: RunRecord, task_id: str, succeeded: bool) -> int:
        """Turns a finished task's worker reports into observations; returns how many were recorded."""
        ...

    def estimate(self, key: ObservationKey, units: int, pods: int, processes: int) -> float | None:
        """Seconds of a split task from its units' learned seconds; None when nothing is learned."""
        ...

    def close(self) -> None:
        """Releases what the port holds (a channel); the learner itself belongs to whoever made it."""
        ...


class EnvironmentPort(Protocol):
    """Finds the interpreter a run's pods and type descriptions use: the seam of the environment builder."""

    def interpreter(self, record: RunRecord) -> str: ...


class ServerInterpreter:
    """Until the environment builder exists, every run uses the server's own interpreter."""

    def interpreter(self, record: RunRecord) -> str:
        return sys.executable
