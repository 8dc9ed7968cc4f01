"""The tracker's other ports: where it resolves resources, records observations and finds a run's environment."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from simrun_core.errors import FailedPrecondition
from simrun_core.resources import ObservationKey, ResolvedResources
from simrun_runtime.record import RunRecord, SnapshotRef


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


class EnvironmentState(StrEnum):
    """The lifecycle of an environment, as `envbuilder.proto` has it."""

    BUILDING = "building"
    READY = "ready"
    FAILED = "failed"


@dataclass(frozen=True)
class Environment:
    """An environment of a run's snapshots as the builder reports it; no host path crosses this port."""

    environment_id: str
    state: EnvironmentState
    message: str = ""
    """While building, what it is doing; once failed, the builder's reason and its log's tail."""
    python_version: str = ""
    image: str = ""
    """The image by digest where pods run images (a cluster); empty on this machine."""
    lock_hash: str = ""
    note: str = ""
    """What its lock decided that the submitter should know (a stale uv.lock locked again); empty mostly."""


DEFAULT_ENVIRONMENT = "default"
"""The environment of a model without `pyproject.toml`: the server's interpreter here, the default image there."""


class EnvironmentPort(Protocol):
    """The environment builder as the tracker uses it: asynchronous, since a lock or an image takes minutes.

    `resolve` answers at once: an environment READY, BUILDING (a build started or under way) or FAILED. The
    tracker asks again with `get` on its next step; a run stays SUBMITTING while its environment builds.
    """

    def resolve(self, snapshots: list[SnapshotRef]) -> Environment:
        """The environment of a run's snapshots (the first is the model), starting its build where needed.

        Raises:
            InvalidArgument: a model whose dependencies cannot be locked (with the resolver's reason).
            NotFound: a snapshot not in the store.
        """
        ...

    def get(self, environment_id: str) -> Environment:
        """An environment's state now; `NotFound` for an unknown id."""
        ...

    def write_run_lock(self, run_id: str, environment_id: str) -> None:
        """Writes `runs/<id>/environment.lock`, the run's copy of its READY environment's lock, once."""
        ...

    def close(self) -> None:
        """Releases what the port holds."""
        ...


class LocalInterpreters(Protocol):
    """Where a READY environment's interpreter is on this machine: what describers and local pods run.

    This is the local side of environments, given to the describer and the local executor by the wiring; it
    never crosses the executor or environment port.
    """

    def interpreter(
        self, environment_id: str, run_id: str | None = None, snapshots: list[SnapshotRef] | None = None
    ) -> str:
        """The interpreter of an environment, for a run's pods (its overlay of the run's snapshots) or, without a
        run, for describing types (the overlay of `snapshots`, so the model's libraries import). Raises
        `FailedPrecondition` when the environment is not ready here."""
        ...


class ServerEnvironments:
    """Every run's environment is the server's own interpreter (`environments.kind: server`)."""

    def resolve(self, snapshots: list[SnapshotRef]) -> Environment:
        return Environment(DEFAULT_ENVIRONMENT, EnvironmentState.READY, python_version=_python_version())

    def get(self, environment_id: str) -> Environment:
        if environment_id != DEFAULT_ENVIRONMENT:
            raise FailedPrecondition(f"environment {environment_id!r} is unknown to this server's default builder")
        return self.resolve([])

    def write_run_lock(self, run_id: str, environment_id: str) -> None:
        return None

    def interpreter(
        self, environment_id: str, run_id: str | None = None, snapshots: list[SnapshotRef] | None = None
    ) -> str:
        if environment_id != DEFAULT_ENVIRONMENT:
            raise FailedPrecondition(f"environment {environment_id!r} is not on this machine")
        return sys.executable

    def close(self) -> None:
        return None


def _python_version() -> str:
    return f"{sys.version_info.major}.{sys.version_info.minor}"
