"""What the benchmarks time a call with: the median of many, after a few to warm."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def median_seconds(call: Callable[[], object], calls: int, warm: int = 1) -> float:
    """The median seconds of `calls` calls of `call`, after `warm` calls not counted."""
    for _ in range(warm):
        call()
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times)
