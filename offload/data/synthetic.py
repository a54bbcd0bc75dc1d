"""Synthetic index streams, the counterpart of the real ones in :mod:`offload.data.movielens`.

Example::

    ids = zipf_ids(np.random.default_rng(0), n_rows=100_000, count=4096, s=1.05)
"""

from __future__ import annotations

import numpy as np

__all__ = ["zipf_ids"]


def zipf_ids(rng: np.random.Generator, n_rows: int, count: int, s: float, perm: np.ndarray | None = None) -> np.ndarray:
    """``count`` row ids with P(rank k) ~ 1/k^s (inverse-CDF sampling); ``perm`` maps ranks to rows
    (production tables do not keep their popular rows first)."""
    cdf = np.cumsum(1.0 / np.arange(1, n_rows + 1, dtype=np.float64) ** s)
    ranks = np.minimum(np.searchsorted(cdf, rng.random(count) * cdf[-1]), n_rows - 1)
    return ranks if perm is None else perm[ranks]
