"""Timing helper shared by the bench scripts (run from the repository root: ``python bench/x.py``)."""

from __future__ import annotations

import time
from typing import Callable


def best_seconds(fn: Callable[[], object], min_time: float = 0.2, repeats: int = 5, sizing_calls: int = 1) -> float:
    """Best seconds per call over ``repeats`` runs of enough calls to last ``min_time``.

    The best (not the mean) of several runs: on a shared machine, noise only ever adds time.
    The calls per run are sized from ``sizing_calls`` back-to-back calls (after one warm-up call);
    more than one keeps a single call that waited for a core from shrinking every run to one call.
    """
    fn()
    t0 = time.perf_counter()
    for _ in range(sizing_calls):
        fn()
    one = max((time.perf_counter() - t0) / sizing_calls, 1e-7)
    n = max(1, int(min_time / one))
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - t0) / n)
    return best
