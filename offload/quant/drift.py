"""Calibration-set drift check: per-feature two-sample Kolmogorov-Smirnov statistic.

A calibration set that does not look like the traffic the model will score picks integer bits
from the wrong ranges. ``check_drift`` compares it, feature by feature, with a reference sample
(e.g. recent production rows) and warns with :class:`CalibrationDriftWarning`, naming the
features whose KS statistic exceeds the threshold.

Example::

    stats = check_drift(X_calib, X_recent, threshold=0.2, names=feature_names)
"""

from __future__ import annotations

import warnings
from typing import Sequence

import numpy as np

__all__ = ["CalibrationDriftWarning", "ks_statistic", "check_drift"]


class CalibrationDriftWarning(UserWarning):
    """The calibration set's feature distribution differs markedly from the reference sample."""


def ks_statistic(a: np.ndarray, b: np.ndarray) -> float:
    """Two-sample KS statistic: the largest gap between the two empirical CDFs."""
    a = np.sort(np.asarray(a, dtype=np.float64).ravel())
    b = np.sort(np.asarray(b, dtype=np.float64).ravel())
    if a.size == 0 or b.size == 0:
        raise ValueError("KS statistic needs two non-empty samples")
    grid = np.concatenate([a, b])
    cdf_a = np.searchsorted(a, grid, side="right") / a.size
    cdf_b = np.searchsorted(b, grid, side="right") / b.size
    return float(np.max(np.abs(cdf_a - cdf_b)))


def check_drift(calib: np.ndarray, reference: np.ndarray, *, threshold: float = 0.2, names: Sequence[str] | None = None) -> dict[str, float]:
    """Per-feature KS statistics of ``calib`` vs ``reference``; warns when any exceeds ``threshold``."""
    calib = np.asarray(calib, dtype=np.float64)
    reference = np.asarray(reference, dtype=np.float64)
    if calib.ndim != 2 or reference.ndim != 2 or calib.shape[1] != reference.shape[1]:
        raise ValueError(f"calib {list(calib.shape)} and reference {list(reference.shape)} must be [rows, same features]")
    names = list(names) if names is not None else [f"feature {j}" for j in range(calib.shape[1])]
    stats = {names[j]: ks_statistic(calib[:, j], reference[:, j]) for j in range(calib.shape[1])}
    drifted = {k: v for k, v in stats.items() if v > threshold}
    if drifted:
        listed = ", ".join(f"{k} (KS={v:.2f})" for k, v in sorted(drifted.items(), key=lambda kv: -kv[1]))
        warnings.warn(
            f"calibration set differs from the reference sample (KS > {threshold}): {listed}",
            CalibrationDriftWarning,
            stacklevel=3,
        )
    return stats
