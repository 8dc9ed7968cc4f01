"""The Lotka-Volterra scan: one parameter point solved, and its period near the linearized system's."""

from __future__ import annotations

import math

from odescan.tasks import simulate


def test_a_point_oscillates_with_about_the_linear_period() -> None:
    alpha, gamma = 1.0, 1.5
    result = simulate(alpha, 0.1, 0.075, gamma, t_end=60.0, points=6000)
    # Small oscillations around the fixed point have the period 2 pi / sqrt(alpha gamma); larger ones are slower.
    assert (
        2 * math.pi / math.sqrt(alpha * gamma) * 0.9 < result["period"] < 2 * math.pi / math.sqrt(alpha * gamma) * 1.6
    )
    assert result["prey_max"] > result["prey_min"] > 0
