"""The learner's rules: a key's observations and a type's hint in, a resolved request or an estimate out; pure."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime

from simrun_core.errors import FailedPrecondition, InvalidArgument
from simrun_core.resources import ObservationKey, ResolutionRule, ResolvedResources

WINDOW = 20
"""A request is resolved from the last this many observations of its key."""

PERCENTILE = 95
"""The percentile of the measured memory per process taken."""

MARGIN = 1.1
"""The percentile is requested times this margin."""

OOM_FACTOR = 1.5
"""After a kill for memory, a request is at least this many times the memory per process the pod had."""


@dataclass(frozen=True)
class Observation:
    """What one pod of a finished task showed.

    Attributes:
        key: Its key.
        per_worker_gb: The peak anonymous memory of the pod over its processes, GiB; None when not measured
            (a pod killed before it wrote a report).
        oom_killed: Whether the pod was killed for memory.
        oom_per_worker_gb: The memory per process the pod had (its limit over its processes) when killed, GiB.
        succeeded: Whether the task succeeded.
        unit_seconds: Seconds of each unit the pod completed.
        run_id: The run it came from.
        source: What it was observed from (`run/task/worker-start ms`, the pod incarnation of a worker report);
            the learner records an observation of a source once, so a step taken again records nothing twice.
        observed_at: When it was observed; the learner fills it in when recording.
        observation_id: Its id; the learner fills it in when recording.
    """

    key: ObservationKey
    per_worker_gb: float | None
    oom_killed: bool = False
    oom_per_worker_gb: float | None = None
    succeeded: bool = False
    unit_seconds: tuple[float, ...] = ()
    run_id: str = ""
    source: str = ""
    observed_at: datetime | None = None
    observation_id: str | None = None

    def check(self) -> None:
        """Refuses an incomplete key, negative figures, or a kill without the memory it had (`InvalidArgument`)."""
        self.key.check()
        if self.per_worker_gb is not None and not self.per_worker_gb >= 0:
            raise InvalidArgument(f"per_worker_gb must not be negative, got {self.per_worker_gb}")
        if self.oom_killed and not (self.oom_per_worker_gb is not None and self.oom_per_worker_gb > 0):
            raise InvalidArgument("a pod killed for memory needs the memory per process it had (oom_per_worker_gb)")
        if any(not s >= 0 for s in self.unit_seconds):
            raise InvalidArgument("unit seconds must not be negative")


@dataclass(frozen=True)
class Estimate:
    """The estimated seconds of a split task.

    Attributes:
        unit_seconds: Median seconds of a unit.
        rounds: Rounds of its units over the processes of its pods.
        seconds: unit_seconds times rounds.
    """

    unit_seconds: float
    rounds: int
    seconds: float


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile with linear interpolation between ranks (numpy's default method)."""
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    rank = q / 100 * (len(ordered) - 1)
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def resolve(observations: Sequence[Observation], hint: ResolvedResources) -> ResolvedResources:
    """Resolves a key's request from its observations (oldest first) and its type's hint.

    The memory per process is the 95th percentile of the measured memory per process of the last 20
    observations times 1.1; at least 1.5 times the memory per process of a pod killed for memory, until a
    later run of the key succeeded; without observations, the hint. The learned seconds of a unit are the
    median over the same 20 observations. Base memory, cores, GPUs and scratch are the hint's. The answer's
    `rule` and `reason` say which rule decided the memory.
    """
    window = observations[-WINDOW:]
    learned_seconds = median_unit_seconds(window)
    measured = [o.per_worker_gb for o in window if o.per_worker_gb is not None]
    floor = oom_floor(observations)
    learned = replace(hint, unit_seconds=learned_seconds if learned_seconds is not None else hint.unit_seconds)
    if not measured and floor is None:
        why = "no observations of the key" if not observations else "no measured memory in its observations"
        return replace(learned, rule=ResolutionRule.HINT, reason=f"{why}: the type's resource hint")
    by_percentile = None
    if measured:
        by_percentile = _whole_mib(percentile(measured, PERCENTILE) * MARGIN)
        percentile_reason = (
            f"{PERCENTILE}th percentile of the memory per process of the last {len(measured)} measured pods "
            f"({percentile(measured, PERCENTILE):.3f} GiB) times {MARGIN}"
        )
    if floor is not None and (by_percentile is None or floor[0] > by_percentile):
        per_worker_gb, killed = floor
        return replace(
            learned,
            per_worker_gb=per_worker_gb,
            rule=ResolutionRule.OOM_FLOOR,
            reason=(
                f"{OOM_FACTOR} times the {killed.oom_per_worker_gb:g} GiB per process of a pod of run "
                f"{killed.run_id or '?'} killed for memory, with no later successful run"
            ),
        )
    assert by_percentile is not None  # measured is non-empty whenever the floor does not decide
    return replace(learned, per_worker_gb=by_percentile, rule=ResolutionRule.PERCENTILE, reason=percentile_reason)


def oom_floor(observations: Sequence[Observation]) -> tuple[float, Observation] | None:
    """1.5 times the largest memory per process of the pods killed for memory with no later successful run.

    A kill is lifted by a succeeded observation after it from another run (or of unknown run): the run which was
    killed may itself succeed on its retry, which shows the retry's memory, not that the request is enough.
    Returns the floor in GiB and the kill deciding it, or None.
    """
    floor: tuple[float, Observation] | None = None
    later_runs: set[str] = set()  # run ids of the successes after the observation at hand: two are enough to say
    for killed in reversed(observations):  # one pass, newest first
        if killed.oom_killed and killed.oom_per_worker_gb is not None:
            lifted = bool(later_runs) and (not killed.run_id or len(later_runs) > 1 or killed.run_id not in later_runs)
            value = _whole_mib(OOM_FACTOR * killed.oom_per_worker_gb)
            if not lifted and (floor is None or value >= floor[0]):
                floor = (value, killed)  # >=: of equal floors the oldest kill decides, as in the order of the text
        if killed.succeeded and len(later_runs) < 2:
            later_runs.add(killed.run_id)
    return floor


def median_unit_seconds(observations: Sequence[Observation]) -> float | None:
    """The median seconds of a unit over the observations, None when none completed a unit."""
    seconds = [s for o in observations for s in o.unit_seconds]
    return statistics.median(seconds) if seconds else None


def estimate(observations: Sequence[Observation], units: int, pods: int, processes: int) -> Estimate:
    """The median seconds of a unit (last 20 observations) times the rounds of the units over the processes.

    Raises:
        InvalidArgument: negative units, or fewer than one pod or process.
        FailedPrecondition: no unit seconds are learned for the key.
    """
    if units < 0 or pods < 1 or processes < 1:
        raise InvalidArgument(f"need units >= 0, pods >= 1 and processes >= 1, got {units}, {pods}, {processes}")
    unit_seconds = median_unit_seconds(observations[-WINDOW:])
    if unit_seconds is None:
        raise FailedPrecondition("no unit seconds are learned for this key yet: run the task once")
    rounds = math.ceil(units / (pods * processes))
    return Estimate(unit_seconds=unit_seconds, rounds=rounds, seconds=unit_seconds * rounds)


def _whole_mib(gb: float) -> float:
    """Rounds GiB up to a whole MiB, so requests read cleanly and never fall below the rule."""
    return math.ceil(gb * 1024 - 1e-6) / 1024
