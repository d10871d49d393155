"""Shared by the benchmarks in this folder (imported as a sibling: `python bench/X.py`)."""

import statistics
import time


def median_time(fn, warmup: int, repeat: int, clock=time.perf_counter) -> float:
    """Seconds: median of ``repeat`` timed calls of ``fn`` after ``warmup`` untimed ones."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        t0 = clock()
        fn()
        times.append(clock() - t0)
    return statistics.median(times)
