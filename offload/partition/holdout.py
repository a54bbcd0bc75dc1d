"""The data a model-level budget is measured on: the holdout, its labels, the budget itself.

``offload.offload(..., holdout=(batches, labels), budget={"auc_drop": 0.001})`` bounds what the
whole offloaded model loses on data the calibration never saw. This module checks those arguments
(the holdout must not repeat a calibration batch: a budget met on the data the types were fitted
to proves nothing), runs a model over the holdout, and scores its output against the float model.

Example::

    ho = check(holdout=(batches, labels), budget={"auc_drop": 0.001}, calib=calib_batches)
    ho.error(float_scores, offloaded_scores)
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch
import torch.nn as nn
from torch.utils import _pytree as pytree

from offload.quant.metrics import OUTPUT_METRICS, auc_drop_stderr, output_error
from offload.sim.errors import InputError, InputTypeError

__all__ = ["Holdout", "check", "scores", "Z_ONE_SIDED_95"]

Z_ONE_SIDED_95 = 1.6449  # the normal quantile a one-sided 95 % bound stands on


@dataclass(frozen=True)
class Holdout:
    """The holdout batches, their labels (None for ``max_abs_err``), the metric and its limit."""

    batches: list[tuple]
    labels: np.ndarray | None
    metric: str
    limit: float | None

    def error(self, y_float: np.ndarray, y_fixed: np.ndarray) -> float:
        return output_error(self.metric, y_float, y_fixed, self.labels)

    def upper(self, y_float: np.ndarray, y_fixed: np.ndarray) -> float:
        """A one-sided 95 % upper bound of the metric on data like the holdout: an AUC drop measured
        on a few thousand rows moves by a few 1e-4 with the sample (DeLong's standard error), so a
        choice that fills the budget on the holdout alone would miss it on the next sample about
        half the time. ``max_abs_err`` is the holdout's own maximum (no sampling model)."""
        e = self.error(y_float, y_fixed)
        if self.metric == "auc_drop":
            e += Z_ONE_SIDED_95 * auc_drop_stderr(self.labels, y_float, y_fixed)
        return e


def _as_args(x: Any) -> tuple:
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def _digest(batch: tuple) -> str:
    """A batch's content hash over every tensor it holds (KeyedJaggedTensors included: torchrec
    registers them as pytree nodes), in order, with shapes and dtypes."""
    h = hashlib.sha256()
    for leaf in pytree.tree_leaves(batch):
        if isinstance(leaf, torch.Tensor):
            t = leaf.detach().cpu().contiguous()
            h.update(f"{tuple(t.shape)}{t.dtype}".encode())
            h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
        elif isinstance(leaf, np.ndarray):
            h.update(f"{leaf.shape}{leaf.dtype}".encode())
            h.update(np.ascontiguousarray(leaf).tobytes())
        else:
            h.update(repr(leaf).encode())
    return h.hexdigest()


def _budget(budget: Any) -> tuple[str | None, float | None]:
    if budget is None:
        return None, None
    if not isinstance(budget, dict) or len(budget) != 1:
        raise InputTypeError(f"budget: expected one {{metric: limit}} pair with metric in {list(OUTPUT_METRICS)}, got {budget!r}")
    (metric, limit), = budget.items()
    if metric not in OUTPUT_METRICS:
        raise InputError(f"budget: metric must be one of {list(OUTPUT_METRICS)}, got {metric!r}")
    if isinstance(limit, bool) or not isinstance(limit, (int, float)) or not math.isfinite(limit) or limit < 0:
        raise InputError(f"budget[{metric!r}]: expected a finite number >= 0, got {limit!r}")
    return metric, float(limit)


def _labels(labels: Any, n_batches: int) -> np.ndarray | None:
    if labels is None:
        return None
    if isinstance(labels, (list, tuple)) and len(labels) == n_batches and all(isinstance(v, (torch.Tensor, np.ndarray)) for v in labels):
        labels = [v.detach().cpu().numpy() if isinstance(v, torch.Tensor) else v for v in labels]
        return np.concatenate([np.asarray(v, dtype=np.float64).ravel() for v in labels])
    a = labels.detach().cpu().numpy() if isinstance(labels, torch.Tensor) else labels
    return np.asarray(a, dtype=np.float64).ravel()


def check(holdout: Any, budget: Any, calib: Sequence[tuple]) -> Holdout | None:
    """The checked holdout (None when neither ``holdout`` nor ``budget`` is given).

    ``holdout``: ``(batches, labels)`` with ``batches`` a list of input batches (each the forward's
    positional args, or one tensor) and ``labels`` one 0/1 value a scored row (one array, or one
    a batch); ``labels`` may be None for ``max_abs_err``. Without a budget the report still gives
    the measured figure (``auc_drop`` with labels, else ``max_abs_err``).
    """
    metric, limit = _budget(budget)
    if holdout is None:
        if metric is not None:
            raise InputError(f"budget: {metric} is measured on held-out data; pass holdout=(batches, labels)")
        return None
    if not isinstance(holdout, (tuple, list)) or len(holdout) != 2:
        raise InputTypeError("holdout: expected (batches, labels), labels None for max_abs_err")
    batches, labels = holdout
    if isinstance(batches, torch.Tensor):
        batches = [batches]
    if not isinstance(batches, (list, tuple)) or not batches:
        raise InputTypeError("holdout: batches must be a non-empty list of input batches")
    batches = [_as_args(b) for b in batches]
    lab = _labels(labels, len(batches))
    if metric is None:
        metric = "auc_drop" if lab is not None else "max_abs_err"
    if metric == "auc_drop":
        if lab is None:
            raise InputError("holdout: budget 'auc_drop' needs labels: holdout=(batches, labels)")
        pos = int((lab > 0.5).sum())
        if pos == 0 or pos == lab.size:
            raise InputError(f"holdout: labels need both positives and negatives for auc_drop ({pos} of {lab.size} positive)")
    seen = {_digest(b): i for i, b in enumerate(calib)}
    for j, b in enumerate(batches):
        i = seen.get(_digest(b))
        if i is not None:
            raise InputError(f"holdout: batch {j} is identical to calibration batch {i}; the budget must be measured "
                             "on data the calibration did not see (hold some out)")
    return Holdout(batches, lab, metric, limit)


def scores(model: nn.Module, batches: Sequence[tuple]) -> np.ndarray:
    """The model's first output tensor on every batch, flattened and concatenated (float64)."""
    out = []
    with torch.no_grad():
        for b in batches:
            leaves = [x for x in pytree.tree_leaves(model(*b)) if isinstance(x, torch.Tensor)]
            if not leaves:
                raise InputTypeError("holdout: the model returned no tensor to score")
            out.append(leaves[0].detach().to("cpu", torch.float64).reshape(-1).numpy())
    return np.concatenate(out)
