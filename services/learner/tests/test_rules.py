"""The learner's rules at their edges: the window of 20, the percentile, kills for memory and later successes."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from simrun_core.errors import FailedPrecondition, InvalidArgument
from simrun_core.resources import ResolutionRule, ResolvedResources
from simrun_learner import Observation, ObservationKey, estimate, oom_floor, percentile, resolve

KEY = ObservationKey("model.tasks:Fit", "pkmodel", '"large"')
HINT = ResolvedResources(base_memory_gb=1, per_worker_gb=4, cores_per_process=2, scratch_gb=5)


def seen(per_worker_gb: float | None, run: str = "", **kw: object) -> Observation:
    return Observation(KEY, per_worker_gb, run_id=run, succeeded=kw.pop("succeeded", True), **kw)  # type: ignore[arg-type]


def killed(per_worker_gb: float | None, limit: float, run: str, succeeded: bool = False) -> Observation:
    return Observation(KEY, per_worker_gb, oom_killed=True, oom_per_worker_gb=limit, succeeded=succeeded, run_id=run)


def p95_times_margin(values: list[float]) -> float:
    return float(np.percentile(values, 95)) * 1.1


def test_no_observations_take_the_hint() -> None:
    resolved = resolve([], HINT)
    assert (resolved.per_worker_gb, resolved.base_memory_gb, resolved.unit_seconds) == (4, 1, None)
    assert resolved.rule is ResolutionRule.HINT
    assert "no observations" in resolved.reason


def test_observations_without_a_measurement_take_the_hint() -> None:
    resolved = resolve([seen(None, "r1", unit_seconds=(2.0,))], HINT)
    assert (resolved.rule, resolved.per_worker_gb, resolved.unit_seconds) == (ResolutionRule.HINT, 4, 2.0)
    assert "no measured memory" in resolved.reason


@pytest.mark.parametrize("count", [1, 2, 7, 19, 20])
def test_up_to_20_observations_all_count(count: int) -> None:
    values = [1.0 + 0.1 * i for i in range(count)]
    resolved = resolve([seen(v, f"r{i}") for i, v in enumerate(values)], HINT)
    assert resolved.rule is ResolutionRule.PERCENTILE
    assert resolved.per_worker_gb == pytest.approx(p95_times_margin(values), abs=1 / 1024)
    assert resolved.per_worker_gb >= p95_times_margin(values)  # rounded up to a whole MiB, never down
    assert (resolved.base_memory_gb, resolved.cores_per_process, resolved.scratch_gb) == (1, 2, 5)


@pytest.mark.parametrize("count", [21, 40])
def test_more_than_20_observations_only_the_last_20_count(count: int) -> None:
    values = [50.0] * (count - 20) + [1.0 + 0.1 * i for i in range(20)]
    resolved = resolve([seen(v, f"r{i}") for i, v in enumerate(values)], HINT)
    assert resolved.per_worker_gb == pytest.approx(p95_times_margin(values[-20:]), abs=1 / 1024)
    assert resolved.per_worker_gb < 5
    assert "last 20 measured" in resolved.reason


def test_a_kill_with_no_success_after_it_floors_the_request() -> None:
    observations = [seen(1.0, "r1"), seen(1.1, "r2"), killed(1.9, 2.0, "r3")]
    resolved = resolve(observations, HINT)
    assert resolved.rule is ResolutionRule.OOM_FLOOR
    assert resolved.per_worker_gb == 3.0
    assert "run r3 killed for memory" in resolved.reason


def test_a_kill_then_a_later_successful_run_lifts_the_floor() -> None:
    observations = [seen(1.0, "r1"), killed(1.9, 2.0, "r2"), seen(2.4, "r3")]
    resolved = resolve(observations, HINT)
    assert resolved.rule is ResolutionRule.PERCENTILE
    assert resolved.per_worker_gb == pytest.approx(p95_times_margin([1.0, 1.9, 2.4]), abs=1 / 1024)


def test_a_later_failed_run_does_not_lift_the_floor() -> None:
    observations = [killed(1.9, 2.0, "r1"), seen(1.0, "r2", succeeded=False)]
    assert resolve(observations, HINT).per_worker_gb == 3.0


def test_the_killed_run_succeeding_on_its_retry_does_not_lift_the_floor() -> None:
    # The retry of r1 had 1.5 times the memory and succeeded: that shows the retry's memory was enough.
    observations = [killed(1.9, 2.0, "r1", succeeded=True), seen(2.5, "r1", succeeded=True)]
    resolved = resolve(observations, HINT)
    assert (resolved.rule, resolved.per_worker_gb) == (ResolutionRule.OOM_FLOOR, 3.0)
    assert resolve([*observations, seen(2.5, "r2")], HINT).rule is ResolutionRule.PERCENTILE


def test_a_success_before_the_kill_does_not_lift_it() -> None:
    observations = [seen(1.0, "r1"), seen(1.0, "r2"), killed(1.2, 1.25, "r3")]
    assert resolve(observations, HINT).per_worker_gb == pytest.approx(1.875)


def test_the_largest_unlifted_kill_decides() -> None:
    observations = [killed(None, 4.0, "r1"), seen(1.0, "r2"), killed(None, 1.0, "r3"), killed(None, 2.0, "r4")]
    resolved = resolve(observations, HINT)
    assert (resolved.rule, resolved.per_worker_gb) == (ResolutionRule.OOM_FLOOR, 3.0)


def test_a_kill_older_than_the_window_still_floors_until_a_success() -> None:
    observations = [killed(None, 10.0, "r0")] + [seen(1.0, f"r{i}", succeeded=False) for i in range(1, 30)]
    assert resolve(observations, HINT).per_worker_gb == 15.0


def test_the_percentile_wins_over_a_lower_floor() -> None:
    observations = [seen(3.0, "r1", succeeded=False), killed(0.9, 1.0, "r2")]
    resolved = resolve(observations, HINT)
    assert resolved.rule is ResolutionRule.PERCENTILE
    assert resolved.per_worker_gb > 1.5


def test_unit_seconds_are_the_median_of_the_window() -> None:
    old = [seen(1.0, "r0", unit_seconds=(100.0,) * 5)]
    recent = [seen(1.0, f"r{i}", unit_seconds=(1.0, 2.0, float(i))) for i in range(1, 21)]
    assert resolve(old + recent, HINT).unit_seconds == 2.0


@pytest.mark.parametrize(
    ("units", "pods", "processes", "rounds"), [(100, 2, 8, 7), (16, 2, 8, 1), (17, 2, 8, 2), (0, 1, 1, 0)]
)
def test_estimate_is_the_median_unit_seconds_times_the_rounds(
    units: int, pods: int, processes: int, rounds: int
) -> None:
    observations = [seen(1.0, "r1", unit_seconds=(2.0, 3.0, 10.0))]
    result = estimate(observations, units, pods, processes)
    assert (result.unit_seconds, result.rounds, result.seconds) == (3.0, rounds, 3.0 * rounds)


def test_estimate_without_unit_seconds_is_a_failed_precondition() -> None:
    with pytest.raises(FailedPrecondition):
        estimate([seen(1.0, "r1")], 10, 1, 1)
    with pytest.raises(InvalidArgument):
        estimate([seen(1.0, "r1", unit_seconds=(1.0,))], 10, 0, 1)


@pytest.mark.parametrize(
    "observation",
    [
        Observation(ObservationKey("", "m"), 1.0),
        Observation(ObservationKey("t", ""), 1.0),
        Observation(KEY, -1.0),
        Observation(KEY, 1.0, oom_killed=True),
        Observation(KEY, 1.0, unit_seconds=(-1.0,)),
    ],
)
def test_bad_observations_are_refused(observation: Observation) -> None:
    with pytest.raises(InvalidArgument):
        observation.check()


@given(st.lists(st.floats(0, 1e6, allow_nan=False), min_size=1, max_size=40), st.floats(0, 100))
def test_percentile_is_numpys_linear_default(values: list[float], q: float) -> None:
    assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)), rel=1e-9, abs=1e-9)


@given(
    st.lists(
        st.tuples(st.floats(0.01, 64), st.booleans(), st.booleans(), st.sampled_from(["a", "b", "c", "d"])),
        min_size=1,
        max_size=30,
    )
)
def test_the_request_covers_the_percentile_and_every_standing_kill(
    rows: list[tuple[float, bool, bool, str]],
) -> None:
    observations = [
        Observation(KEY, gb, oom_killed=kill, oom_per_worker_gb=gb if kill else None, succeeded=ok, run_id=run)
        for gb, kill, ok, run in rows
    ]
    resolved = resolve(observations, HINT)
    window = [gb for gb, *_ in rows[-20:]]
    assert resolved.per_worker_gb >= p95_times_margin(window) - 1e-9
    assert resolved.per_worker_gb <= max(max(window) * 1.1, max(gb for gb, *_ in rows) * 1.5) + 1 / 1024
    for i, (gb, kill, _, run) in enumerate(rows):
        lifted = any(ok and later_run != run for _, _, ok, later_run in rows[i + 1 :])
        if kill and not lifted:
            assert resolved.per_worker_gb >= 1.5 * gb - 1e-9


def floor_by_definition(observations: list[Observation]) -> tuple[float, Observation] | None:
    """The floor as the rule says it: every kill with no later success of another run (or of an unknown run),
    the largest first and of equal ones the oldest; quadratic, the oracle of the one-pass rule."""
    floor = None
    for i, kill in enumerate(observations):
        if not kill.oom_killed or kill.oom_per_worker_gb is None:
            continue
        lifted = any(o.succeeded and (o.run_id != kill.run_id or not kill.run_id) for o in observations[i + 1 :])
        value = math.ceil(1.5 * kill.oom_per_worker_gb * 1024 - 1e-6) / 1024
        if not lifted and (floor is None or value > floor[0]):
            floor = (value, kill)
    return floor


histories = st.lists(
    st.tuples(
        st.sampled_from([0.5, 1.0, 2.0]),
        st.booleans(),
        st.booleans(),
        st.sampled_from(["", "r1", "r2", "r3"]),
    ),
    max_size=40,
)


@given(histories)
def test_the_floor_in_one_pass_is_the_floor_by_definition(rows: list[tuple[float, bool, bool, str]]) -> None:
    observations = [
        Observation(KEY, gb, oom_killed=kill, oom_per_worker_gb=gb if kill else None, succeeded=ok, run_id=run)
        for gb, kill, ok, run in rows
    ]
    found, expected = oom_floor(observations), floor_by_definition(observations)
    assert found == expected
    if found is not None and expected is not None:
        assert found[1] is expected[1]  # the same kill decides, not only the same value
