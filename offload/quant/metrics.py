"""The one ROC AUC of offload: the quantization budget, the examples and the demo all use it.

Example::

    from offload.quant.metrics import auc
    auc(labels, scores)          # sklearn's roc_auc_score order: truth first
"""

from __future__ import annotations

from typing import Any

import numpy as np

from offload.sim.errors import InputError

__all__ = ["auc", "output_error", "OUTPUT_METRICS"]


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
