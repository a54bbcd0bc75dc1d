"""Embedding kernels from torch tables: the one constructor the ``offload.nn`` embedding modules
(``EmbeddingBag``, ``TableBatchedEmbeddingBags``, the FBGEMM and TorchRec converters) share.

:mod:`offload.kernels.embedding` refuses with plain ``ValueError`` a type it cannot parse or hold
(format, accumulator or product too wide: the one conversion-time error for a ``max_bag_size`` the
accumulator cannot cover); here they become the hierarchy's refusals, which the partitioner turns
into "kept on host".

Example::

    w = float_table("user", bag.weight)
    k = embedding_kernel("emb", [table_spec("user", w, "ap_fixed<16,6>")], [w], mode="sum")
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import torch

from offload.kernels import Kernel
from offload.kernels.embedding import (
    DEFAULT_MAX_BAG_SIZE,
    DEFAULT_WEIGHT_TYPE,
    OVERFLOW_POLICIES,
    ROWWISE,
    EmbeddingSpec,
    TableSpec,
    default_acc_type,
    make_kernel,
    make_spec,
    rowwise_param_type,
)
from offload.sim.errors import FormatError, InputError, OffloadError
from offload.sim.fixed import FixedType

__all__ = ["float_table", "table_spec", "embedding_spec", "embedding_kernel"]


def float_table(name: str, weight: torch.Tensor) -> np.ndarray:
    """The table as float64 (exact for every torch float dtype); non-finite tables are refused."""
    w = weight.detach().cpu().to(torch.float64).numpy()
    bad = ~np.isfinite(w)
    if bad.any():
        r, c = np.argwhere(bad)[0]
        raise InputError(f"{name}: {int(bad.sum())} non-finite table values (first weight[{int(r)}, {int(c)}] = {float(w[r, c])}); "
                         "a fixed-point table cannot hold them")
    return w


def table_spec(name: str, w: np.ndarray, fmt: str, padding_idx: Optional[int] = None, bundle: Optional[str] = None) -> TableSpec:
    """The spec of float table ``w`` stored in ``fmt`` (``int8_rowwise``: its scale/bias type from ``w``)."""
    rows, dim = w.shape
    if fmt == ROWWISE:
        return TableSpec(name, rows, dim, ROWWISE, rowwise_param_type(w), padding_idx, bundle)
    return TableSpec(name, rows, dim, fmt, None, padding_idx, bundle)


def embedding_spec(tables: Sequence[TableSpec], *, mode: str = "sum", max_bag_size: Optional[int] = None,
                   acc_type: Optional[str] = None, out_type: Optional[str] = None, weight_type: FixedType | str = DEFAULT_WEIGHT_TYPE,
                   feature_table_map: Optional[Sequence[int]] = None, weighted_mean: bool = False) -> EmbeddingSpec:
    """:func:`~offload.kernels.embedding.make_spec` with typed refusals. ``max_bag_size`` defaults to
    :data:`~offload.kernels.embedding.DEFAULT_MAX_BAG_SIZE`; ``weighted_mean``: a mean of weighted
    entries (FBGEMM, TorchRec), whose default accumulator is the sum's (room for the weights' integer bits)."""
    if max_bag_size is None:
        max_bag_size = DEFAULT_MAX_BAG_SIZE
    try:
        if weighted_mean and mode == "mean" and acc_type is None:
            acc_type = default_acc_type(tables, "sum", max_bag_size, weight_type)
        return make_spec(tables, mode=mode, max_bag_size=max_bag_size, acc_type=acc_type, out_type=out_type,
                         weight_type=weight_type, feature_table_map=feature_table_map)
    except OffloadError:
        raise
    except ValueError as e:
        raise FormatError(str(e)) from e


def embedding_kernel(name: str, tables: Sequence[TableSpec], weights: Sequence[np.ndarray], *, on_overflow: str = "warn",
                     **spec: object) -> Kernel:
    """The kernel of float ``weights`` quantized per ``tables`` (``spec``: :func:`embedding_spec`'s
    keywords); ``on_overflow`` as in ``offload.nn.EmbeddingBag.from_float``."""
    if on_overflow not in OVERFLOW_POLICIES:
        raise InputError(f"on_overflow: must be one of {OVERFLOW_POLICIES}, got {on_overflow!r}")
    kspec = embedding_spec(tables, **spec)  # type: ignore[arg-type]
    try:
        return make_kernel(name, kspec, list(weights), on_overflow=on_overflow)
    except OffloadError:
        raise
    except ValueError as e:
        raise InputError(str(e)) from e
