"""Bit-exact reference model of the embedding lookup kernel (gather + pooled bags), step by step.

Everything here works on raw fixed-point integers (``int64``) and mirrors, operation by operation,
what ``hls/src/offload_embedding.h`` does with ap_fixed types, so the two agree bit for bit:

1. **Element value** ``e``: an ``ap_fixed`` table stores ``e`` directly. An ``int8_rowwise`` table
   stores a ``uint8`` code ``c`` and, per row, a scale ``s`` and bias ``b`` in one ap_fixed
   ``param_type``; ``e = c * s + b`` is computed exactly (type ``ap_fixed<Wp+9, Ip+9>``, see
   :func:`rowwise_value_type`), never rounded.
2. **Term** ``t = acc_t(e)``, or with per-sample weights ``t = acc_t(e * w)`` where ``e * w`` is the
   exact product (ap_fixed multiplication never rounds) and the cast to ``acc_t`` applies the
   accumulator's rounding and overflow modes.
3. **Pooling** over the bag's non-padding entries, in order:
   ``sum``: ``acc = acc_t(acc + t)`` per step (the addition is exact, the assignment applies the
   accumulator's overflow mode at every step, as the pipelined HLS loop does);
   ``mean``: the ``sum`` accumulator, then the raw accumulator ``a`` is divided by the count ``n``
   with round-half-away-from-zero integer division: ``sign(a) * ((2|a| + n) // (2n))`` (stays in
   ``acc_t``, whose width is limited to 62 bits so ``2|a|`` fits int64); ``max``: the largest term.
   A bag with no (non-padding) entries gives 0 in every mode, as torch does.
4. **Output** ``out_t(pooled)``: cast with the output type's rounding and overflow modes.

The code is that list, nothing faster: one vectorised step per bag position (across bags and
columns), each cast through :meth:`FixedType.cast`. The fast path is :mod:`offload.sim.embedding.fused`;
the ``embedding`` kernel kind chooses between the two.

Example::

    from offload.sim.fixed import FixedType
    from offload.sim.embedding import pool_bags
    acc = FixedType.parse("ap_fixed<32,16,AP_RND_CONV,AP_SAT>")
    out = pool_bags(elem_raw, elem_t, offsets, "sum", acc, acc)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from offload.sim.fixed import FixedType, add, add_type, mul, mul_type

__all__ = [
    "MODES",
    "PooledTable",
    "Pooling",
    "rowwise_value_type",
    "product_type",
    "drop_padding",
    "gather_values",
    "pool_bags",
    "round_div",
    "lookup",
]

MODES = ("sum", "mean", "max")
_CODE_T = FixedType.parse("ap_uint<8>")


@dataclass(frozen=True)
class PooledTable:
    """One table as the arithmetic sees it: columns, element type, row-wise or not, padding row."""

    dim: int
    value_type: FixedType
    rowwise: bool = False
    padding_idx: int | None = None


@dataclass(frozen=True)
class Pooling:
    """What one table-batched lookup computes: the tables and the pooling's types.

    ``max_bag_size`` is the declared bag bound the accumulator was sized for; the reference pools
    longer bags with the same per-step arithmetic, the fused path proves its shortcuts from it.
    """

    tables: tuple[PooledTable, ...]
    mode: str
    max_bag_size: int
    acc_type: FixedType
    out_type: FixedType
    weight_type: FixedType
    total_dim: int = field(init=False)  # columns of a call's output
    rowwise: bool = field(init=False)  # some table is int8_rowwise

    def __post_init__(self) -> None:
        # Read on every call: computed once.
        object.__setattr__(self, "total_dim", sum(t.dim for t in self.tables))
        object.__setattr__(self, "rowwise", any(t.rowwise for t in self.tables))


def rowwise_value_type(param_type: FixedType) -> FixedType:
    """Exact type of ``code * scale + bias`` for an ``int8_rowwise`` row.

    ``ap_uint<8> * ap_fixed<Wp,Ip>`` is ``ap_fixed<Wp+8, Ip+8>`` and adding ``ap_fixed<Wp,Ip>``
    gives ``ap_fixed<Wp+9, Ip+9>``: the ap_types result types, so the C++ kernel forms the same
    value without rounding.
    """
    return add_type(mul_type(_CODE_T, param_type), param_type)


def product_type(a: FixedType, b: FixedType) -> FixedType:
    """Exact type of ``a * b`` (ap_types ``RType::mult``)."""
    return mul_type(a, b)


def drop_padding(indices: np.ndarray, offsets: np.ndarray, padding_idx: int | None) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Remove entries equal to ``padding_idx``; return (indices, offsets, kept positions or None).

    Padding entries are skipped by the kernel: they neither add to a bag nor count for ``mean``.
    """
    if padding_idx is None:
        return indices, offsets, None
    pad = indices == padding_idx
    if not pad.any():
        return indices, offsets, None
    keep = np.flatnonzero(~pad)
    kept_before = np.concatenate(([0], np.cumsum(~pad, dtype=np.int64)))
    return indices[keep], kept_before[offsets], keep


def gather_values(table: np.ndarray, indices: np.ndarray, params: np.ndarray | None = None) -> np.ndarray:
    """Raw element values of the looked-up rows, shape ``(len(indices), dim)``.

    ``params`` (``int8_rowwise`` only): raw ``(scale, bias)`` per row in ``param_type``; the
    result is then raw ``code * scale + bias`` in :func:`rowwise_value_type` (same frac bits).
    """
    rows = np.take(table, indices, axis=0)
    if params is None:
        return rows
    sb = np.take(params, indices, axis=0).astype(np.int64, copy=False)
    # |code*scale + bias| < 2^(Wp+8): validated Wp <= 54 keeps this exact in int64.
    return rows.astype(np.int64) * sb[:, 0:1] + sb[:, 1:2]


def round_div(a: np.ndarray, n: np.ndarray) -> np.ndarray:
    """``sign(a) * ((2|a| + n) // (2n))`` (round half away from zero), 0 where ``n == 0``.

    The kernel's ``mean``: an exact integer division of the raw accumulator by the bag count.
    """
    a = np.asarray(a, dtype=np.int64)
    n = np.asarray(n, dtype=np.int64)
    nn = np.maximum(n, 1)
    q = (2 * np.abs(a) + nn) // (2 * nn)
    q = np.where(a < 0, -q, q)
    return np.where(n == 0, 0, q)


def pool_bags(
    values: np.ndarray,
    value_type: FixedType,
    offsets: np.ndarray,
    mode: str,
    acc_type: FixedType,
    out_type: FixedType,
    *,
    weights: np.ndarray | None = None,
    weight_type: FixedType | None = None,
) -> np.ndarray:
    """Pool raw ``values`` (``N x D``, in ``value_type``) over the bags given by ``offsets``.

    ``offsets`` has ``B + 1`` entries, starts at 0, ends at ``N`` and never decreases (validated by
    the caller). ``weights`` (raw, in ``weight_type``) multiplies each row first. Returns raw
    ``out_type`` ``B x D`` (steps 2 to 4 of the module docstring).
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    offsets = np.asarray(offsets, dtype=np.int64)
    nb = offsets.shape[0] - 1
    d = values.shape[1] if values.ndim == 2 else 0
    counts = np.diff(offsets)
    src, src_t = np.asarray(values, dtype=np.int64), value_type
    if weights is not None:
        if weight_type is None:
            raise ValueError("weight_type is needed with weights")
        src, src_t = mul(src, src_t, np.asarray(weights, dtype=np.int64)[:, None], weight_type)  # exact e * w
    terms = acc_type.cast(src, src_t)  # t = acc_t(e) or acc_t(e * w)
    acc = np.zeros((nb, d), dtype=np.int64)
    starts = offsets[:-1]
    for k in range(int(counts.max(initial=0))):  # step k of every bag that has a k-th entry
        live = np.flatnonzero(counts > k)
        t = terms[starts[live] + k]
        if mode == "max":
            acc[live] = t if k == 0 else np.maximum(acc[live], t)
        else:
            s, st = add(acc[live], acc_type, t, acc_type)
            acc[live] = acc_type.cast(s, st)  # acc = acc_t(acc + t)
    if mode == "mean":
        acc = round_div(acc, counts[:, None])
    return out_type.cast(acc, acc_type)


def lookup(
    pooling: Pooling,
    tables: Sequence[np.ndarray],
    params: Sequence[np.ndarray | None],
    indices: np.ndarray,
    offsets: np.ndarray,
    weights: np.ndarray | None = None,
) -> np.ndarray:
    """One table-batched call: raw ``out_type``, int64, ``B x total_dim`` (inputs validated).

    Bag ``b`` of table ``t`` is ``indices[offsets[t*B+b] : offsets[t*B+b+1]]`` (``T*B + 1``
    offsets); table ``t``'s pooled rows fill its ``dim`` columns, tables in order. ``params[t]`` is
    the row-wise table's raw ``(scale, bias)`` per row, None for an ap_fixed table.

    Example::

        out = lookup(pooling, [table0], [None], indices, offsets)
    """
    off = np.asarray(offsets, dtype=np.int64)
    T = len(pooling.tables)
    B = (off.shape[0] - 1) // T
    out = np.empty((B, pooling.total_dim), dtype=np.int64)
    col = 0
    for t, pt in enumerate(pooling.tables):
        o = off[t * B:(t + 1) * B + 1]
        base = int(o[0])
        ti = indices[base:int(o[-1])]
        o = o - base
        tw = None if weights is None else weights[base:base + ti.shape[0]]
        ti, o, keep = drop_padding(ti, o, pt.padding_idx)
        if keep is not None and tw is not None:
            tw = tw[keep]
        vals = gather_values(tables[t], ti, params[t])
        out[:, col:col + pt.dim] = pool_bags(vals, pt.value_type, o, pooling.mode, pooling.acc_type, pooling.out_type,
                                             weights=tw, weight_type=pooling.weight_type)
        col += pt.dim
    return out
