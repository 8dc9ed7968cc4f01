"""The resource learner: observations and resolved requests."""

from simrun_learner.learner import ResourceLearner
from simrun_learner.reports import observations_from_reports
from simrun_learner.rules import (
    MARGIN,
    OOM_FACTOR,
    PERCENTILE,
    WINDOW,
    Estimate,
    Observation,
    ObservationKey,
    estimate,
    oom_floor,
    percentile,
    resolve,
)

__all__ = [
    "MARGIN",
    "OOM_FACTOR",
    "PERCENTILE",
    "WINDOW",
    "Estimate",
    "Observation",
    "ObservationKey",
    "ResourceLearner",
    "estimate",
    "observations_from_reports",
    "oom_floor",
    "percentile",
    "resolve",
]
