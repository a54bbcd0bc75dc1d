"""The one ROC AUC of offload: the quantization budget, the examples and the demo all use it.

Example::

    from offload.quant.metrics import auc
    auc(labels, scores)          # sklearn's roc_auc_score order: truth first
"""

from __future__ import annotations

from typing import Any

import numpy as np

from offload.sim.errors import InputError

__all__ = ["auc", "auc_drop_stderr", "output_error", "OUTPUT_METRICS"]


def auc(labels: Any, scores: Any) -> float:
    """ROC AUC of ``scores`` against 0/1 ``labels`` (labels > 0.5 are positives): the Mann-Whitney
    rank-sum statistic with average ranks for ties, which quantized scores produce often."""
    y = np.asarray(labels).ravel() > 0.5
    s = np.asarray(scores, dtype=np.float64).ravel()
    if y.shape != s.shape:
        raise InputError(f"auc: labels has {y.size} values, scores has {s.size}")
    npos, nneg = int(y.sum()), int((~y).sum())
    if npos == 0 or nneg == 0:
        raise InputError("auc: labels need both positives and negatives")
    order = np.argsort(s, kind="mergesort")
    _, first, counts = np.unique(s[order], return_index=True, return_counts=True)
    ranks = np.empty(len(s), dtype=np.float64)
    ranks[order] = np.repeat(first + (counts + 1) / 2.0, counts)  # 1-based average rank of each tie group
    return float((ranks[y].sum() - npos * (npos + 1) / 2.0) / (npos * nneg))


# The end-to-end metrics a model-level budget (``offload.offload(..., budget=...)``) may bound.
OUTPUT_METRICS = ("auc_drop", "max_abs_err")


def output_error(metric: str, y_float: Any, y_fixed: Any, labels: Any = None) -> float:
    """What quantization cost a model's output: ``"auc_drop"`` (float AUC minus quantized AUC on
    ``labels``; negative when quantization helped) or ``"max_abs_err"`` (largest absolute score
    difference).

    Example::

        output_error("auc_drop", p_float, p_offloaded, labels)
    """
    a = np.asarray(y_float, dtype=np.float64).ravel()
    b = np.asarray(y_fixed, dtype=np.float64).ravel()
    if a.shape != b.shape:
        raise InputError(f"output_error: float output has {a.size} values, quantized {b.size}")
    if metric == "auc_drop":
        if labels is None:
            raise InputError("output_error: metric 'auc_drop' needs labels")
        return auc(labels, a) - auc(labels, b)
    if metric == "max_abs_err":
        return float(np.max(np.abs(a - b))) if a.size else 0.0
    raise InputError(f"output_error: metric must be one of {list(OUTPUT_METRICS)}, got {metric!r}")


def _midranks(x: np.ndarray) -> np.ndarray:
    """1-based ranks of ``x`` with ties at their average rank."""
    order = np.argsort(x, kind="mergesort")
    _, first, counts = np.unique(x[order], return_index=True, return_counts=True)
    r = np.empty(len(x), dtype=np.float64)
    r[order] = np.repeat(first + (counts + 1) / 2.0, counts)
    return r


def auc_drop_stderr(labels: Any, y_float: Any, y_fixed: Any) -> float:
    """Standard error of ``auc(labels, y_float) - auc(labels, y_fixed)`` on these rows: DeLong's
    variance of the difference of two correlated AUCs (DeLong, DeLong and Clarke-Pearson,
    Biometrics 1988), computed with midranks as in Sun and Xu (IEEE SPL 2014).

    Example::

        drop = auc(y, p) - auc(y, q); upper = drop + 1.645 * auc_drop_stderr(y, p, q)
    """
    y = np.asarray(labels).ravel() > 0.5
    scores = [np.asarray(s, dtype=np.float64).ravel() for s in (y_float, y_fixed)]
    m, n = int(y.sum()), int((~y).sum())
    if m < 2 or n < 2:
        raise InputError("auc_drop_stderr: labels need at least two positives and two negatives")
    v01, v10 = [], []
    for s in scores:
        pos, neg = s[y], s[~y]
        tz = _midranks(np.concatenate([pos, neg]))
        v01.append((tz[:m] - _midranks(pos)) / n)  # each positive's share of negatives ranked below it
        v10.append(1.0 - (tz[m:] - _midranks(neg)) / m)  # each negative's share of positives ranked above it
    sx, sy = np.cov(np.stack(v01)), np.cov(np.stack(v10))
    s = sx / m + sy / n
    return float(np.sqrt(max(0.0, s[0, 0] + s[1, 1] - 2.0 * s[0, 1])))
