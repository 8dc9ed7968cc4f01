"""The learner as a key's history grows: what one submission's `resolve` costs at 10 / 1,000 / 10,000 observations.

Each figure is the median of several calls, cached (no commit since the last read) and after a commit to the
observations file (another key's observation: the cache is invalid, the store reads again), printed beside the
same call at 10 observations, measured in the same run (the ratio). A third of the observations are kills for
memory, each of its own run, the rest successes: the floor of the rule must look back over them. Goal: flat (a
submission's cost does not grow with the key's history).

    uv run --frozen python benchmarks/learner_scale.py [--calls 15]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from simrun_core.resources import ObservationKey, ResolvedResources
from simrun_learner import Observation, ResourceLearner

KEY = ObservationKey("model.tasks:Fit", "model", "")
OTHER = ObservationKey("model.tasks:Other", "model", "")
HINT = ResolvedResources(base_memory_gb=0.5, per_worker_gb=0.5)
SIZES = (10, 1_000, 10_000)


def history(start: int, end: int) -> list[Observation]:
    """Observations `start`…`end` of the key: every third a kill for memory, each of its own run."""
    return [
        Observation(
            KEY,
            0.3 + (i % 7) / 100,
            oom_killed=i % 3 == 0,
            oom_per_worker_gb=0.25 if i % 3 == 0 else None,
            succeeded=i % 3 != 0,
            unit_seconds=(0.1,),
            run_id=f"run-{i}",
        )
        for i in range(start, end)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=15, help="calls per figure (median)")
    args = parser.parse_args()
    figures: dict[int, tuple[float, float]] = {}
    with tempfile.TemporaryDirectory() as tmp, ResourceLearner(Path(tmp) / "observations.sqlite") as learner:
        recorded = 0
        for size in SIZES:
            learner.record_all(history(recorded, size))
            recorded = size
            cached, fresh = [], []
            for _ in range(args.calls):
                learner.record(Observation(OTHER, 0.1, succeeded=True))
                begun = time.perf_counter()
                learner.resolve(KEY, HINT)
                fresh.append(time.perf_counter() - begun)
                begun = time.perf_counter()
                learner.resolve(KEY, HINT)
                cached.append(time.perf_counter() - begun)
            figures[size] = (statistics.median(cached), statistics.median(fresh))
    base_cached, base_fresh = figures[SIZES[0]]
    print(f"resolve of one key, medians of {args.calls} calls (ratio to {SIZES[0]} observations; goal: about 1):")
    for size, (cached, fresh) in figures.items():
        print(
            f"  {size:6,d} observations: cached {cached * 1e3:7.2f} ms ({cached / base_cached:5.1f}x),"
            f" after a commit {fresh * 1e3:7.2f} ms ({fresh / base_fresh:5.1f}x)"
        )


if __name__ == "__main__":
    main()
